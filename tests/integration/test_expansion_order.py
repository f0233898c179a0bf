"""Per-key order across a partition expansion while the ordered consumer lags (issue 33
item 8), on the dev cluster over real sockets.

Hash routing moves keys when the partition count grows (by design). With a backlog on the
old partitions at the expansion, a moved key's newer messages on its new partition are
handed out while its older ones still wait on the old partition, unless the ordered consumer
holds the new partitions until the old ones are consumed up to the expansion point, as it
does (``smartnsq.consumer.expansion``): before it did, 9 of 24 keys came out of order here in
every run; now none does.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from support import Watch, bounded, wait_until

from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.message import Message
from smartnsq.model.expansion import BY_CONSUMED

KEYS = 24
BEFORE = 10  # messages per key published before the expansion (the backlog)
AFTER = 5  # ... and after it
FAST_LOOKUP = {"poll_interval": 0.3, "jitter": 0.0}


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_per_key_order_holds_across_an_expansion_with_a_backlog(
        nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("grow", partitions=2, replicas=1, ordered=True, channels=["ch"])
    lookupd = cluster.lookupd_http_addresses
    handled: dict[int, list[int]] = defaultdict(list)
    watch = Watch()

    async def handle(message: Message) -> None:
        await asyncio.sleep(0.01)  # the handler's work: the consumer lags its backlog
        key, seq = (int(x) for x in bytes(message.body).split(b":"))
        handled[key].append(seq)
        watch.poke()

    async with Producer(lookupd=lookupd, lookup_options=FAST_LOOKUP) as producer:
        for seq in range(BEFORE):
            for key in range(KEYS):
                await producer.publish("grow", b"%d:%d" % (key, seq), sharding_key=key)
        async with Consumer("grow", "ch", lookupd=lookupd, handler=handle,
                            lookup_options=FAST_LOOKUP) as consumer, \
                AsyncAdmin(lookupd) as admin:
            await watch.until(lambda: sum(map(len, handled.values())) >= 1, 10,
                              "the first delivery")
            await admin.expand_topic("grow", 4)
            await watch.until(
                lambda: producer.pool.routes("grow") is not None
                and producer.pool.routes("grow").partition_num == 4, 10,  # type: ignore[union-attr]
                "the producer's routes of 4 partitions")
            for seq in range(BEFORE, BEFORE + AFTER):
                for key in range(KEYS):
                    async with bounded(10):
                        await producer.publish("grow", b"%d:%d" % (key, seq), sharding_key=key,
                                               timeout=10)
            await watch.until(
                lambda: all(len(handled[k]) >= BEFORE + AFTER for k in range(KEYS)), 60,
                "every message handled")
            assert consumer._subs is not None
            releases = consumer._subs.expansion.releases
    # the new partitions waited for the old ones' backlog, then were let go (not the bound)
    assert [(sorted(r.new), r.why) for r in releases] == [([2, 3], BY_CONSUMED)], releases
    broken = {k: seqs for k, seqs in handled.items() if seqs != sorted(seqs)}
    assert broken == {}, f"{len(broken)} of {KEYS} keys out of order: {broken}"


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_per_key_order_holds_when_the_producer_moves_keys_after_the_consumer_saw_it(
        nsq_cluster: Any) -> None:
    """The consumer sees the growth first; the producer goes on writing every key to the old
    partitions until its own, later, lookup poll. The expansion point is read once a new
    partition is written to, so it is past those writes too."""
    cluster = nsq_cluster
    await cluster.create_topic("late", partitions=2, replicas=1, ordered=True, channels=["ch"])
    lookupd = cluster.lookupd_http_addresses
    handled: dict[int, list[int]] = defaultdict(list)
    sent = [0] * KEYS
    watch = Watch()

    async def handle(message: Message) -> None:
        await asyncio.sleep(0.005)  # the handler's work: the consumer lags its backlog
        key, seq = (int(x) for x in bytes(message.body).split(b":"))
        handled[key].append(seq)
        watch.poke()

    async def round_() -> None:
        for key in range(KEYS):
            async with bounded(10):
                await producer.publish("late", b"%d:%d" % (key, sent[key]), sharding_key=key,
                                       timeout=10)
            sent[key] += 1

    def moved() -> bool:
        routes = producer.pool.routes("late")
        return routes is not None and routes.partition_num == 4

    async with Producer(lookupd=lookupd,
                        lookup_options={"poll_interval": 1.5, "jitter": 0.0}) as producer:
        for _ in range(BEFORE):
            await round_()
        async with Consumer("late", "ch", lookupd=lookupd, handler=handle,
                            lookup_options=FAST_LOOKUP) as consumer, \
                AsyncAdmin(lookupd) as admin:
            assert consumer._subs is not None
            expansion = consumer._subs.expansion
            await watch.until(lambda: sum(map(len, handled.values())) >= 1, 10,
                              "the first delivery")
            await admin.expand_topic("late", 4)
            await wait_until(lambda: expansion.hold.active, 10)  # the consumer saw it
            assert not moved()
            while not moved():  # the producer still writes every key to the old partitions
                await round_()
                # ... at the pace they are consumed, keeping a backlog of about BEFORE rounds
                await watch.until(lambda: sum(map(len, handled.values()))
                                  >= sum(sent) - BEFORE * KEYS, 10, "the backlog consumed")
            for _ in range(AFTER):
                await round_()
            await watch.until(lambda: all(len(handled[k]) >= sent[k] for k in range(KEYS)),
                              60, "every message handled")
            releases = expansion.releases
    broken = {k: seqs for k, seqs in handled.items() if seqs != sorted(seqs)}
    assert broken == {}, f"{len(broken)} of {KEYS} keys out of order: {broken}"
    assert [(sorted(r.new), r.why) for r in releases] == [([2, 3], BY_CONSUMED)], releases
