"""The Consumer over lookupd against a multi-node dev cluster: partitions, ordered
consumption by sharding key, a leader moving mid-stream, nodes restarting, classic clusters.

What was consumed is compared with what the partitions' logs hold (the servers' truth).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from support import WAIT, Watch, watch_channels

from smartnsq import Consumer, Producer
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection

FAST: dict[str, Any] = {"requeue_policy": RequeuePolicy(initial=0.0),
        "backoff_policy": BackoffPolicy(enabled=False), "reconnect_delay": 0.05,
        "reconnect_delay_max": 0.5}


def logged(cluster: Any, topic: str) -> dict[int, list[Any]]:
    info = cluster.state.topics[topic]
    return {p.partition: list(p.log.messages) for p in info.partitions}


async def test_four_partitions_consumed_from_their_leaders(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("spread", partitions=4, replicas=1, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        for i in range(40):
            await producer.publish("spread", b"%d" % i)
    seen: dict[bytes, Message] = {}
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        seen[msg.body] = msg
        if len(seen) == 40:
            done.set()

    async with Consumer("spread", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
        assert consumer.connection_count == 4
    assert {m.partition for m in seen.values()} == {0, 1, 2, 3}
    for msg in seen.values():
        leader = nsq_cluster.node_info(nsq_cluster.leader_of("spread", msg.partition))
        assert msg.node == leader.tcp_address


async def test_ordered_topic_keeps_per_key_order_with_concurrency(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ordered", partitions=4, replicas=1, ordered=True,
                                   channels=["ch"])
    keys = [f"key-{k}" for k in range(8)]
    per_key = 12
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        for i in range(per_key):
            await asyncio.gather(*(producer.publish("ordered", f"{key}:{i}".encode(),
                                                    sharding_key=key) for key in keys))
    got: dict[str, list[int]] = defaultdict(list)
    # recorded as they come and checked below: an assert in a handler only makes it REQ
    offsets: dict[Any, list[Any]] = defaultdict(list)  # None would be a bug
    total = len(keys) * per_key
    done = asyncio.Event()
    count = 0

    async def handler(msg: Message) -> None:
        nonlocal count
        key, _, seq = msg.body.decode().partition(":")
        await asyncio.sleep(0)  # let other partitions' messages interleave
        got[key].append(int(seq))
        offsets[msg.partition].append(msg.queue_offset)
        count += 1
        if count == total:
            done.set()

    async with Consumer("ordered", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, concurrency=8, max_in_flight=32) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
        stats = consumer.stats()
    assert all(seq == list(range(per_key)) for seq in got.values()) and len(got) == 8
    assert None not in offsets, "a message without a partition"
    assert all(None not in o for o in offsets.values()), "a message without a queue offset"
    assert all(o == sorted(o) for o in offsets.values())
    assert stats.order_errors == 0
    assert stats.subscriptions and all(s.ordered for s in stats.subscriptions)


async def test_leader_move_mid_stream_loses_nothing(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("moving", partitions=2, replicas=2, channels=["ch"])
    seen: set[bytes] = set()
    first_half = asyncio.Event()
    changed = Watch()

    async def handler(msg: Message) -> None:
        seen.add(msg.body)
        changed.poke()
        if len(seen) >= 50:
            first_half.set()

    bodies = [b"%d" % i for i in range(100)]
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, \
            Consumer("moving", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                     handler=handler, lookup_options={"poll_interval": 1.0}, **FAST):
        for body in bodies[:50]:
            await producer.publish("moving", body)
        await asyncio.wait_for(first_half.wait(), WAIT)
        old = nsq_cluster.leader_of("moving", 0)
        new = nsq_cluster.move_leader("moving", 0)
        assert nsq_cluster.node_info(new).node_id != nsq_cluster.node_info(old).node_id
        for body in bodies[50:]:
            await producer.publish("moving", body)
        await changed.until(lambda: len(seen) == 100, WAIT)
    assert seen == set(bodies)
    committed = {m.body for msgs in logged(nsq_cluster, "moving").values() for m in msgs}
    assert committed == set(bodies)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, mode="classic")
async def test_classic_cluster_consumption(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("classic", channels=["ch"])
    bodies = []
    for n, address in enumerate(nsq_cluster.nsqd_tcp_addresses):
        host, port = address.rsplit(":", 1)
        conn = await Connection.connect(host, int(port))
        for i in range(5):
            body = b"node%d-%d" % (n, i)
            bodies.append(body)
            await conn.request(commands.pub("classic", body))
        await conn.close()
    seen: list[Message] = []
    done = asyncio.Event()

    def handler(msg: Message) -> None:  # a plain function works too
        seen.append(msg)
        if len(seen) == len(bodies):
            done.set()

    async with Consumer("classic", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
        assert consumer.connection_count == 2
    assert sorted(m.body for m in seen) == sorted(bodies)
    assert all(m.partition is None and m.trace_id is None for m in seen)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_start_position_on_every_partition_when_a_node_leads_several(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("rewind", partitions=4, replicas=1, channels=["keep"])
    leaders = {nsq_cluster.node_info(nsq_cluster.leader_of("rewind", p)).node_id
               for p in range(4)}
    assert len(leaders) == 2  # so some node leads two partitions
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        for p in range(4):
            for i in range(5):
                await producer.publish("rewind", b"p%d-%d" % (p, i), partition=p)
    from smartnsq import StartPosition
    seen: list[Message] = []
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        seen.append(msg)
        if len(seen) == 12:
            done.set()

    async with Consumer("rewind", "late", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, start=StartPosition.message_count(3)) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
        channels = [p.channels["late"] for p in nsq_cluster.state.topics["rewind"].partitions]
        await watch_channels(Watch(), *channels).until(
            lambda: sum(c.finish_count for c in channels) == 12, WAIT)
        assert consumer.stats().finished == 12
    assert sorted(m.body for m in seen) == sorted(b"p%d-%d" % (p, i) for p in range(4)
                                                  for i in range(2, 5))
    assert all(m.body.startswith(b"p%d-" % (m.partition or 0)) for m in seen)
