"""Exactly-once replay through a Spark driver killed with SIGKILL, on the dev cluster and on the
real youzan servers.

The driver is another process (tests/spark/driver_child.py), in a session of its own so that
SIGKILL takes its JVM and its Python workers at once, as a dead driver machine would. It
streams a 3-partition topic into parquet in micro-batches of 150 and is killed once two are
committed, mid-stream: the batch it had planned (its offsets in the checkpoint) is not
committed, and its tasks may have left files the sink never committed. More messages are
published, and the query is started again from the checkpoint in the test's own Spark session
(``Trigger.AvailableNow``: read what is there, then stop). The parquet output, read through
the sink's metadata log as any Spark reader reads it, must hold every message exactly once.

The node loss and leader move of the dev-only tests/spark/test_spark_driver_kill.py are left
out here: on the real servers a lost leader takes minutes (test_spark_leader_loss_both.py),
this test about 60 s.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import spark_support
from both_support import producer
from spark_support import committed_batches, sigkill, spawn, start_query
from support import bounded, fresh_name, wait_until

pytestmark = pytest.mark.spark

PARTITIONS = 3
WAIT = 120.0  # a driver's start on a loaded 2-core machine; nothing waits this long
spark_session = spark_support.spark_session  # this module's SparkSession


async def _until(condition: Callable[[], bool], what: str,
                 child: subprocess.Popen[bytes]) -> None:
    """Until ``condition`` (files: polled), failing at once if the driver exited first."""
    def done() -> bool:
        if child.poll() is not None:
            raise AssertionError(f"the driver exited ({child.returncode}) before {what}")
        return condition()

    async with bounded(WAIT):
        await wait_until(done, WAIT, interval=0.1)


async def test_a_driver_sigkill_mid_stream_replays_exactly_once(
        nsq_any_cluster: Any, spark_session: Any, tmp_path: Path) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("spark-kill")
    await cluster.create_topic(topic, partitions=PARTITIONS, replicas=2)
    lookupd = ",".join(cluster.lookupd_http_addresses)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    sent: list[bytes] = []

    async def publish(n: int) -> None:
        async with producer(cluster) as pub:
            for first in range(len(sent), len(sent) + n, 100):
                bodies = [b"m%d" % i for i in range(first, first + 100)]
                for partition in range(PARTITIONS):  # every partition gets its share
                    async with bounded(10):
                        await pub.publish_many(topic, bodies[partition::PARTITIONS],
                                               partition=partition)
                sent.extend(bodies)

    await publish(900)
    with open(tmp_path / "driver.log", "ab") as log:
        child = spawn(lookupd, topic, out, checkpoint, "stream", log)
        try:
            await _until(lambda: committed_batches(checkpoint) >= 2, "two committed batches",
                         child)
        finally:
            sigkill(child)  # the driver dies mid-stream
    await publish(300)

    # restarted from the checkpoint in another driver (this process's session)
    def drain() -> list[Any]:
        query = start_query(spark_session, lookupd, topic, str(out), str(checkpoint), "drain")
        assert query.awaitTermination(WAIT), "the restarted query did not finish in time"
        assert query.exception() is None
        return list(spark_session.read.parquet(str(out))
                    .select("partition", "queue_offset", "body").collect())

    async with bounded(WAIT + 30):
        rows = await asyncio.to_thread(drain)
    positions = Counter((r.partition, r.queue_offset) for r in rows)
    assert [pos for pos, n in positions.items() if n > 1] == []  # 0 duplicates
    assert sorted(bytes(r.body) for r in rows) == sorted(sent)  # 0 missing
