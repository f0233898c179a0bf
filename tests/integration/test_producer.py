"""The async Producer against the dev cluster: routing, receipts, batches, tracing, pooling.

Everything a publish claims is checked against the partition logs in the cluster's state (what
the servers committed), never against the client's own view.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

import pytest
from support import WAIT, Watch, poke_on_log

from smartnsq import BatchResult, Producer, PublishResult
from smartnsq.errors import Timeout
from smartnsq.model.sharding import java_partition, murmur3_partition


def producer(cluster: Any, **options: Any) -> Producer:
    return Producer(lookupd=cluster.lookupd_http_addresses, **options)


def log_of(cluster: Any, topic: str, partition: int) -> list[Any]:
    return cluster.state.topics[topic].partitions[partition].log.messages


def bodies_by_partition(cluster: Any, topic: str) -> dict[int, list[bytes]]:
    info = cluster.state.topics[topic]
    return {p.partition: [m.body for m in p.log.messages] for p in info.partitions}


def node_address(cluster: Any, node: Any) -> str:
    return cluster.node_info(node).tcp_address


# -- sharding -------------------------------------------------------------------------------

async def test_sharded_publishes_land_where_the_go_hash_says(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("orders", partitions=16, replicas=1)
    keys: list[str | bytes | int] = [b"hello", b"hello, world", b"", "order-1", 42, "héllo"]
    async with producer(nsq_cluster) as p:
        for key in keys:
            body = b"key=" + repr(key).encode()
            result = await p.publish("orders", body, sharding_key=key)
            expected = murmur3_partition(key, 16)
            assert result.partition == expected
            assert body in [m.body for m in log_of(nsq_cluster, "orders", expected)]
            assert result.node == node_address(nsq_cluster, nsq_cluster.leader_of("orders",
                                                                                    expected))
    # the protocol document's vectors, checked on the server side
    assert b"key=b'hello'" in [m.body for m in log_of(nsq_cluster, "orders", 7)]
    assert b"key=b'hello, world'" in [m.body for m in log_of(nsq_cluster, "orders", 15)]
    assert b"key=b''" in [m.body for m in log_of(nsq_cluster, "orders", 0)]
    total = sum(len(b) for b in bodies_by_partition(nsq_cluster, "orders").values())
    assert total == len(keys)


async def test_same_key_keeps_its_partition_and_order(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("events", partitions=4, replicas=1)
    async with producer(nsq_cluster) as p:
        results = [await p.publish("events", b"%d" % i, sharding_key="user-7")
                   for i in range(20)]
    partition = murmur3_partition("user-7", 4)
    assert {r.partition for r in results} == {partition}
    assert [m.body for m in log_of(nsq_cluster, "events", partition)] == \
        [b"%d" % i for i in range(20)]
    offsets = [r.queue_offset for r in results]
    assert offsets == sorted(offsets) and len(set(offsets)) == 20


async def test_java_sharding_matches_the_java_client(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("jv", partitions=4, replicas=1)
    async with producer(nsq_cluster, sharding="java") as p:
        result = await p.publish("jv", b"x", sharding_key="hello")
        numeric = await p.publish("jv", b"y", sharding_key=1234567)
    assert result.partition == 2 == java_partition("hello", 4)  # Go would say 3
    assert next(m.body for m in log_of(nsq_cluster, "jv", 2)) == b"x"
    assert numeric.partition == java_partition(1234567, 4)


async def test_user_sharding_function(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("custom", partitions=3, replicas=1)
    seen: list[tuple[object, int]] = []

    def last_digit(key: object, partition_num: int) -> int:
        seen.append((key, partition_num))
        return int(str(key)[-1]) % partition_num

    async with producer(nsq_cluster, sharding=last_digit) as p:
        result = await p.publish("custom", b"x", sharding_key="order-5")
    assert result.partition == 2 and seen == [("order-5", 3)]
    assert len(log_of(nsq_cluster, "custom", 2)) == 1


async def test_explicit_partition(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("explicit", partitions=3, replicas=1)
    async with producer(nsq_cluster) as p:
        results = [await p.publish("explicit", b"p%d" % n, partition=n) for n in (2, 0, 1)]
    assert [r.partition for r in results] == [2, 0, 1]
    for n in range(3):
        assert [m.body for m in log_of(nsq_cluster, "explicit", n)] == [b"p%d" % n]


async def test_unsharded_publishes_round_robin_over_partitions(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("spread", partitions=4, replicas=1)
    async with producer(nsq_cluster) as p:
        results = [await p.publish("spread", b"m%d" % i) for i in range(40)]
    counts = {n: len(b) for n, b in bodies_by_partition(nsq_cluster, "spread").items()}
    assert counts == {0: 10, 1: 10, 2: 10, 3: 10}
    assert all(r.partition in range(4) for r in results)
    # plain PUB: no receipt unless asked for
    assert all(r.internal_id is None and r.queue_offset is None for r in results)


async def test_ordered_topic_takes_sharded_publishes(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ordered", partitions=2, replicas=1, ordered=True)
    async with producer(nsq_cluster) as p:
        result = await p.publish("ordered", b"first", sharding_key="k")
    assert result.partition == murmur3_partition("k", 2)
    assert [m.body for m in log_of(nsq_cluster, "ordered", result.partition)] == [b"first"]


# -- receipts and tracing ---------------------------------------------------------------------

async def test_traced_publishes_return_the_committed_offsets(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("traced", partitions=2, replicas=1)
    async with producer(nsq_cluster) as p:
        results = [await p.publish("traced", b"body-%d" % i, partition=1, trace_id=1000 + i)
                   for i in range(5)]
        big = await p.publish("traced", b"z", partition=0, trace_id=2**64 - 1)
    stored = log_of(nsq_cluster, "traced", 1)
    assert len(stored) == 5
    for result, msg in zip(results, stored, strict=True):
        assert isinstance(result, PublishResult)
        assert result.internal_id == msg.internal_id
        assert result.trace_id == msg.trace_id
        assert result.queue_offset == msg.queue_offset
        assert result.raw_size == msg.raw_size
        assert result.partition == 1 and (msg.internal_id >> 50) == 1
        assert result.receipt is not None and result.receipt.partition == 1
    assert [r.trace_id for r in results] == [1000, 1001, 1002, 1003, 1004]
    # consecutive offsets: next = previous offset + previous raw size
    for a, b in itertools.pairwise(results):
        assert b.queue_offset == a.queue_offset + a.raw_size  # type: ignore[operator]
    assert big.trace_id == 2**64 - 1 == log_of(nsq_cluster, "traced", 0)[0].trace_id


async def test_sharded_publish_has_a_receipt_by_default(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("receipts", partitions=2, replicas=1)
    async with producer(nsq_cluster) as p:
        result = await p.publish("receipts", b"x", sharding_key="a")
    async with producer(nsq_cluster, sharded_receipts=False) as p:
        plain = await p.publish("receipts", b"y", sharding_key="a")
    msg = log_of(nsq_cluster, "receipts", result.partition)[0]  # type: ignore[index]
    assert (result.internal_id, result.queue_offset, result.trace_id) == \
        (msg.internal_id, msg.queue_offset, 0)
    assert plain.partition == result.partition and plain.internal_id is None


async def test_trace_with_headers_goes_as_pub_ext(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("extt", partitions=1, replicas=1, ext=True)
    async with producer(nsq_cluster) as p:
        result = await p.publish("extt", b"payload", headers={"color": "red"}, trace_id=77)
        plain = await p.publish("extt", b"payload2", headers={"color": "blue"})
    first, second = log_of(nsq_cluster, "extt", 0)
    assert result.trace_id == 77 == first.trace_id
    assert result.internal_id == first.internal_id
    assert result.queue_offset == first.queue_offset
    assert json.loads(first.ext) == {"color": "red", "##trace_id": "77"}
    assert json.loads(second.ext) == {"color": "blue"} and plain.internal_id is None


async def test_trace_log_lines_and_switches(nsq_cluster: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("tlog", partitions=2, replicas=1)
    await nsq_cluster.create_topic("tlog2", partitions=1, replicas=1)
    caplog.set_level(logging.INFO, logger="smartnsq.trace")

    def lines() -> list[str]:
        out = [r.getMessage() for r in caplog.records if r.name == "smartnsq.trace"]
        caplog.clear()
        return out

    async with producer(nsq_cluster) as p:
        await p.publish("tlog", b"plain")
        assert lines() == []  # default: only publishes given a trace id
        result = await p.publish("tlog", b"traced", trace_id=555)
        (line,) = lines()
        for field in (f"internal_id={result.internal_id}", "trace_id=555",
                      f"queue_offset={result.queue_offset}", f"partition={result.partition}",
                      f"node={result.node}", "topic=tlog"):
            assert field in line
        p.set_trace(True, "tlog")  # this topic: trace everything
        untraced = await p.publish("tlog", b"now traced")
        assert untraced.internal_id is not None and len(lines()) == 1
        await p.publish("tlog2", b"other topic")
        assert lines() == []
        p.set_trace(False)  # producer-wide off; the topic's own setting still wins
        await p.publish("tlog2", b"x", trace_id=1)
        assert lines() == []
        await p.publish("tlog", b"x")
        assert len(lines()) == 1
        p.set_trace(None, "tlog")  # back to the producer's setting (off)
        await p.publish("tlog", b"x", trace_id=9)
        assert lines() == [] and p.trace_enabled("tlog") is False
        batch = await p.publish_many("tlog", [b"a", b"b"], partition=0, trace_id=[5, 6])
        assert lines() == [] and batch.internal_id is not None


# -- batches ----------------------------------------------------------------------------------

async def test_publish_many_plain_traced_and_ext(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("batch", partitions=2, replicas=1)
    await nsq_cluster.create_topic("batchext", partitions=1, replicas=1, ext=True)
    async with producer(nsq_cluster) as p:
        plain = await p.publish_many("batch", [b"a", b"b", b"c"])
        traced = await p.publish_many("batch", [b"d", b"e"], partition=1, trace_id=[7, 8])
        keyed = await p.publish_many("batch", [b"f", b"g"], sharding_key="k")
        ext = await p.publish_many("batchext", [b"h", b"i"],
                                   headers=[{"n": "1"}, None], trace_id=3)
    assert isinstance(plain, BatchResult) and plain.count == 3 and plain.internal_id is None
    stored = log_of(nsq_cluster, "batch", plain.partition)  # type: ignore[arg-type]
    assert [m.body for m in stored][:3] == [b"a", b"b", b"c"]
    p1 = log_of(nsq_cluster, "batch", 1)
    first = next(m for m in p1 if m.body == b"d")
    assert traced.internal_id == first.internal_id
    assert traced.queue_offset == first.queue_offset
    assert [m.trace_id for m in p1 if m.body in (b"d", b"e")] == [7, 8]
    assert traced.raw_size == sum(m.raw_size for m in p1 if m.body in (b"d", b"e"))
    assert keyed.partition == murmur3_partition("k", 2) and keyed.internal_id is not None
    h, i = log_of(nsq_cluster, "batchext", 0)
    assert json.loads(h.ext) == {"n": "1", "##trace_id": "3"} and h.trace_id == 3
    assert json.loads(i.ext) == {"##trace_id": "3"}
    assert ext.count == 2


# -- connections ------------------------------------------------------------------------------

async def test_partitions_of_one_node_share_a_connection(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("shared", partitions=6, replicas=1)
    async with producer(nsq_cluster) as p:
        for n in range(6):
            await p.publish("shared", b"x", partition=n)
        leaders = {nsq_cluster.state.partition("shared", n).leader for n in range(6)}
        assert len(p.pool.connections) == len(leaders) == 3


async def test_concurrent_publishes_are_coalesced_into_few_writes(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("burst", partitions=1, replicas=1)
    async with producer(nsq_cluster) as p:
        await p.publish("burst", b"warm-up")
        (conn,) = p.pool.connections.values()
        writes = conn.write_count
        results = await asyncio.gather(*(p.publish("burst", b"m%d" % i) for i in range(1000)))
        assert len(results) == 1000
        assert conn.write_count - writes < 50
    assert len(log_of(nsq_cluster, "burst", 0)) == 1001


async def test_idle_connections_close_and_reopen(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("idle", partitions=1, replicas=1)
    async with producer(nsq_cluster, idle_timeout=3600) as p:
        await p.publish("idle", b"1")
        (conn,) = p.pool.connections.values()
        assert p.pool.close_idle() == []  # used since the last sweep
        assert len(p.pool.close_idle()) == 1  # unused for a whole sweep period
        await asyncio.wait_for(conn.closed, WAIT)
        assert p.pool.connections == {}
        await p.publish("idle", b"2")
        assert len(p.pool.connections) == 1
    assert [m.body for m in log_of(nsq_cluster, "idle", 0)] == [b"1", b"2"]


# -- leadership and timeouts ------------------------------------------------------------------

async def test_leader_move_is_followed(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("moving", partitions=2, replicas=2)
    async with producer(nsq_cluster) as p:
        key = "stable-key"
        target = murmur3_partition(key, 2)
        before = await p.publish("moving", b"before", sharding_key=key)
        new_leader = nsq_cluster.move_leader("moving", target)
        after = await p.publish("moving", b"after", sharding_key=key)
    assert before.partition == after.partition == target
    assert after.node == node_address(nsq_cluster, new_leader) != before.node
    assert [m.body for m in log_of(nsq_cluster, "moving", target)] == [b"before", b"after"]


async def test_a_missing_partition_is_waited_for_never_rerouted(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("waits", partitions=3, replicas=1)
    key = "the-key"
    target = murmur3_partition(key, 3)
    leader = nsq_cluster.leader_of("waits", target)
    async with producer(nsq_cluster, retry_delay_max=0.1) as p:
        await p.publish("waits", b"warm-up", sharding_key=key)
        await nsq_cluster.stop_node(leader)  # no failover: the partition has no leader
        with pytest.raises(Timeout) as info:
            await asyncio.wait_for(p.publish("waits", b"lost", sharding_key=key, timeout=0.5),
                                   WAIT)
        assert "waits" in str(info.value)
        # unsharded publishes keep flowing to the partitions that still have a leader
        others = [await p.publish("waits", b"other%d" % i) for i in range(4)]
        assert target not in {r.partition for r in others}
        retries = p.retry_count
        # the producer logs each failed attempt before the next one: look at the count then
        with poke_on_log(Watch(), "smartnsq.producer") as attempt_failed:
            pending = asyncio.ensure_future(p.publish("waits", b"held", sharding_key=key,
                                                      timeout=WAIT))
            # it keeps trying, in vain
            await attempt_failed.until(lambda: p.retry_count >= retries + 3, WAIT)
        assert not pending.done()
        await nsq_cluster.start_node(leader)
        result = await asyncio.wait_for(pending, WAIT)
    assert result.partition == target and result.attempts > 1
    bodies = bodies_by_partition(nsq_cluster, "waits")
    assert bodies[target] == [b"warm-up", b"held"]
    assert all(b"held" not in b and b"lost" not in b for n, b in bodies.items() if n != target)


async def test_unwritable_partition_refreshes_and_retries(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("frozen", partitions=1, replicas=1)
    async with producer(nsq_cluster, retry_delay_max=0.05) as p:
        await p.publish("frozen", b"first", partition=0)
        nsq_cluster.set_writable("frozen", 0, False)
        with poke_on_log(Watch(), "smartnsq.producer") as attempt_failed:
            pending = asyncio.ensure_future(p.publish("frozen", b"second", partition=0,
                                                      timeout=WAIT))
            await attempt_failed.until(lambda: p.retry_count >= 3, WAIT)
        assert not pending.done()
        nsq_cluster.set_writable("frozen", 0, True)
        result = await asyncio.wait_for(pending, WAIT)
    assert result.attempts > 1
    assert [m.body for m in log_of(nsq_cluster, "frozen", 0)] == [b"first", b"second"]


# -- classic and direct nodes -----------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=2, lookupds=1, mode="classic")
async def test_classic_cluster_through_lookupd(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("plain")
    async with producer(nsq_cluster) as p:
        results = [await p.publish("plain", b"m%d" % i) for i in range(4)]
        batch = await p.publish_many("plain", [b"x", b"y"])
        deferred = await p.publish("plain", b"later", delay=0.01)
    assert {r.partition for r in results} == {None} and batch.count == 2
    assert len({r.node for r in results}) == 2  # round-robin over both nodes
    assert deferred.internal_id is None


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_direct_nsqd(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("direct")
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses) as p:
        result = await p.publish("direct", b"hello")
        deferred = await p.publish("direct", b"later", delay=0.5)
    assert result.node == deferred.node == nsq_cluster.nsqd_tcp_addresses[0]


async def test_sync_context_and_close(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("closing", partitions=1, replicas=1)
    p = producer(nsq_cluster)
    await p.publish("closing", b"auto-started")
    await p.close()
    assert p.closed and p.pool.connections == {}
    with pytest.raises(Exception, match="closed"):
        await p.publish("closing", b"after close")
