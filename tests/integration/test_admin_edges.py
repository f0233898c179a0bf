"""smartnsq.admin off the happy path: cluster-wide calls fall over to the next lookupd and
raise the last error when none answers; answers the admin cannot read, and calls with no
time or no lookupd left, fail with errors that say what was asked and where; topic creation
keeps asking while the leader lookupd cannot be reached or says it does not lead, and says
so when it gives up; a channel's backlog names, per partition, the node that failed or lacks
the topic or the channel; every blocking ``Admin`` call reaches the cluster; and on classic
clusters channels and topics are created and deleted on every node."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from support import BackgroundCluster, bounded

from smartnsq import Producer, sync
from smartnsq.admin import Admin, AsyncAdmin
from smartnsq.errors import (
    AdminError,
    ConnectionFailed,
    InvalidArgument,
    ProtocolError,
    Timeout,
    TopicNotFound,
)
from smartnsq.protocol.commands import StartPosition
from smartnsq.transport.http import HttpClient

Answer = tuple[int, Any]  # HTTP status and a JSON body (bytes: sent as they are)


@contextlib.asynccontextmanager
async def peer(routes: dict[str, Answer | Callable[[], Answer]],
               asked: list[str] | None = None) -> AsyncIterator[str]:
    """A loopback HTTP server answering each path (query left out) from ``routes``; 404 for
    others. Appends the paths asked to ``asked``."""
    asked = [] if asked is None else asked

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode().split("?", 1)[0]
            asked.append(path)
            route = routes.get(path, (404, {"message": "NOT_FOUND"}))
            status, body = route() if callable(route) else route
            if isinstance(body, bytes):
                writer.write(body)
            else:
                data = json.dumps(body).encode()
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (status, len(data), data))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield address
    finally:
        server.close()
        await server.wait_closed()


async def dead_address() -> str:
    """A loopback port nothing listens on."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return f"127.0.0.1:{port}"


def listing(leader: str, *nodes: str) -> Answer:
    def node(address: str) -> dict[str, Any]:
        host, port = address.rsplit(":", 1)
        return {"NodeIP": host, "HttpPort": port}

    return 200, {"lookupdleader": node(leader),
                 "lookupdnodes": [node(a) for a in (leader, *nodes)]}


# -- lookupds that fail --------------------------------------------------------------------------

async def test_cluster_calls_fall_over_to_the_next_lookupd_or_raise_the_last_error() -> None:
    dead = await dead_address()
    async with peer({}) as lookupd, peer({"/listlookup": listing(lookupd)}) as answering:
        async with AsyncAdmin([dead, answering], timeout=2) as admin:
            assert (await admin.listlookup()).leader == lookupd
            assert await admin.leader_lookupd() == lookupd
        async with AsyncAdmin([dead, lookupd], timeout=2) as admin:
            # the last one asked (404: a classic lookupd) answered
            assert (await admin.listlookup()).classic
            # one lookupd asked by name, whatever the list says
            assert (await admin.listlookup(answering)).leader == lookupd
    async with AsyncAdmin([await dead_address(), dead], timeout=2) as admin:
        with pytest.raises(ConnectionFailed, match=f"cannot reach {dead}"):
            await admin.nodes()


async def test_a_lookupd_that_refuses_listlookup_says_where_and_why() -> None:
    async with peer({"/listlookup": (500, {"message": "cluster check failed"})}) as lookupd, \
            AsyncAdmin([lookupd], timeout=2) as admin:
        with pytest.raises(AdminError, match="cluster check failed") as info:
            await admin.listlookup()
    assert info.value.status == 500
    assert lookupd in str(info.value) and "/listlookup" in str(info.value)


async def test_answers_the_admin_cannot_read_are_protocol_errors() -> None:
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n{"
    garbage = b"SMTP ready\r\n\r\n"
    async with peer({"/info": (200, huge), "/stats": (200, garbage)}) as address, \
            AsyncAdmin(timeout=2, max_answer_bytes=4096) as admin:
        with pytest.raises(ProtocolError,
                           match=f"/info: {address} announced a 99999999-byte answer "
                                 r"\(limit 4096\)"):
            await admin.info(address)
        with pytest.raises(ProtocolError, match=f"nsqd /stats: {address}: "):
            await admin.stats(address)


async def test_calls_without_time_or_lookupds_left_are_refused() -> None:
    asked: list[str] = []
    async with peer({}, asked) as lookupd, \
            AsyncAdmin(f"{lookupd}, {lookupd},", timeout=2) as admin:
        assert admin.lookupd == (lookupd,)  # a comma-separated string, once each
        with pytest.raises(Timeout, match=f"lookup of t: no time left to ask {lookupd}"):
            await admin.lookup("t", timeout=0)
        with pytest.raises(InvalidArgument) as bad_access:
            await admin.lookup("t", "rw")
        assert bad_access.value.field == "access"
    assert asked == []  # refused before anything was sent
    async with AsyncAdmin() as admin:
        for call in (admin.nodes, admin.listlookup, lambda: admin.lookup("t"),
                     lambda: admin.channel_lag("t", "c")):
            with pytest.raises(InvalidArgument, match="needs the cluster's lookupd") as info:
                await call()
            assert info.value.field == "lookupd"


async def test_a_lent_http_client_is_not_closed_with_the_admin() -> None:
    async with HttpClient() as client, \
            peer({"/listlookup": (404, {"message": "NOT_FOUND"})}) as lookupd:
        async with AsyncAdmin([lookupd], client=client) as admin:
            assert (await admin.listlookup()).classic
        assert not client.closed
        async with AsyncAdmin([lookupd], client=client) as admin:  # still usable
            assert (await admin.listlookup()).classic


# -- topic creation against lookupds that fail ----------------------------------------------------

async def test_creation_stops_at_once_when_the_only_lookupds_leader_cannot_be_reached() -> None:
    dead = await dead_address()
    async with peer({"/listlookup": listing(dead)}) as lookupd, \
            AsyncAdmin([lookupd], timeout=2) as admin, bounded(5):
        with pytest.raises(ConnectionFailed, match=f"cannot reach {dead}"):
            await admin.create_topic("t", 2, 1, timeout=5)


async def test_creation_keeps_asking_while_the_leader_is_unreachable_or_not_leading() -> None:
    dead = await dead_address()
    not_leader = (500, {"message": "E_FAILED_ON_NOT_LEADER"})
    async with peer({"/listlookup": listing(dead)}) as first, \
            peer({"/listlookup": listing(dead)}) as second, \
            AsyncAdmin([first, second], timeout=1) as admin, bounded(1.5):
        with pytest.raises(Timeout, match=r"creating topic 't': not usable within 1s .*"
                                          f"last error: .*cannot reach {dead}"):
            await admin.create_topic("t", 2, 1, timeout=1, resend_interval=0.05,
                                     poll_interval=0.05)
    asked: list[str] = []
    async with peer({"/topic/create": not_leader}, asked) as leader, \
            peer({"/listlookup": listing(leader)}, asked) as lookupd, \
            AsyncAdmin([lookupd], timeout=1) as admin, bounded(1.5):
        with pytest.raises(Timeout, match=r"last error: .*E_FAILED_ON_NOT_LEADER"):
            await admin.create_topic("t", 1, 1, timeout=1, resend_interval=0.05,
                                     poll_interval=0.05)
    # sent again and again, each refusal followed by asking who leads now
    creates = asked.count("/topic/create")
    assert creates >= 2 and asked.count("/listlookup") >= creates
    assert asked[:3] == ["/listlookup", "/topic/create", "/listlookup"]


async def test_creation_without_waiting_returns_after_the_first_send() -> None:
    async with peer({"/topic/create": (200, {})}) as leader, \
            peer({"/listlookup": listing(leader)}) as lookupd, \
            AsyncAdmin([lookupd], timeout=1) as admin:
        seen: list[Any] = []
        state = await admin.create_topic("t", 2, 1, wait=False, progress=seen.append)
        assert not state.done and state.missing_leaders == (0, 1)
        assert seen == [state]
        # waiting: the lookupds never show the topic; the timeout says how far it got
        with pytest.raises(Timeout, match="0/2 partitions have a leader"):
            await admin.create_topic("t", 2, 1, timeout=0.5, poll_interval=0.05)


@pytest.mark.nsq_cluster(nodes=0, classic_nodes=0, lookupds=1, mode="classic")
async def test_a_classic_cluster_without_nodes_cannot_create_a_topic(nsq_cluster: Any) -> None:
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        with pytest.raises(AdminError, match="know no nsqd") as info:
            await admin.create_topic("t")
    assert info.value.status == 503


# -- classic clusters ------------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=0, classic_nodes=2, lookupds=1, mode="classic")
async def test_classic_channels_and_topics_are_managed_on_every_node(nsq_cluster: Any) -> None:
    lookupd = nsq_cluster.lookupd_http_addresses
    async with AsyncAdmin(lookupd) as admin:
        await admin.create_topic("aec", timeout=10)
        await admin.create_channel("aec", "c")
        async with Producer(lookupd=lookupd) as producer, bounded(10):
            for i in range(4):
                await producer.publish("aec", b"%d" % i)
        lag = await admin.channel_lag("aec", "c")
        assert [p.partition for p in lag.partitions] == [None, None]
        assert {p.node for p in lag.partitions} == set(nsq_cluster.nsqd_http_addresses)
        assert lag.depth == 4 and all(p.error is None for p in lag.partitions)
        await admin.delete_channel("aec", "c")
        stats = await admin.cluster_stats("aec")
        for node_stats in stats.values():
            assert not isinstance(node_stats, Exception)
            topic = node_stats.topic("aec")
            assert topic is not None and topic.channel("c") is None
        await admin.delete_topic("aec")
        with pytest.raises(TopicNotFound):
            await admin.lookup("aec")


# -- the blocking client over a youzan cluster ---------------------------------------------

@pytest.fixture(scope="module")
def youzan() -> Iterator[BackgroundCluster]:
    cluster = BackgroundCluster(nodes=2, topics={})
    yield cluster
    cluster.stop()


def test_every_blocking_call_reaches_the_cluster(youzan: BackgroundCluster) -> None:
    lookupd = youzan.lookupd
    with Admin(lookupd, timeout=5) as admin:
        assert repr(admin) == f"<smartnsq.admin.Admin {lookupd[0]} open>"
        assert admin.async_admin.lookupd == tuple(lookupd)
        assert admin.loop_thread.running
        assert admin.create_topic("aey", 2, 1, channels=["c"], timeout=20).done
        assert admin.listlookup().leader == lookupd[0]
        assert admin.listlookup(lookupd[0]).leader == lookupd[0]
        nodes = admin.nodes()
        assert len(nodes) == 2
        assert admin.info(nodes[0].http_address).youzan
        view = admin.lookup("aey", "w")
        leaders = {pid: view.leader(pid) for pid in (0, 1)}
        assert all(node is not None for node in leaders.values())
        with sync.Producer(lookupd) as producer:
            for i in range(4):
                producer.publish("aey", b"%d" % i, partition=i % 2)
        lag = admin.channel_lag("aey", "c")
        assert [(p.partition, p.depth, p.error) for p in lag.partitions] == [
            (0, 2, None), (1, 2, None)]
        leader0 = leaders[0].http_address  # type: ignore[union-attr]
        entry = admin.stats(leader0, "aey", partition=0).topic("aey", 0)
        assert entry is not None and entry.channel("c") is not None
        admin.create_channel("aey", "late", partition=0, address=leader0)
        admin.create_channel("aey", "later")
        admin.set_offset("aey", "later", StartPosition.end())
        lag = admin.channel_lag("aey", "later")
        assert [(p.partition, p.depth) for p in lag.partitions] == [(0, 0), (1, 0)]
        admin.delete_channel("aey", "later")
        admin.delete_channel("aey", "late", partition=0)
        stats = admin.cluster_stats("aey")
        assert sorted(stats) == sorted(n.http_address for n in nodes)
        admin.delete_topic("aey")
        with pytest.raises(TopicNotFound):
            admin.lookup("aey", "w")
    assert repr(admin) == f"<smartnsq.admin.Admin {lookupd[0]} closed>"


async def test_a_backlog_names_what_each_node_lacks(youzan: BackgroundCluster) -> None:
    dead = await dead_address()
    lookupd = youzan.lookupd
    async with AsyncAdmin(lookupd, timeout=2) as admin:
        await admin.create_topic("aeb", 1, 1, channels=["c"], timeout=20)
        view = await admin.lookup("aeb")
        leader = view.leader(0)
        assert leader is not None
        other = next(n.http_address for n in await admin.nodes()
                     if n.http_address != leader.http_address)
        lag = await admin.channel_lag("aeb", "missing",
                                      nodes=[(0, leader.http_address), (0, other),
                                             (1, dead)])
        errors = {(p.partition, p.node): p.error for p in lag.partitions}
        assert errors == {
            (0, leader.http_address): "the node does not have the channel",
            (0, other): "the node does not have the topic",
            (1, dead): errors[(1, dead)]}
        assert f"cannot reach {dead}" in str(errors[(1, dead)])
        await admin.delete_topic("aeb")
