"""An ordered backlog drained from a fresh channel's first SUB_ORDERED, on both clusters.

The real server delivers each partition's first message twice there; a copy it sends after
the original's FIN is in flight and, unanswered, held its partition for the 60 s msg_timeout.
The drain is bounded well below that, every message is handled once and in order per
partition, and the copies the consumer FINs in vain (their ``E_FIN_FAILED``) are not server
errors. The dev cluster's own copies (every mode) are in ``tests/integration/
test_consumer_ordered.py``; ``bench/ordered_drain.py`` measures the drain time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.message import Message

PARTITIONS = 4
PER_PARTITION = 50
DRAIN = 30.0  # seconds: half the real msg_timeout, ample for 200 messages


async def test_an_ordered_backlog_drains_without_a_stall(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("ordbacklog")
    await cluster.create_topic(topic, partitions=PARTITIONS, replicas=2, ordered=True,
                               channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for p in range(PARTITIONS):
            async with bounded(10):
                await producer.publish_many(topic, [f"{p}:{i}".encode()
                                                    for i in range(PER_PARTITION)],
                                            partition=p, timeout=10)
    seen: dict[str, list[int]] = defaultdict(list)
    watch = Watch()

    def handle(message: Message) -> None:
        partition, _, seq = message.body.decode().partition(":")
        seen[partition].append(int(seq))
        watch.poke()

    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle)
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: all(len(set(seen[str(p)])) == PER_PARTITION
                                      for p in range(PARTITIONS)),
                          DRAIN, "every message handled")
        stats = consumer.stats()
        # in order, nothing skipped, nothing handled twice
        assert dict(seen) == {str(p): list(range(PER_PARTITION)) for p in range(PARTITIONS)}, \
            (dict(seen), stats)
        assert stats.order_errors == 0 and not stats.server_errors, (
            stats.server_errors, [(p.partition, p.duplicates_dropped, p.last_error)
                                  for p in stats.partitions])
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
