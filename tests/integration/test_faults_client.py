"""The smartnsq client under each of the real cluster's failure modes (the dev cluster's faults).

What a raw client sees is in tests/devcluster/test_faults.py; here the public Producer and
Consumer must survive the same faults: keep their deadlines, hold sharded publishes through a
leaderless window, retry ``E_PUB_FAILED exiting``, lose nothing acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import bounded

from smartnsq import Consumer, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.profile import FaultProfile
from smartnsq.errors import Timeout

FAST_LOOKUP = {"poll_interval": 0.5, "discover_interval": 5.0}

PROFILE = FaultProfile(
    name="client-test", leaderless_window=(1.5, 1.5), elect_not_writable=(0.3, 0.3),
    replica_stall=(4.0, 4.0), isr_shrink=(5.0, 5.0), replica_catchup=(5.5, 5.5),
    leave_handoff=(0.3, 0.3), leave_slow_handoff=(1.0, 1.0), leave_stall=(1.0, 1.0))


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2, profile=PROFILE) as c:
        yield c


async def test_publish_keeps_its_deadline_through_a_replica_stall(cluster: DevCluster) -> None:
    # p2r2 multipart on 3 nodes: killing p1's replica leaves its leader up but stalled
    await cluster.create_topic("t", partitions=2, replicas=2, channels=["c"])
    p1 = cluster.state.partition("t", 1)
    assert p1 is not None
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        lookup_options=FAST_LOOKUP) as producer:
        await producer.publish("t", b"warm-up", partition=1)
        await cluster.kill_node(next(r for r in p1.replicas if r != p1.leader))
        assert p1.stalled()
        with pytest.raises(Timeout):
            async with bounded(1.0):
                await producer.publish("t", b"in-stall", partition=1, timeout=1.0)


async def test_sharded_publish_is_held_through_the_leaderless_window(
        cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=3, channels=["c"])
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        lookup_options=FAST_LOOKUP) as producer:
        await producer.publish("t", b"before", partition=0)
        old = cluster.leader_of("t", 0)
        await cluster.kill_node(old)
        async with bounded(8.0):
            result = await producer.publish("t", b"during", partition=0, timeout=8.0)
        assert result.partition == 0
        assert cluster.leader_of("t", 0) is not old
    bodies = [m.body for m in cluster.state.partition("t", 0).log.messages]  # type: ignore[union-attr]
    assert bodies[0] == b"before" and b"during" in bodies


async def test_publish_retries_pub_failed_exiting_during_a_graceful_leave(
        cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=3, channels=["c"])
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        lookup_options=FAST_LOOKUP) as producer:
        await producer.publish("t", b"before", partition=0)
        old = cluster.leader_of("t", 0)
        await cluster.leave_node(old)
        async with bounded(5.0):
            await producer.publish("t", b"during-leave", partition=0, timeout=5.0)
        await cluster.faults.settled(10)
        assert cluster.leader_of("t", 0) is not old
    bodies = [m.body for m in cluster.state.partition("t", 0).log.messages]  # type: ignore[union-attr]
    assert bodies == [b"before", b"during-leave"]


@pytest.mark.parametrize("fault", ["kill", "leave"])
@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_consumer_gets_every_message_back_after_its_leader_fails(
        cluster: DevCluster, fault: str, ordered: bool) -> None:
    await cluster.create_topic("t", partitions=2, replicas=2, ordered=ordered, channels=["c"])
    bodies = {f"m{i}".encode() for i in range(20)}
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for i, body in enumerate(sorted(bodies)):
            await producer.publish("t", body, partition=i % 2)
    victim = cluster.leader_of("t", 0)
    if fault == "kill":
        await cluster.kill_node(victim)
    else:
        await cluster.leave_node(victim)
    seen: set[bytes] = set()
    done = asyncio.Event()

    def handle(message: Any) -> None:
        seen.add(message.body)
        if seen >= bodies:
            done.set()

    async with Consumer("t", "c", lookupd=cluster.lookupd_http_addresses, handler=handle,
                        reconnect_delay=0.1, reconnect_delay_max=0.5,
                        lookup_options=FAST_LOOKUP):
        await asyncio.wait_for(done.wait(), 20)
    assert seen == bodies
