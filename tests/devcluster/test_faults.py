"""The real cluster's failure modes on the fault clock, as a raw-socket / raw-HTTP client sees them.

Every frame a real server was captured sending in the same situation is compared byte for byte
with the capture (``fixtures/youzan/failover_*.txt``, ``http_nsqd_channel_create_on_nonleader``).
The profile below is short and has distinct phases; the tests wait on the state or the clock's
timeline, never on time. The one time comparison (a held PUB is answered no earlier than the end
of its stall) is a lower bound the server guarantees, not a measurement.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from capture import load
from support import wait_until

from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.profile import OFF, REALISTIC, FaultProfile, profile_named
from smartnsq.protocol import commands
from smartnsq.protocol.commands import MAGIC_V2

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
WAIT = 15.0

PROFILE = FaultProfile(
    name="test", leaderless_window=(0.6, 0.6), elect_not_writable=(1.0, 1.0),
    replica_stall=(0.4, 0.4), isr_shrink=(0.8, 0.8), replica_catchup=(1.2, 1.2),
    leave_handoff=(0.05, 0.05), leave_slow_handoff=(0.4, 0.4), leave_stall=(0.4, 0.4),
    slow_creation=True, check_delay=(0.05, 0.05), check_min_spacing=(0.5, 0.5),
    check_interval=(60.0, 60.0), leader_ready_delay=(1.0, 1.0), create_resend=(0.6, 0.6))


def captured(name: str, label: str) -> bytes:
    """The bytes of the first server frame in a capture whose label contains ``label``."""
    for event in load(f"youzan/{name}").recvs():
        if label in event.label:
            return event.data
    raise LookupError(label)


SIGKILL = "failover_sigkill_test_p1r3_leader_p0.txt"
NOT_LEADER = captured(SIGKILL, "E_FAILED_ON_NOT_LEADER")
NOT_WRITABLE = captured(SIGKILL, "E_FAILED_ON_NOT_WRITABLE")
OK = captured(SIGKILL, "b'OK'")
EXITING = captured("failover_sigterm_test_p1r3_leader_p0.txt", "E_PUB_FAILED exiting")


class RawBytes:
    """A raw NSQ connection that returns each server frame as the exact bytes received."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, address: str) -> RawBytes:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        raw = cls(reader, writer)
        writer.write(MAGIC_V2 + commands.identify({"feature_negotiation": True,
                                                   "heartbeat_interval": 30000}))
        await raw.frame()
        return raw

    async def frame(self, timeout: float = WAIT) -> bytes:
        """One whole frame (size prefix included); b"" when the server closed."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(4), timeout)
            return head + await asyncio.wait_for(
                self.reader.readexactly(int.from_bytes(head, "big")), timeout)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return b""

    async def call(self, command: bytes) -> bytes:
        self.writer.write(command)
        return await self.frame()

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2, profile=PROFILE) as c:
        yield c


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=V1, timeout=WAIT) as c:
        yield c


def tcp(cluster: DevCluster, node: Any) -> str:
    return cluster.node_info(node).tcp_address


async def lookup(http: httpx.AsyncClient, cluster: DevCluster, topic: str,
                 access: str) -> dict[str, Any]:
    resp = await http.get(f"http://{cluster.lookupd_http_addresses[0]}/lookup",
                          params={"topic": topic, "access": access})
    return resp.json() if resp.status_code == 200 else {"partitions": {}}


def happened(cluster: DevCluster, what: str, **details: Any) -> bool:
    return any(e.what == what and all(e.details.get(k) == v for k, v in details.items())
               for e in cluster.faults.timeline)


# -- the profile ---------------------------------------------------------------------------------


def test_profiles_are_values_with_a_scale() -> None:
    assert OFF.seconds("leaderless_window") == 0.0 and not OFF.slow_creation
    assert REALISTIC.leaderless_window == (21.0, 49.0)
    assert REALISTIC.replica_stall == (12.0, 12.0)
    fast = profile_named("realistic", scale=0.01)
    assert fast.seconds("replica_stall") == pytest.approx(0.12)
    assert fast.longest("leaderless_window") == pytest.approx(0.49)
    assert fast.nsqd_options() == {"ordered_first_delivery_twice": "random"}
    assert profile_named("off").nsqd_options() == {}
    with pytest.raises(ValueError, match="scale"):
        REALISTIC.scaled(0)
    with pytest.raises(ValueError, match="replica_stall"):
        FaultProfile(replica_stall=(2.0, 1.0))
    with pytest.raises(ValueError, match="profile must be one of"):
        profile_named("nasty")


# -- node loss (SIGKILL) -------------------------------------------------------------------------


async def test_kill_leader_leaderless_window_then_replica_elected(
        cluster: DevCluster, http: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=1, replicas=3, channels=["c"])
    old = cluster.leader_of("t", 0)
    producer = await RawBytes.open(tcp(cluster, old))
    assert await producer.call(commands.pub("t", b"before-kill", 0)) == OK
    replica = next(n for n in cluster.nodes if n is not old)

    await cluster.kill_node(old)
    assert await producer.frame() == b""  # the old connection: EOF, as in the capture
    # leaderless: no lookup lists partition 0, a replica refuses writes
    assert "0" not in (await lookup(http, cluster, "t", "r"))["partitions"]
    assert "0" not in (await lookup(http, cluster, "t", "w"))["partitions"]
    probe = await RawBytes.open(tcp(cluster, replica))
    assert await probe.call(commands.pub("t", b"probe", 0)) == NOT_LEADER

    # elected from the ISR: the new leader answers NOT_WRITABLE at first, then OK
    elected = asyncio.Event()
    cluster.state.listeners.append(lambda event, d: elected.set()
                                   if event == "leader_moved" else None)
    await asyncio.wait_for(elected.wait(), WAIT)
    new = cluster.leader_of("t", 0)
    assert new is not old and cluster.node_info(old).node_id not in \
        cluster.state.partition("t", 0).replicas  # type: ignore[union-attr]
    first = await RawBytes.open(tcp(cluster, new))
    assert await first.call(commands.pub("t", b"too-early", 0)) == NOT_WRITABLE
    await wait_until(lambda: cluster.state.partition("t", 0).writable, WAIT)  # type: ignore[union-attr]
    assert await first.call(commands.pub("t", b"after", 0)) == OK
    assert (await lookup(http, cluster, "t", "w"))["partitions"]["0"]["tcp_port"] == \
        cluster.node_info(new).tcp_port
    # nothing acknowledged was lost
    bodies = [m.body for m in cluster.state.partition("t", 0).log.messages]  # type: ignore[union-attr]
    assert bodies == [b"before-kill", b"after"]
    for conn in (producer, probe, first):  # the killed node's too: its socket is still ours
        conn.close()


async def test_kill_replica_stalls_live_leader_then_not_writable_until_isr_shrinks(
        cluster: DevCluster, http: httpx.AsyncClient) -> None:
    # multipart p2r2 on 3 nodes: p0 on [n0, n1], p1 on [n1, n2]; killing n2 leaves p1's leader up
    await cluster.create_topic("t", partitions=2, replicas=2, channels=["c"])
    p1 = cluster.state.partition("t", 1)
    assert p1 is not None
    leader = cluster.leader_of("t", 1)
    dead = next(r for r in p1.replicas if r != p1.leader)
    producer = await RawBytes.open(tcp(cluster, leader))
    assert await producer.call(commands.pub("t", b"before-kill", 1)) == OK

    await cluster.kill_node(dead)
    stall_end = p1.stalled_until
    assert stall_end > time.monotonic()
    # during the stall lookups still list the partition for writes, and a PUB gets no answer
    assert "1" in (await lookup(http, cluster, "t", "w"))["partitions"]
    answer = await producer.call(commands.pub("t", b"in-stall", 1))
    assert time.monotonic() >= stall_end  # not answered before the stall was over
    assert answer == NOT_WRITABLE
    assert "1" not in (await lookup(http, cluster, "t", "w"))["partitions"]
    assert "1" in (await lookup(http, cluster, "t", "r"))["partitions"]
    # replica 2 with one in-sync replica is below the write quorum: a spare catches up first
    await wait_until(lambda: p1.writable, WAIT)
    assert happened(cluster, "isr_shrunk", topic="t", partition=1)
    assert happened(cluster, "caught_up", topic="t", partition=1)
    assert await producer.call(commands.pub("t", b"after", 1)) == OK
    assert [m.body for m in p1.log.messages] == [b"before-kill", b"after"]
    producer.close()


async def test_kill_replica_stalls_http_pub_too(cluster: DevCluster,
                                              http: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=2, replicas=2, channels=["c"])
    p1 = cluster.state.partition("t", 1)
    assert p1 is not None
    leader = cluster.node_info(p1.leader)
    await cluster.kill_node(next(r for r in p1.replicas if r != p1.leader))
    stall_end = p1.stalled_until
    resp = await http.post(f"http://127.0.0.1:{leader.http_port}/pub",
                           params={"topic": "t", "partition": "1"}, content=b"in-stall")
    assert time.monotonic() >= stall_end
    assert (resp.status_code, resp.text) == (400, '{"message":"E_FAILED_ON_NOT_WRITABLE"}')


async def test_killed_node_back_before_its_session_expires_keeps_leading(
        cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=2, channels=["c"])
    old = cluster.leader_of("t", 0)
    await cluster.kill_node(old)
    await cluster.start_node(old)
    await cluster.faults.settled(WAIT)
    assert cluster.leader_of("t", 0) is old
    producer = await RawBytes.open(tcp(cluster, old))
    assert await producer.call(commands.pub("t", b"x", 0)) == OK
    producer.close()


# -- graceful leave (SIGTERM) --------------------------------------------------------------------


async def test_leave_answers_exiting_then_moves_leadership(
        cluster: DevCluster, http: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=1, replicas=3, channels=["c"])
    old = cluster.leader_of("t", 0)
    consumer = await RawBytes.open(tcp(cluster, old))
    assert await consumer.call(commands.sub("t", "c", 0)) == OK
    producer = await RawBytes.open(tcp(cluster, old))
    assert await producer.call(commands.pub("t", b"before-leave", 0)) == OK

    await cluster.leave_node(old)
    assert await consumer.frame() == b""
    assert await producer.call(commands.pub("t", b"after-leave", 0)) == EXITING
    with pytest.raises(OSError):
        await RawBytes.open(tcp(cluster, old))  # no new connections
    # until the handoff the lookups still name the leaving node
    assert (await lookup(http, cluster, "t", "w"))["partitions"]["0"]["tcp_port"] == \
        cluster.node_info(old).tcp_port
    await cluster.faults.settled(WAIT)
    new = cluster.leader_of("t", 0)
    assert new is not old and not cluster.node_info(old).alive
    first = await RawBytes.open(tcp(cluster, new))
    assert await first.call(commands.pub("t", b"after", 0)) == OK
    assert [m.body for m in cluster.state.partition("t", 0).log.messages] == [  # type: ignore[union-attr]
        b"before-leave", b"after"]
    for conn in (consumer, producer, first):
        conn.close()


async def test_leave_slow_handoff_on_second_partition_and_stall_on_live_leader(
        cluster: DevCluster) -> None:
    # multipart p4r2 on 3 nodes: n0 leads p0 and p3, is p2's replica (p2's leader n2 stays up)
    await cluster.create_topic("t", partitions=4, replicas=2, channels=["c"])
    leaving = cluster.leader_of("t", 0)
    leaving_id = cluster.node_info(leaving).node_id
    led = [p.partition for p in cluster.state.led_by(leaving_id, "t")]
    stalled = next(p for p in cluster.state.topics["t"].partitions
                   if p.leader != leaving_id and leaving_id in p.replicas)
    live = await RawBytes.open(tcp(cluster, cluster.leader_of("t", stalled.partition)))

    await cluster.leave_node(leaving)
    stall_end = stalled.stalled_until
    assert await live.call(commands.pub("t", b"held", stalled.partition)) == OK
    assert time.monotonic() >= stall_end
    await cluster.faults.settled(WAIT)
    order = [e.details["partition"] for e in cluster.faults.timeline if e.what == "handed_off"]
    assert order == led  # the second one was the slow one
    live.close()


# -- slow topic creation -------------------------------------------------------------------------


async def test_slow_creation_needs_a_check_and_a_resent_create(
        cluster: DevCluster, http: httpx.AsyncClient) -> None:
    lookupd = f"http://{cluster.lookupd_http_addresses[0]}"
    params = {"topic": "first", "partition_num": "1", "replicator": "1"}
    assert (await http.post(f"{lookupd}/topic/create", params=params)).status_code == 200
    await wait_until(lambda: happened(cluster, "cluster_check"), WAIT)
    # a second topic right after: its creation check is ignored (too close to the last one)
    named = asyncio.Event()
    cluster.state.listeners.append(
        lambda event, d: named.set() if event == "leader_moved" and d["topic"] == "second"
        else None)
    params2 = {"topic": "second", "partition_num": "1", "replicator": "1"}
    assert (await http.post(f"{lookupd}/topic/create", params=params2)).status_code == 200
    assert happened(cluster, "check_ignored")
    assert cluster.state.partition("second", 0).leader is None  # type: ignore[union-attr]
    assert (await lookup(http, cluster, "second", "r"))["partitions"] == {}
    # re-sending the same create, once the spacing has passed, triggers a check
    await wait_until(lambda: time.monotonic() >= cluster.faults.last_check + 0.5, WAIT)
    assert (await http.post(f"{lookupd}/topic/create", params=params2)).status_code == 200
    await asyncio.wait_for(named.wait(), WAIT)
    # named but not serving: read lookups list the leader, its nsqd refuses /channel/create
    p = cluster.state.partition("second", 0)
    assert p is not None and not p.leader_ready
    listed = (await lookup(http, cluster, "second", "r"))["partitions"]["0"]
    resp = await http.post(f"http://127.0.0.1:{listed['http_port']}/channel/create",
                           params={"topic": "second", "partition": "0", "channel": "c"})
    assert (resp.status_code, resp.text) == (400, '{"message":"E_FAILED_ON_NOT_LEADER"}')
    assert (await lookup(http, cluster, "second", "w"))["partitions"] == {}
    await wait_until(lambda: p.leader_ready, WAIT)
    resp = await http.post(f"http://127.0.0.1:{listed['http_port']}/channel/create",
                           params={"topic": "second", "partition": "0", "channel": "c"})
    assert resp.status_code == 200
    # writable only once every partition has a channel
    assert "0" in (await lookup(http, cluster, "second", "w"))["partitions"]


async def test_create_topic_resends_until_usable(cluster: DevCluster,
                                                 http: httpx.AsyncClient) -> None:
    lookupd = f"http://{cluster.lookupd_http_addresses[0]}"
    params = {"topic": "a", "partition_num": "2", "replicator": "1"}
    assert (await http.post(f"{lookupd}/topic/create", params=params)).status_code == 200
    await wait_until(lambda: happened(cluster, "cluster_check"), WAIT)
    # right after a check: this creation's own check is ignored, only a re-send gets it leaders
    await cluster.create_topic("b", partitions=2, replicas=1, channels=["c"])
    for name in ("a", "b"):
        assert all(p.leader_ready for p in cluster.state.topics[name].partitions)
    assert happened(cluster, "check_ignored")


async def test_off_profile_keeps_todays_behaviour() -> None:
    async with DevCluster(nodes=3, lookupds=1) as cluster:
        await cluster.create_topic("t", partitions=1, replicas=2, channels=["c"])
        assert not cluster.faults.timeline  # created without a cluster check
        old = cluster.leader_of("t", 0)
        await cluster.kill_node(old)
        await cluster.faults.settled(WAIT)  # zero-length windows: elected at once
        assert cluster.leader_of("t", 0) is not old
        producer = await RawBytes.open(tcp(cluster, cluster.leader_of("t", 0)))
        assert await producer.call(commands.pub("t", b"x", 0)) == OK
        producer.close()
