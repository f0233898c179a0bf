"""``Producer.publish_nowait``: many publishes in flight without a task each.

What a result claims is checked against the partition logs in the cluster's state (what the
servers committed). Faults hit a burst that is in flight; every future must settle within its
own deadline, and every acknowledged message must be stored.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import WAIT, stored

from smartnsq import Producer, PublishResult
from smartnsq.errors import InvalidArgument, NSQError
from smartnsq.model.sharding import murmur3_partition

TIMEOUT = 5.0  # each publish's own deadline in the fault tests


def producer(cluster: Any, **options: Any) -> Producer:
    return Producer(lookupd=cluster.lookupd_http_addresses, **options)


async def settle(futures: list[asyncio.Future[PublishResult]]) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_a_burst_in_flight_is_acknowledged_and_stored(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("burst", partitions=4, replicas=1)
    async with producer(nsq_cluster) as p:
        # routes known and every leader's connection open: the fast path from here on
        await asyncio.gather(*(p.publish("burst", b"warm-up", partition=i) for i in range(4)))
        tasks_before = len(asyncio.all_tasks())
        futures = [p.publish_nowait("burst", b"m%d" % i) for i in range(500)]
        # no task per publish on the fast path (checked before the write buffers could fill
        # up and push back: past the high-water mark publishes wait in publish()'s way)
        assert len(asyncio.all_tasks()) - tasks_before < 10
        futures += [p.publish_nowait("burst", b"m%d" % i) for i in range(500, 2000)]
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    assert all(isinstance(r, PublishResult) and r.attempts == 1 for r in results)
    where = stored(nsq_cluster, "burst")
    for i, result in enumerate(results):
        assert where[b"m%d" % i] == [result.partition]
    assert sum(len(w) for w in where.values()) == 2004
    assert {r.partition for r in results} == {0, 1, 2, 3}  # round-robin as publish()


async def test_sharded_publishes_land_on_the_go_hash_partition(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("keyed", partitions=8, replicas=1)
    keys: list[str | bytes | int] = [f"user-{i}" for i in range(50)]
    keys += [b"hello", b"hello, world", 42]
    async with producer(nsq_cluster) as p:
        await p.routes("keyed")
        first = await asyncio.gather(*(p.publish_nowait("keyed", b"k=" + repr(k).encode(),
                                                        sharding_key=k) for k in keys))
        # second round: every leader's connection is open now
        second = await asyncio.gather(*(p.publish_nowait("keyed", b"k2=" + repr(k).encode(),
                                                         sharding_key=k) for k in keys))
    where = stored(nsq_cluster, "keyed")
    for key, a, b in zip(keys, first, second, strict=True):
        expected = murmur3_partition(key, 8)
        assert a.partition == b.partition == expected
        assert where[b"k=" + repr(key).encode()] == [expected]
        assert where[b"k2=" + repr(key).encode()] == [expected]
        assert b.queue_offset is not None  # sharded publishes carry the receipt by default
    assert where[b"k=b'hello'"] == [7 % 8]


async def test_invalid_input_raises_at_the_call(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("strict", partitions=2, replicas=1)
    await nsq_cluster.create_topic("ordered", partitions=2, replicas=1, ordered=True)
    async with producer(nsq_cluster) as p:
        await p.publish("strict", b"ok")
        bad: list[dict[str, Any]] = [
            {"topic": "bad topic!", "body": b"x"},
            {"topic": "strict", "body": b""},
            {"topic": "strict", "body": "text"},
            {"topic": "strict", "body": b"x", "trace_id": -1},
            {"topic": "strict", "body": b"x", "partition": -1},
            {"topic": "strict", "body": b"x", "partition": 0, "sharding_key": "k"},
            {"topic": "strict", "body": b"x", "sharding_key": 1.5},
            {"topic": "strict", "body": b"x", "timeout": 0},
            {"topic": "strict", "body": b"x", "headers": {"bad name": "v"}},
            {"topic": "strict", "body": b"x" * (p.config.max_msg_size + 1)},
        ]
        for kwargs in bad:
            with pytest.raises(InvalidArgument):
                p.publish_nowait(**kwargs)
        # what only the routes tell fails the future, as publish() raises it after lookup
        with pytest.raises(InvalidArgument, match="ordered"):
            await p.publish_nowait("ordered", b"x")
        with pytest.raises(InvalidArgument, match="partitions"):
            await p.publish_nowait("strict", b"x", partition=5)
    assert sum(len(w) for w in stored(nsq_cluster, "strict").values()) == 1


async def test_publishes_before_start_take_the_slow_path(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("early", partitions=2, replicas=1)
    p = producer(nsq_cluster)
    try:
        futures = [p.publish_nowait("early", b"e%d" % i, sharding_key=i) for i in range(100)]
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    finally:
        await p.close()
    where = stored(nsq_cluster, "early")
    for i, result in enumerate(results):
        assert where[b"e%d" % i] == [result.partition] == [murmur3_partition(i, 2)]


async def check_burst_outcome(cluster: Any, topic: str, keys: list[int],
                              outcomes: list[Any], partitions: int) -> int:
    """Every future settled; every success stored in its key's partition. Returns successes."""
    where = stored(cluster, topic)
    ok = 0
    for i, (key, outcome) in enumerate(zip(keys, outcomes, strict=True)):
        body = b"b%d" % i
        if isinstance(outcome, PublishResult):
            ok += 1
            assert outcome.partition == murmur3_partition(key, partitions)
            assert where.get(body), f"acknowledged {body!r} is missing"
            assert set(where[body]) == {outcome.partition}
        else:
            assert isinstance(outcome, NSQError), outcome  # a clear error, not a hang
    return ok


@pytest.mark.nsq_cluster(nodes=3, lookupds=1)
async def test_a_leader_move_during_a_burst(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("moving", partitions=4, replicas=2)
    keys = [i % 16 for i in range(1200)]
    async with producer(nsq_cluster, retry_delay_max=0.2) as p:
        await p.publish("moving", b"warm-up", partition=0)
        futures = [p.publish_nowait("moving", b"b%d" % i, sharding_key=k, timeout=TIMEOUT)
                   for i, k in enumerate(keys[:600])]
        nsq_cluster.move_leader("moving", murmur3_partition(0, 4))  # with the burst unanswered
        futures += [p.publish_nowait("moving", b"b%d" % i, sharding_key=k, timeout=TIMEOUT)
                    for i, k in enumerate(keys[600:], 600)]
        outcomes = await settle(futures)
    ok = await check_burst_outcome(nsq_cluster, "moving", keys, outcomes, 4)
    assert ok == len(keys)  # a leader move is retried to success within the deadline
    assert any(r.attempts > 1 for r in outcomes)  # some went through the slow path


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_cut_connections_during_a_burst(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("cut", partitions=2, replicas=1)
    keys = [i % 8 for i in range(1500)]
    async with producer(nsq_cluster) as p:
        await asyncio.gather(p.publish("cut", b"warm-up", partition=0),
                             p.publish("cut", b"warm-up", partition=1))
        futures = [p.publish_nowait("cut", b"b%d" % i, sharding_key=k, timeout=TIMEOUT)
                   for i, k in enumerate(keys[:1000])]
        await asyncio.sleep(0)  # one loop round: the burst is written, its answers not read
        assert nsq_cluster.cut_connections() > 0
        futures += [p.publish_nowait("cut", b"b%d" % i, sharding_key=k, timeout=TIMEOUT)
                    for i, k in enumerate(keys[1000:], 1000)]
        outcomes = await settle(futures)
    ok = await check_burst_outcome(nsq_cluster, "cut", keys, outcomes, 2)
    assert ok == len(keys)  # a lost connection is retried on a fresh one
    assert any(r.attempts > 1 for r in outcomes)


async def test_cancelling_a_future_leaves_the_others_alone(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("cancel", partitions=1, replicas=1)
    async with producer(nsq_cluster) as p:
        await p.publish("cancel", b"warm-up")
        futures = [p.publish_nowait("cancel", b"c%d" % i) for i in range(20)]
        futures[3].cancel()
        outcomes = await settle(futures)
        assert isinstance(outcomes[3], asyncio.CancelledError)
        assert all(isinstance(o, PublishResult) for i, o in enumerate(outcomes) if i != 3)
        # the connection is still in step: the next publish gets its own answer
        assert (await p.publish_nowait("cancel", b"after")).partition == 0


async def test_traced_and_ext_publishes_carry_their_receipts(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("traced", partitions=2, replicas=1)
    await nsq_cluster.create_topic("withext", partitions=1, replicas=1, ext=True)
    async with producer(nsq_cluster) as p:
        await asyncio.gather(p.publish("traced", b"w", partition=0),
                             p.publish("traced", b"w", partition=1),
                             p.publish("withext", b"w", headers={"k": "v"}))
        traced, ext = await asyncio.gather(
            p.publish_nowait("traced", b"t", trace_id=4242),
            p.publish_nowait("withext", b"e", trace_id=7, headers={"k": "v"}))
    assert traced.trace_id == 4242 and traced.internal_id is not None
    assert traced.queue_offset is not None and traced.partition in (0, 1)
    assert ext.partition == 0
    stored_ext = [m for m in nsq_cluster.state.topics["withext"].partitions[0].log.messages
                  if m.body == b"e"]
    assert len(stored_ext) == 1


async def test_one_key_is_stored_in_call_order_from_a_cold_start(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("inorder", partitions=4, replicas=1, ordered=True)
    async with producer(nsq_cluster) as p:
        # routes unknown and no connection yet: the first calls take the slow path, the later
        # ones must not overtake them on the wire
        first = [p.publish_nowait("inorder", b"%d" % i, sharding_key="k") for i in range(50)]
        await asyncio.wait_for(first[0], WAIT)
        rest = [p.publish_nowait("inorder", b"%d" % i, sharding_key="k")
                for i in range(50, 300)]
        results = await asyncio.wait_for(asyncio.gather(*first, *rest), WAIT)
    partition = murmur3_partition("k", 4)
    assert {r.partition for r in results} == {partition}
    log = nsq_cluster.state.topics["inorder"].partitions[partition].log.messages
    assert [m.body for m in log] == [b"%d" % i for i in range(300)]
