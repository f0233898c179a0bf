"""smartnsq.admin against the dev cluster, and against peers that stall or flood."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support import BackgroundCluster, bounded, keeps_deadline, slow_topic_creation

from smartnsq.admin import Admin, AsyncAdmin
from smartnsq.errors import (
    AdminError,
    ConnectionFailed,
    InvalidArgument,
    ProtocolError,
    Timeout,
    TopicNotFound,
)
from smartnsq.protocol.admin import CreationProgress
from smartnsq.protocol.commands import StartPosition

YOUZAN = pytest.mark.nsq_cluster(nodes=3, lookupds=2)


@YOUZAN
async def test_lookupds_nodes_info_and_lookup(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("adm_t", partitions=2, replicas=1, channels=["c"])
    async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
        listing = await admin.listlookup()
        assert listing.leader == cluster.leader_lookupd.http_address
        assert set(listing.nodes) == set(cluster.lookupd_http_addresses)
        assert await admin.leader_lookupd() == listing.leader
        nodes = await admin.nodes()
        assert sorted(n.http_address for n in nodes) == sorted(cluster.nsqd_http_addresses)
        info = await admin.info(nodes[0].http_address)
        assert info.youzan and info.tcp_port == nodes[0].tcp_port
        assert (await admin.info(listing.leader)).youzan
        view = await admin.lookup("adm_t", "w")
        assert sorted(view.partitions) == [0, 1] and view.channels == ("c",)
        with pytest.raises(TopicNotFound):
            await admin.lookup("adm_missing", "r")


@YOUZAN
async def test_create_topic_waits_until_writable(nsq_cluster: Any) -> None:
    seen: list[CreationProgress] = []
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        async with bounded(20):
            state = await admin.create_topic("adm_new", 4, 2, ordered=True, channels=["a", "b"],
                                             timeout=20, progress=seen.append)
        assert state.done and state.leaders == state.writable == frozenset(range(4))
        view = await admin.lookup("adm_new", "w")
        assert view.ordered and sorted(view.partitions) == [0, 1, 2, 3]
        assert set(view.channels) == {"a", "b"}
        assert seen and seen[-1].done
        # a topic that exists is created again as the real lookupd accepts it: a no-op
        again = await admin.create_topic("adm_new", 4, 2, ordered=True, channels=["a"],
                                         timeout=20)
        assert again.done


@YOUZAN
async def test_create_topic_registers_channels_when_auto_create_is_off(nsq_cluster: Any) -> None:
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        state = await admin.create_topic("adm_closed", 2, 1, disable_channel_auto_create=True,
                                         channels=["only"], timeout=20)
        assert state.done
        view = await admin.lookup("adm_closed", "w")
        assert view.meta is not None and view.meta.disable_channel_auto_create
        assert view.channels == ("only",) and sorted(view.partitions) == [0, 1]
        # the leader lookupd allows the channel: a second registration is refused as such
        with pytest.raises(AdminError, match="already registered"):
            await admin._write(nsq_cluster.leader_lookupd.http_address, "/channel/create",
                               {"topic": "adm_closed", "channel": "only"}, what="register")


@pytest.fixture
def slow_creation(nsq_cluster: Any) -> Callable[[int], list[str]]:
    """``arm(n)``: the dev cluster's lookupd gives leaders only with the n-th create."""
    return lambda sends_needed: slow_topic_creation(nsq_cluster, sends_needed)


@YOUZAN
async def test_create_topic_resends_until_every_partition_has_a_leader(
        nsq_cluster: Any, slow_creation: Callable[[int], list[str]]) -> None:
    sends = slow_creation(3)
    seen: list[CreationProgress] = []
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin, bounded(20):
        state = await admin.create_topic("adm_slow", 2, 1, channels=["c"], timeout=20,
                                         resend_interval=0.2, poll_interval=0.05,
                                         progress=seen.append)
    assert state.done
    assert len(sends) >= 3
    assert any(s.missing_leaders == (0, 1) for s in seen)


@YOUZAN
async def test_create_topic_without_resending_times_out_saying_how_far_it_got(
        nsq_cluster: Any, slow_creation: Callable[[int], list[str]]) -> None:
    sends = slow_creation(2)
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin, bounded(1.5):
        with pytest.raises(Timeout, match="0/2 partitions have a leader"):
            await admin.create_topic("adm_stuck", 2, 1, channels=["c"], timeout=1.5,
                                     resend_interval=60, poll_interval=0.05)
    assert sends == ["adm_stuck"]


@YOUZAN
async def test_create_topic_refusals_name_the_cause(nsq_cluster: Any) -> None:
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        with pytest.raises(AdminError, match="No node is available"):
            await admin.create_topic("adm_big", 2, 3, multipart=False, timeout=5)
        with pytest.raises(InvalidArgument) as info:
            await admin.create_topic("adm_x", 0, 1)
        assert info.value.field == "partition_num"
        follower = next(a for a in nsq_cluster.lookupd_http_addresses
                        if a != nsq_cluster.leader_lookupd.http_address)
        with pytest.raises(AdminError) as refused:
            await admin._write(follower, "/topic/create", {"topic": "adm_y",
                                                           "partition_num": "1",
                                                           "replicator": "1"},
                               what="nsqlookupd /topic/create")
        assert refused.value.not_leader


@YOUZAN
async def test_channels_offsets_stats_and_delete(nsq_cluster: Any) -> None:
    from smartnsq import Producer

    cluster = nsq_cluster
    lookupd = cluster.lookupd_http_addresses
    async with AsyncAdmin(lookupd) as admin:
        await admin.create_topic("adm_ops", 2, 1, channels=["keep"], timeout=20)
        async with Producer(lookupd=lookupd) as producer:
            for i in range(6):
                await producer.publish("adm_ops", b"m%d" % i, partition=i % 2)
        await admin.create_channel("adm_ops", "late")
        await admin.set_offset("adm_ops", "late", StartPosition.end())
        stats = await admin.cluster_stats("adm_ops")
        leaders = [t for s in stats.values() if not isinstance(s, Exception)
                   for t in s.partitions("adm_ops", leader=True)]
        assert sorted(t.partition for t in leaders) == [0, 1]
        keep = {t.partition: t.channel("keep") for t in leaders}
        late = {t.partition: t.channel("late") for t in leaders}
        assert all(c is not None and c.depth == 3 for c in keep.values())
        assert all(c is not None and c.depth == 0 for c in late.values())
        await admin.delete_channel("adm_ops", "late")
        view = await admin.lookup("adm_ops")
        node = view.leader(0)
        assert node is not None
        one = await admin.stats(node.http_address, "adm_ops", partition=0)
        entry = one.topic("adm_ops", 0)
        assert entry is not None and entry.channel("late") is None
        await admin.delete_topic("adm_ops")
        with pytest.raises(TopicNotFound):
            await admin.lookup("adm_ops", "w")


@pytest.mark.nsq_cluster(nodes=0, classic_nodes=2, lookupds=1, mode="classic")
async def test_classic_cluster(nsq_cluster: Any) -> None:
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        assert (await admin.listlookup()).classic
        assert await admin.leader_lookupd() is None
        state = await admin.create_topic("adm_classic", channels=["c"], timeout=10)
        assert state.done
        stats = await admin.cluster_stats("adm_classic")
        assert len(stats) == 2
        for s in stats.values():
            assert not isinstance(s, Exception)
            topic = s.topic("adm_classic")
            assert topic is not None and topic.partition is None and topic.channel("c")


# -- peers that misbehave ----------------------------------------------------------------------

@contextlib.asynccontextmanager
async def http_peer(answer: Callable[[asyncio.StreamWriter], Any]) -> AsyncIterator[str]:
    """A loopback server that reads a request, then lets ``answer`` (a coroutine function
    given the writer) misbehave."""
    tasks: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(Exception):
                await reader.readuntil(b"\r\n\r\n")
                await answer(writer)
        finally:  # cancelled at the end too: a writer left open is a ResourceWarning
            writer.close()

    def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(serve(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _silent(writer: asyncio.StreamWriter) -> None:
    await asyncio.Event().wait()


async def _trickle(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    while True:
        writer.write(b" ")
        await writer.drain()
        await asyncio.sleep(0.05)  # the peer's pace, not the test waiting


async def _flood(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    for _ in range(64):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
    writer.write(b"0\r\n\r\n")


@pytest.mark.parametrize("behaviour", [_silent, _trickle])
async def test_a_stalling_peer_costs_one_deadline(behaviour: Any) -> None:
    async with http_peer(behaviour) as address, AsyncAdmin([address], timeout=0.5) as admin:
        async with bounded(0.5):
            with pytest.raises(Timeout, match=f"{address} did not answer within 0.5s"):
                await admin.info(address)
        async with bounded(0.5):
            with pytest.raises(Timeout):
                await admin.lookup("t")


async def test_a_flooding_peer_is_cut_at_the_answer_limit() -> None:
    async with http_peer(_flood) as address, \
            AsyncAdmin(timeout=5, max_answer_bytes=1 << 20) as admin:
        with pytest.raises(ProtocolError, match="more than 1048576 bytes"):
            await admin.stats(address)


async def test_an_unreachable_node_says_so_with_the_cause() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with AsyncAdmin(timeout=2) as admin:
        with pytest.raises(ConnectionFailed, match=f"cannot reach 127.0.0.1:{port}") as info:
            await admin.info(f"127.0.0.1:{port}")
    assert info.value.__cause__ is not None


def test_bad_addresses_and_options_are_refused_at_construction() -> None:
    with pytest.raises(InvalidArgument) as info:
        AsyncAdmin(["127.0.0.1"])
    assert info.value.field == "lookupd"
    with pytest.raises(InvalidArgument) as info:
        AsyncAdmin(timeout=float("inf"))
    assert info.value.field == "timeout"


# -- the blocking client -------------------------------------------------------------------------

def test_blocking_admin() -> None:
    cluster = BackgroundCluster(nodes=2, topics={"adm_sync": 2})
    try:
        with Admin(cluster.lookupd, timeout=5) as admin:
            with keeps_deadline(30):
                state = admin.create_topic("adm_sync2", 2, 1, channels=["c"], timeout=30)
            assert state.done
            assert sorted(admin.lookup("adm_sync2", "w").partitions) == [0, 1]
            assert admin.leader_lookupd() == cluster.lookupd[0]
            stats = admin.cluster_stats("adm_sync")
            assert len(stats) == 2
        with pytest.raises(RuntimeError, match="closed"):
            admin.nodes()
    finally:
        cluster.stop()
