"""``mode=ack``: a clean stop and a restart from the checkpoint duplicate nothing Spark committed,
on the dev cluster's classic nsqd and on the real classic nsqd.

Spark writes a micro-batch's commit log entry once its output is in the sink, but tells the
source (``commit``) only when it plans the next batch; a query stopped in between (waiting for
its next trigger) never does. The source was then requeueing that batch at stop, and the
restarted query read it again: a user counted 2,000 duplicates in 20,000 rows. The first query
here stops in exactly that window: a trigger interval far longer than a batch, stopped as soon
as the checkpoint shows a committed batch with rows. The reader is given the query's
``checkpointLocation`` and FINs at stop what the commit log holds. The restarted query then
reads only the messages published since (and any batch of the first query whose output was
not committed), and once it is stopped too the channel holds nothing: 0 duplicates, 0 lost.

The sink is ``foreachBatch`` keyed by batch id, as an idempotent sink is: a batch Spark runs
again after a restart replaces its first run, so a duplicate is a message in two batch ids.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import spark_support
from both_support import channel_counts, channel_drained, producer
from support import bounded, fresh_name, wait_until

pytestmark = pytest.mark.spark

SPARK_WAIT = 180.0  # a query's start on a loaded 2-core machine; nothing waits this long
CLASSIC = pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
spark_session = spark_support.spark_session  # this module's SparkSession


class Batches:
    """A ``foreachBatch`` sink: the bodies of each batch id (a re-run replaces its first)."""

    def __init__(self) -> None:
        self.by_batch: dict[int, list[bytes]] = {}
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        bodies = [bytes(r.body) for r in frame.select("body").collect()]
        with self.lock:
            self.by_batch[batch_id] = bodies

    def committed_with_rows(self, checkpoint: Path) -> bool:
        """Whether a batch with rows is in the checkpoint's commit log."""
        with self.lock:
            ids = [b for b, bodies in self.by_batch.items() if bodies]
        return any((checkpoint / "commits" / str(b)).exists() for b in ids)

    def counts(self) -> Counter[bytes]:
        with self.lock:
            return Counter(body for bodies in self.by_batch.values() for body in bodies)


@CLASSIC
async def test_a_clean_stop_and_restart_duplicate_no_committed_batch(
        nsq_any_cluster: Any, spark_session: Any, tmp_path: Path) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("spark-ack-stop")
    await cluster.create_topic(topic, channels=["spark"])
    lookupd = ",".join(cluster.lookupd_http_addresses)
    checkpoint = tmp_path / "checkpoint"
    sink = Batches()

    def start(trigger: str) -> Any:
        frame = (spark_session.readStream.format("nsq").option("mode", "ack")
                 .option("lookupd", lookupd).option("topic", topic).option("channel", "spark")
                 .option("checkpointLocation", str(checkpoint)).load())
        return (frame.writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime=trigger).start())

    async def publish(bodies: list[bytes]) -> None:
        async with producer(cluster) as pub, bounded(10):
            await pub.publish_many(topic, bodies)

    async def until(condition: Any, query: Any, what: str) -> None:
        def done() -> bool:
            assert query.isActive, f"the query ended waiting for {what}: {query.exception()}"
            return bool(condition())

        async with bounded(SPARK_WAIT):
            await wait_until(done, SPARK_WAIT, interval=0.1)  # files and servers: poll

    first = [b"a%d" % i for i in range(200)]
    await publish(first)
    # the first query: a batch with rows is committed, and the next trigger is seconds away
    query = await asyncio.to_thread(start, "8 seconds")
    try:
        await until(lambda: sink.committed_with_rows(checkpoint), query, "a committed batch")
    finally:
        await asyncio.to_thread(query.stop)

    later = [b"b%d" % i for i in range(50)]
    await publish(later)
    query = await asyncio.to_thread(start, "0 seconds")
    try:
        await until(lambda: set(sink.counts()) >= {*first, *later}, query, "every message")
        await channel_drained(cluster, topic, "spark", timeout=60)  # all FINed
    finally:
        await asyncio.to_thread(query.stop)

    counts = sink.counts()
    duplicates = {body: n for body, n in counts.items() if n > 1}
    assert len(duplicates) == 0, (f"{len(duplicates)} duplicated messages, e.g. "
                                  f"{dict(list(duplicates.items())[:5])}")
    assert set(counts) == {*first, *later}
    # the second stop requeued nothing either: whatever it held was committed
    assert await channel_counts(cluster, topic, "spark") == (0, 0)
