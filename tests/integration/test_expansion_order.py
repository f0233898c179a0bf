"""Per-key order across a partition expansion while the ordered consumer lags (issue 33
item 8), on the dev cluster over real sockets.

Hash routing moves keys when the partition count grows (by design). With a backlog on the
old partitions at the expansion, a moved key's newer messages on its new partition are
handed out while its older ones still wait on the old partition. Strictly expected to fail
until the ordered consumer finishes the old partitions up to the expansion point before it
delivers from the new ones (not done yet: see the report of issue 33).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from support import Watch, bounded

from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.message import Message

KEYS = 24
BEFORE = 10  # messages per key published before the expansion (the backlog)
AFTER = 5  # ... and after it
FAST_LOOKUP = {"poll_interval": 0.3, "jitter": 0.0}


@pytest.mark.xfail(strict=True, reason="issue 33 item 8: the ordered consumer does not yet "
                   "hold the new partitions until the old ones are consumed to the expansion")
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
                            lookup_options=FAST_LOOKUP), AsyncAdmin(lookupd) as admin:
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
    broken = {k: seqs for k, seqs in handled.items() if seqs != sorted(seqs)}
    assert broken == {}, f"{len(broken)} of {KEYS} keys out of order: {broken}"
