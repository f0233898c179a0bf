"""``ProducerConfig.linger``: concurrent plain publishes to one partition go as one MPUB, each
caller keeping its own result or error; faults and close() lose nothing acknowledged.

What a result claims is checked against the partition logs (what the servers committed); the
batching itself against the commands the producer built (``commands.mpub_unchecked``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import WAIT, wait_until

from smartnsq import Producer, PublishResult
from smartnsq.errors import InvalidArgument, NSQError
from smartnsq.model.sharding import murmur3_partition
from smartnsq.producer import producer as producer_module

LINGER = 0.02


def producer(cluster: Any, **options: Any) -> Producer:
    options.setdefault("sharded_receipts", False)
    options.setdefault("linger", LINGER)
    return Producer(lookupd=cluster.lookupd_http_addresses, **options)


def stored(cluster: Any, topic: str) -> dict[int, list[bytes]]:
    """partition -> its bodies, in log order."""
    return {part.partition: [m.body for m in part.log.messages]
            for part in cluster.state.topics[topic].partitions}


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every MPUB the producer builds."""
    sizes: list[int] = []
    real = producer_module.commands.mpub_unchecked

    def counting(topic: str, bodies: Any, *args: Any) -> bytes:
        sizes.append(len(bodies))
        return real(topic, bodies, *args)

    monkeypatch.setattr(producer_module.commands, "mpub_unchecked", counting)
    return sizes


async def test_concurrent_publishes_to_a_partition_go_as_one_mpub(
        nsq_cluster: Any, batches: list[int]) -> None:
    await nsq_cluster.create_topic("lingered", partitions=2, replicas=1)
    async with producer(nsq_cluster) as p:
        await p.publish("lingered", b"warm-up", partition=0)
        await p.publish("lingered", b"warm-up", partition=1)
        batches.clear()
        futures = [p.publish_nowait("lingered", b"k%d" % i, sharding_key="k") for i in range(50)]
        futures += [p.publish_nowait("lingered", b"j%d" % i, sharding_key="j") for i in range(30)]
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
        # publish() coroutines gather the same way
        more = await asyncio.wait_for(asyncio.gather(
            *(p.publish("lingered", b"c%d" % i, sharding_key="k") for i in range(20))), WAIT)
    k, j = murmur3_partition("k", 2), murmur3_partition("j", 2)
    logs = stored(nsq_cluster, "lingered")
    if k != j:
        assert sorted(batches) == [20, 30, 50]
        assert logs[j] == [b"warm-up"] + [b"j%d" % i for i in range(30)]
    assert [b for b in logs[k] if b[:1] in b"kc"] == \
        [b"k%d" % i for i in range(50)] + [b"c%d" % i for i in range(20)]  # call order
    assert all(isinstance(r, PublishResult) and r.attempts == 1 for r in results + more)
    assert [r.partition for r in results] == [k] * 50 + [j] * 30


async def test_publishes_that_need_their_own_command_are_not_held(
        nsq_cluster: Any, batches: list[int]) -> None:
    """A traced publish (or one wanting a receipt) is sent on its own, after the batch its
    partition holds: the wire keeps the call order."""
    await nsq_cluster.create_topic("mixed", partitions=1, replicas=1)
    async with producer(nsq_cluster) as p:
        await p.publish("mixed", b"warm-up", partition=0)
        batches.clear()
        futures = [p.publish_nowait("mixed", b"a%d" % i, partition=0) for i in range(5)]
        futures.append(p.publish_nowait("mixed", b"traced", partition=0, trace_id=7))
        futures += [p.publish_nowait("mixed", b"b%d" % i, partition=0) for i in range(5)]
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    async with producer(nsq_cluster, sharded_receipts=True) as p:
        receipt = await p.publish("mixed", b"receipt", partition=0)
    assert batches == [5, 5]
    assert results[5].trace_id == 7 and results[5].internal_id is not None
    assert receipt.internal_id is not None
    assert stored(nsq_cluster, "mixed")[0] == [b"warm-up", *(b"a%d" % i for i in range(5)),
                                              b"traced", *(b"b%d" % i for i in range(5)),
                                              b"receipt"]


async def test_close_sends_what_lingers(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("closing", partitions=1, replicas=1)
    p = producer(nsq_cluster, linger=5.0)  # the timer would not fire before close()
    async with p:
        await p.publish_nowait("closing", b"warm-up", partition=0, trace_id=1)
        # (a publish lingers only with a timeout of at least 20 lingers)
        futures = [p.publish_nowait("closing", b"m%d" % i, partition=0, timeout=200.0)
                   for i in range(10)]
    results = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    assert all(isinstance(r, PublishResult) for r in results)
    assert stored(nsq_cluster, "closing")[0][1:] == [b"m%d" % i for i in range(10)]


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_a_batch_whose_connection_is_cut_is_retried_message_by_message(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("cutbatch", partitions=2, replicas=1)
    async with producer(nsq_cluster) as p:
        await asyncio.gather(p.publish("cutbatch", b"warm-up", partition=0),
                             p.publish("cutbatch", b"warm-up", partition=1))
        futures = [p.publish_nowait("cutbatch", b"b%d" % i, sharding_key=i % 4, timeout=5.0)
                   for i in range(400)]
        # the batches are written when their timer fires: cut as soon as they are
        await wait_until(lambda: not p._lingering)
        assert nsq_cluster.cut_connections() > 0
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True),
                                          WAIT)
    logs = stored(nsq_cluster, "cutbatch")
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, PublishResult):
            assert outcome.partition == murmur3_partition(i % 4, 2)
            assert b"b%d" % i in logs[outcome.partition], f"acknowledged b{i} is missing"
        else:
            assert isinstance(outcome, NSQError), outcome
    assert all(isinstance(o, PublishResult) for o in outcomes)  # retried to success


@pytest.mark.nsq_cluster(nodes=0, classic_nodes=2, lookupds=1, mode="classic")
async def test_a_topic_on_two_plain_nodes_lingers_per_node(
        nsq_cluster: Any, batches: list[int]) -> None:
    """Round-robin alternates the two nodes' connections: one batch per node (before, each
    publish flushed the other node's batch, so every MPUB held one message)."""
    await nsq_cluster.create_topic("plainpair")
    async with producer(nsq_cluster) as p:
        await asyncio.gather(*(p.publish("plainpair", b"warm-up") for _ in range(2)))
        batches.clear()
        futures = [p.publish_nowait("plainpair", b"m%d" % i) for i in range(100)]
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    assert sorted(batches) == [50, 50]
    assert all(isinstance(r, PublishResult) for r in results)


async def test_a_publish_with_little_time_does_not_linger(
        nsq_cluster: Any, batches: list[int]) -> None:
    """A timeout under 20 lingers: the publish goes at once, as a PUB, and keeps its deadline
    (a batch leaving at the linger would have had too little left for an answer)."""
    await nsq_cluster.create_topic("hurried", partitions=1, replicas=1)
    async with producer(nsq_cluster) as p:
        await p.publish("hurried", b"warm-up", partition=0)
        batches.clear()
        results = await asyncio.wait_for(asyncio.gather(
            *(p.publish_nowait("hurried", b"h%d" % i, partition=0, timeout=10 * LINGER)
              for i in range(5))), WAIT)
    assert batches == []
    assert all(isinstance(r, PublishResult) for r in results)
    assert stored(nsq_cluster, "hurried")[0] == [b"warm-up"] + [b"h%d" % i for i in range(5)]


def test_linger_is_checked() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Producer(nsqd=["127.0.0.1:4150"], linger=-1)
    assert caught.value.field == "linger"
