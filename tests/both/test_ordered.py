"""SUB_ORDERED on both clusters: per-key order, never skipping a poison
message, and the real server's duplicate first delivery on a channel with a backlog.

The dev nodes run with ``ordered_first_delivery_twice`` (the marker's dev-only
``nsqd_options``), which the real server does on its own (docs/protocol.md §10.1).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from typing import Any

import pytest
from both_support import (
    Collector,
    channel_drained,
    consuming,
    first_copies,
    is_real,
    producer,
    until_clients,
)
from support import bounded, fresh_name

from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.model.sharding import murmur3_partition

TWICE = {"ordered_first_delivery_twice": True}
QUICK_RETRY: dict[str, Any] = {"backoff_policy": BackoffPolicy(enabled=False),
                               "requeue_policy": RequeuePolicy(initial=0.0)}
"""A failed ordered message comes back after the consumer's 0.1 s hold (its floor)."""

KEYS = ("a", "b", "c")  # murmur3 % 2: a -> 0, b and c -> 1


def by_partition(messages: list[Message]) -> dict[int | None, list[Message]]:
    out: dict[int | None, list[Message]] = defaultdict(list)
    for m in messages:
        out[m.partition].append(m)
    return out


def check_partition_order(messages: list[Message]) -> None:
    """Per partition, deliveries come in queue order: ids and offsets never go back, and
    a new message starts where the last one ended (a redelivery repeats the same one)."""
    for items in by_partition(messages).values():
        for before, after in itertools.pairwise(items):
            assert before.queue_offset is not None and before.raw_size
            if after.internal_id == before.internal_id:
                assert after.attempts > before.attempts  # a redelivery, never a copy
                continue
            assert after.internal_id == (before.internal_id or 0) + 1
            assert after.queue_offset == before.queue_offset + before.raw_size


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_per_key_order_on_an_ordered_topic(nsq_any_cluster: Any) -> None:
    """Keys published interleaved while an ordered consumer runs (concurrency 4): each key's
    messages are handled in publish order, each in the partition its key hashes to."""
    assert {k: murmur3_partition(k, 2) for k in KEYS} == {"a": 0, "b": 1, "c": 1}
    cluster = nsq_any_cluster
    topic = fresh_name("ord-keys")
    await cluster.create_topic(topic, partitions=2, replicas=1, ordered=True, channels=["ch"])
    got = Collector()
    async with consuming(cluster, topic, "ch", got, concurrency=4) as consumer:
        # subscribed before anything is published: no backlog, no duplicate first delivery
        await until_clients(cluster, topic, "ch", 2)
        async with producer(cluster) as pub:
            for i in range(4):
                for key in KEYS:
                    async with bounded(10):
                        result = await pub.publish(topic, f"{key}{i}".encode(),
                                                   sharding_key=key)
                    assert result.partition == murmur3_partition(key, 2)
        await got.count(12)
        await channel_drained(cluster, topic, "ch")
        assert consumer.stats().order_errors == 0
    seen: dict[str, list[int]] = defaultdict(list)
    for m in got.messages:
        body = m.body.decode()
        seen[body[0]].append(int(body[1:]))
        assert m.partition == murmur3_partition(body[0], 2)
        assert m.attempts == 1
    assert dict(seen) == {k: [0, 1, 2, 3] for k in KEYS}
    check_partition_order(got.messages)


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_a_poison_message_is_never_skipped(nsq_any_cluster: Any) -> None:
    """A handler fails one ordered message 3 times. With ``max_attempts=2`` and no hook the
    consumer never skips it: it is retried (attempts 1, 2, 3, 4) and nothing behind it in its
    partition is handled before it succeeds, while the other partition flows. With an
    ``on_give_up`` hook that finishes it, the hook is called at attempt 3 and the partition
    moves on."""
    cluster = nsq_any_cluster
    topic = fresh_name("ord-poison")
    await cluster.create_topic(topic, partitions=2, replicas=1, ordered=True,
                               channels=["never", "give-up"])
    failures: dict[str, int] = defaultdict(int)

    def poison(channel: str) -> Any:
        def fail(message: Message) -> bool:
            if message.body == b"a0" and failures[channel] < 3:
                failures[channel] += 1
                return True
            return False
        return fail

    given_up: list[tuple[bytes, int]] = []

    def give_up(message: Message) -> None:
        given_up.append((bytes(message.body), message.attempts))
        message.fin()
        hooked.watch.poke()

    never = Collector(poison("never"))
    hooked = Collector(poison("give-up"))
    async with consuming(cluster, topic, "never", never, max_attempts=2, **QUICK_RETRY), \
            consuming(cluster, topic, "give-up", hooked, max_attempts=2,
                      on_give_up=give_up, **QUICK_RETRY):
        # subscribed before anything is published: no backlog, no duplicate first delivery
        await until_clients(cluster, topic, "never", 2)
        await until_clients(cluster, topic, "give-up", 2)
        async with producer(cluster) as pub:
            for i in range(3):
                for key in ("a", "b"):
                    async with bounded(10):
                        await pub.publish(topic, f"{key}{i}".encode(), sharding_key=key)
        await never.until(lambda: {b"a2", b"b2"} <= set(never.bodies),
                          "both partitions past the poison (never)")
        await hooked.until(lambda: {b"a2", b"b2"} <= set(hooked.bodies),
                           "both partitions past the poison (give-up)")
        await channel_drained(cluster, topic, "never")
        await channel_drained(cluster, topic, "give-up")
    lane = [(m.body, m.attempts) for m in never.messages if m.partition == 0]
    assert lane == [(b"a0", 1), (b"a0", 2), (b"a0", 3), (b"a0", 4), (b"a1", 1), (b"a2", 1)]
    assert [m.body for m in never.messages if m.partition == 1] == [b"b0", b"b1", b"b2"]
    check_partition_order(never.messages)
    assert given_up == [(b"a0", 3)]
    lane = [(m.body, m.attempts) for m in hooked.messages if m.partition == 0]
    assert lane == [(b"a0", 1), (b"a0", 2), (b"a1", 1), (b"a2", 1)]


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_the_first_delivery_twice_is_handled_once(nsq_any_cluster: Any) -> None:
    """The first SUB_ORDERED of a channel with a backlog: the real server delivers the first
    message of each partition twice (docs/protocol.md §10.1). The handler sees every message
    once, in order, and the drain completes promptly with nothing left in flight (a copy left in
    flight would only time out after the 60 s msg_timeout)."""
    cluster = nsq_any_cluster
    topic = fresh_name("ord-twice")
    await cluster.create_topic(topic, partitions=2, replicas=1, ordered=True, channels=["ch"])
    async with producer(cluster) as pub:
        for i in range(4):
            for p in range(2):
                async with bounded(10):
                    await pub.publish(topic, b"%d-%d" % (p, i), partition=p)
    got = Collector()
    started = time.monotonic()
    async with consuming(cluster, topic, "ch", got, concurrency=4) as consumer:
        await got.count(8, timeout=15)
        await channel_drained(cluster, topic, "ch", timeout=10)
        stats = consumer.stats()
    took = time.monotonic() - started
    assert got.bodies.count(b"0-0") == 1 and got.bodies.count(b"1-0") == 1
    assert len(got.messages) == 8  # nothing handled twice
    for p, items in by_partition(got.messages).items():
        assert [m.body for m in items] == [b"%d-%d" % (p, i) for i in range(4)]
    assert stats.order_errors == 0 and stats.server_errors == {}
    if not is_real(cluster):
        assert stats.duplicates_dropped == 2  # the real server: usually 2, not always
    assert took < 20, f"the drain took {took:.1f} s"
    assert sorted(first_copies(got.messages)) == sorted(got.bodies)
