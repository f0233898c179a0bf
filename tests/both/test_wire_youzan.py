"""Youzan's wire features on both clusters: partitioned publish and
consume, MPUB, sharding keys under both hash schemes, traced publishes' receipts against what
the consumer is given, ext JSON headers and tags, and SUB_ADVANCED start positions.

Each body runs ``[dev]`` on a fresh ``DevCluster`` and ``[real]`` on the session's real youzan
cluster (3 nsqd, 2 lookupds), so every field compared here is one both agree on.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from typing import Any

from both_support import (
    Collector,
    channel_drained,
    consume,
    consuming,
    first_copies,
    is_real,
    producer,
    until_clients,
)
from support import bounded, fresh_name, wait_until

from smartnsq import BatchResult, PublishResult
from smartnsq.message import Message
from smartnsq.model.sharding import java_partition, make_router, murmur3_partition
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.frames import partition_of

SECOND = 1_000_000_000  # message timestamps are nanoseconds since the epoch
RAW_OVERHEAD = 30  # a message's bytes in the queue beyond its body: 4 (size) + 26 (header)


def check_steps(messages: list[Message]) -> None:
    """Per partition, the detail block's queue offsets are contiguous: each message starts
    where the previous one ended (offset + raw size), and the internal ids grow by 1."""
    by_partition: dict[int | None, list[Message]] = defaultdict(list)
    for m in first_copies(messages).values():
        by_partition[m.partition].append(m)
    for items in by_partition.values():
        items.sort(key=lambda m: m.queue_offset or 0)
        for before, after in itertools.pairwise(items):
            assert before.queue_offset is not None and before.raw_size
            assert after.queue_offset == before.queue_offset + before.raw_size
            assert after.internal_id == (before.internal_id or 0) + 1


async def test_partitioned_publish_and_consume(nsq_any_cluster: Any) -> None:
    """Plain publishes to a 3-partition topic: each one pinned to a partition is read back
    from that partition, with the youzan fields a plain SUB gives."""
    cluster = nsq_any_cluster
    topic = fresh_name("wire-plain")
    await cluster.create_topic(topic, partitions=3, replicas=1, channels=["ch"])
    sent: dict[bytes, PublishResult] = {}
    before = time.time_ns()
    async with producer(cluster, sharded_receipts=False) as pub:
        for p in range(3):
            for i in range(2):
                body = b"p%d-%d" % (p, i)
                async with bounded(10):
                    sent[body] = await pub.publish(topic, body, partition=p)
        async with bounded(10):
            unpinned = await pub.publish(topic, b"anywhere")
    after = time.time_ns()
    assert all(r.partition == int(b[1:2]) and r.internal_id is None for b, r in sent.items())
    got = {bytes(m.body): m for m in await consume(cluster, topic, "ch", 7)}
    assert sorted(got) == sorted([*sent, b"anywhere"])
    for body, result in sent.items():
        m = got[body]
        assert m.partition == result.partition == partition_of(m.internal_id or 0)
        assert m.node == result.node  # read where it was written: the partition's leader
        assert m.attempts == 1 and m.trace_id == 0
        assert m.queue_offset is None and m.raw_size is None  # plain SUB: no detail block
        assert before - 5 * SECOND <= m.timestamp <= after + 5 * SECOND
    assert got[b"anywhere"].partition == unpinned.partition


async def test_publish_many_to_each_partition(nsq_any_cluster: Any) -> None:
    """MPUB (untraced) and MPUB_TRACE batches: the batch lands in one partition, in order;
    a traced batch's receipt names its first message and covers the whole batch."""
    cluster = nsq_any_cluster
    topic = fresh_name("wire-mpub")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    results: dict[int, BatchResult] = {}
    async with producer(cluster) as pub:
        for p in range(2):
            bodies = [b"b%d-%d" % (p, i) for i in range(3)]
            async with bounded(10):
                results[p] = await pub.publish_many(topic, bodies, partition=p,
                                                    trace_id=500 + p)
        async with bounded(10):
            plain = await pub.publish_many(topic, [b"plain-0", b"plain-1"], partition=0)
    assert plain.count == 2 and plain.partition == 0
    messages = await consume(cluster, topic, "from-start", 8,
                             start=StartPosition.message_count(0))
    by_body = first_copies(messages)
    assert len(by_body) == 8
    for p, result in results.items():
        batch = [by_body[b"b%d-%d" % (p, i)] for i in range(3)]
        assert result.count == 3 and result.partition == p
        assert [m.partition for m in batch] == [p] * 3
        assert [m.trace_id for m in batch] == [500 + p] * 3
        assert result.internal_id == batch[0].internal_id
        assert [m.internal_id for m in batch] == [batch[0].internal_id + i  # type: ignore
                                                  for i in range(3)]
        assert result.queue_offset == batch[0].queue_offset
        assert result.raw_size == sum(m.raw_size or 0 for m in batch)
    plain_batch = [by_body[b"plain-0"], by_body[b"plain-1"]]
    assert [m.trace_id for m in plain_batch] == [0, 0]
    check_steps(messages)


# keys that spread over 4 partitions under both schemes and that the schemes route differently
KEYS = [f"order-{i}" for i in range(12)]


async def test_sharding_keys_land_where_the_scheme_says(nsq_any_cluster: Any) -> None:
    """A sharding key goes to ``scheme(key) % partition_num``, the Go client's murmur3 (the
    default) or the Java client's hashCode (``sharding="java"``), on a 4-partition topic
    over 3 nodes (multipart): the receipt and the partition the consumer reads it from both
    say so. One topic, a producer of each scheme."""
    assert {murmur3_partition(k, 4) for k in KEYS} == {0, 1, 2, 3}
    assert {java_partition(k, 4) for k in KEYS} == {0, 1, 2, 3}
    assert any(murmur3_partition(k, 4) != java_partition(k, 4) for k in KEYS)
    cluster = nsq_any_cluster
    topic = fresh_name("wire-shard")
    await cluster.create_topic(topic, partitions=4, replicas=1, channels=["ch"])
    expected: dict[bytes, int] = {}
    for scheme in ("murmur3", "java"):
        router = make_router(scheme)  # type: ignore[arg-type]
        async with producer(cluster, sharding=scheme) as pub:
            for key in KEYS:
                body = f"{scheme}:{key}".encode()
                async with bounded(10):
                    result = await pub.publish(topic, body, sharding_key=key)
                assert result.partition == router(key, 4), body
                assert partition_of(result.internal_id or 0) == result.partition
                assert result.trace_id == 0  # a receipt (sharded_receipts), no trace id
                expected[body] = router(key, 4)
    got = await consume(cluster, topic, "ch", len(expected))
    assert {bytes(m.body): m.partition for m in got} == expected


async def test_traced_receipts_match_the_delivered_messages(nsq_any_cluster: Any) -> None:
    """PUB_TRACE receipts (partition, internal id, trace id, queue offset, raw size, node) are
    the fields the consumer's message carries (SUB_ADVANCED, so with the detail block)."""
    cluster = nsq_any_cluster
    topic = fresh_name("wire-trace")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    receipts: dict[bytes, PublishResult] = {}
    before = time.time_ns()
    async with producer(cluster) as pub:
        for i in range(6):
            body = b"traced-%d" % i
            async with bounded(10):
                receipts[body] = await pub.publish(topic, body, partition=i % 2,
                                                   trace_id=(1 << 63) + i)
        async with bounded(10):  # an untraced sharded publish still gets a receipt
            receipts[b"keyed"] = await pub.publish(topic, b"keyed", sharding_key="k")
    after = time.time_ns()
    messages = await consume(cluster, topic, "from-start", 7,
                             start=StartPosition.message_count(0))
    by_body = first_copies(messages)
    assert sorted(by_body) == sorted(receipts)
    for body, r in receipts.items():
        m = by_body[body]
        assert (m.partition, m.internal_id, m.trace_id, m.queue_offset, m.raw_size) == (
            r.partition, r.internal_id, r.trace_id, r.queue_offset, r.raw_size), body
        assert m.node == r.node and m.attempts == 1
        assert before - 5 * SECOND <= m.timestamp <= after + 5 * SECOND
        assert r.raw_size == RAW_OVERHEAD + len(body)  # size + header + body on disk
    assert receipts[b"traced-3"].trace_id == (1 << 63) + 3
    assert receipts[b"keyed"].trace_id == 0
    check_steps(messages)


async def test_ext_headers_and_tags_round_trip(nsq_any_cluster: Any) -> None:
    """An ext topic: JSON headers come back as sent (a traced one with the ``##trace_id``
    the client put in it), a message without headers has none."""
    cluster = nsq_any_cluster
    topic = fresh_name("wire-ext")
    await cluster.create_topic(topic, partitions=1, replicas=1, ext=True, channels=["all"])
    sent = {
        b"plain": None,
        b"headers": {"k": "v", "number": "1", "x-y": "z w"},
        b"red": {"##client_dispatch_tag": "red", "k": "r"},
        b"traced": {"k": "t"},
    }
    results: dict[bytes, PublishResult] = {}
    async with producer(cluster) as pub:
        for body, headers in sent.items():
            async with bounded(10):
                results[body] = await pub.publish(
                    topic, body, headers=headers,
                    trace_id=4242 if body == b"traced" else None)
        async with bounded(10):  # PUB_TRACE to an ext topic: no headers
            results[b"traced-plain"] = await pub.publish(topic, b"traced-plain", trace_id=7)
    assert results[b"traced"].trace_id == 4242 and results[b"traced"].internal_id
    every = first_copies(await consume(cluster, topic, "all", 5))
    assert sorted(every) == sorted([*sent, b"traced-plain"])
    assert every[b"plain"].headers == {} and every[b"plain"].ext_version == 0
    assert every[b"headers"].headers == sent[b"headers"]
    assert every[b"headers"].ext_version == 4
    assert every[b"red"].headers == sent[b"red"]
    traced = every[b"traced"]
    assert traced.headers == {"k": "t"}  # PUB_EXT carries ##trace_id there: it is trace_id
    assert b'"##trace_id"' in (traced.ext or b"")
    assert traced.trace_id == 4242 and traced.internal_id == results[b"traced"].internal_id
    assert every[b"traced-plain"].headers == {} and every[b"traced-plain"].trace_id == 7
    # an ext topic's queue holds one more byte (ext version 0), or 3 + the JSON (version 4,
    # its length, the JSON text)
    assert every[b"plain"].raw_size is None  # a plain SUB: no detail block
    assert results[b"traced"].raw_size == RAW_OVERHEAD + len(b"traced") + 3 + len(
        every[b"traced"].ext or b"")
    assert results[b"traced-plain"].raw_size == RAW_OVERHEAD + len(b"traced-plain") + 1


async def test_a_tagged_consumer_gets_its_tag(nsq_any_cluster: Any) -> None:
    """``desired_tag``: with a tagged and an untagged consumer on one channel, the tagged
    messages go to the tagged one and the rest to the other.

    Pins a known deviation (docs/devcluster.md): the real channel hands out its backlog in
    queue order, so a tagged message waits behind an untagged one until an untagged consumer
    takes that; the dev cluster lets the tagged one overtake it.
    """
    cluster = nsq_any_cluster
    topic = fresh_name("wire-tag")
    await cluster.create_topic(topic, partitions=1, replicas=1, ext=True, channels=["ch"])
    async with producer(cluster) as pub:
        for body, headers in ((b"plain", {"k": "p"}), (b"red", {"##client_dispatch_tag": "red"}),
                              (b"after", None)):
            async with bounded(10):
                await pub.publish(topic, body, headers=headers)
    tagged = Collector()
    untagged = Collector()
    async with consuming(cluster, topic, "ch", tagged, desired_tag="red"):
        await until_clients(cluster, topic, "ch", 1)
        if not is_real(cluster):
            await tagged.count(1)  # the dev cluster: red overtakes the untagged "plain"
        started = time.time()
        async with consuming(cluster, topic, "ch", untagged):
            await untagged.count(2)
            await tagged.count(1)
    assert tagged.bodies == [b"red"] and tagged.messages[0].headers == {
        "##client_dispatch_tag": "red"}
    assert sorted(set(untagged.bodies)) == [b"after", b"plain"]
    if is_real(cluster):  # red waited behind "plain" until the untagged consumer took it
        assert tagged.received[0] >= untagged.received[0]
    else:
        assert tagged.received[0] < started


async def test_sub_advanced_from_an_offset_a_count_and_a_timestamp(nsq_any_cluster: Any,
                                                                   ) -> None:
    """SUB_ADVANCED start positions on a 2-partition topic, each on a new channel: a queue
    offset, a message count (counted from 1: ``msgcount:2`` starts at the second message),
    and a timestamp between two batches (unix seconds)."""
    cluster = nsq_any_cluster
    topic = fresh_name("wire-adv")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    early: dict[bytes, PublishResult] = {}
    late: list[bytes] = []
    async with producer(cluster) as pub:
        for i in range(3):
            for p in range(2):
                body = b"a%d-%d" % (p, i)
                async with bounded(10):
                    early[body] = await pub.publish(topic, body, partition=p)
        # the next whole second of the clock, so the two batches have different seconds
        boundary = int(time.time()) + 1
        await wait_until(lambda: time.time() >= boundary + 0.01, 3.0, interval=0.02)
        for i in range(2):
            for p in range(2):
                body = b"b%d-%d" % (p, i)
                async with bounded(10):
                    await pub.publish(topic, body, partition=p)
                late.append(body)
    # the same bodies' sizes in the same order: each partition has the same offsets
    third = early[b"a0-2"].queue_offset
    assert third is not None and early[b"a1-2"].queue_offset == third
    from_offset = await consume(cluster, topic, fresh_name("offset"), 6,
                                start=StartPosition.queue_offset(third))
    assert sorted(first_copies(from_offset)) == sorted([b"a0-2", b"a1-2", *late])
    for count, skipped in ((1, 0), (2, 1), (3, 2)):
        got = await consume(cluster, topic, fresh_name("count"), 10 - 2 * skipped,
                            start=StartPosition.message_count(count))
        assert sorted(first_copies(got)) == sorted(
            [b for b in early if int(b[-1:]) >= skipped] + late), count
        check_steps(got)
    timed = await consume(cluster, topic, fresh_name("time"), 4,
                          start=StartPosition.timestamp(boundary))
    assert sorted(first_copies(timed)) == sorted(late)
    assert all(m.timestamp >= boundary * SECOND for m in timed)


async def test_sub_advanced_on_a_channel_with_a_backlog(nsq_any_cluster: Any) -> None:
    """SUB_ADVANCED from the start on a channel that already holds the messages: every one
    is handled, nothing is left queued or in flight.

    Pins a known deviation (docs/devcluster.md): the real nsqd resets the channel's reader
    asynchronously, so the first message of each partition may be delivered a second time
    (same id, attempts 1; it reaches the handler: only ordered subscriptions drop such a
    copy); the dev cluster delivers it once.
    """
    cluster = nsq_any_cluster
    topic = fresh_name("wire-backlog")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    async with producer(cluster) as pub:
        for i in range(3):
            for p in range(2):
                async with bounded(10):
                    await pub.publish(topic, b"m%d-%d" % (p, i), partition=p)
    got = Collector()
    async with consuming(cluster, topic, "ch", got, start=StartPosition.message_count(0)):
        await got.count(6)
        await channel_drained(cluster, topic, "ch")
    assert sorted(first_copies(got.messages)) == sorted(
        b"m%d-%d" % (p, i) for p in range(2) for i in range(3))
    copies = sorted(b for b, n in Counter(got.bodies).items() if n > 1)
    if is_real(cluster):
        assert set(copies) <= {b"m0-0", b"m1-0"}  # only a partition's first, if any
        assert all(m.attempts == 1 for m in got.messages)
    else:
        assert copies == []
