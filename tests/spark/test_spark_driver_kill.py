"""Exactly-once through a driver killed with SIGKILL, a node's loss and a leader move.

(The driver SIGKILL alone, on the dev cluster and on the real youzan servers:
tests/both/test_spark_driver_kill_both.py.)

The dev cluster runs in the test process with the realistic fault profile scaled down (its
leaderless window is a few seconds instead of 21-49); the Spark driver is another process
(``driver_child.py``), started in a session of its own so SIGKILL takes it with its JVM and
Python workers at once, as a dead driver machine would. The query is killed with batches in
flight while a node is down, then a partition's leader moves and the query is started again
from its checkpoint in another driver (the test's own session, already warm): the parquet
output must hold every message exactly once.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from driver_child import committed_batches, sigkill, spawn, start_query
from support import wait_until

from smartnsq import sync

pytestmark = pytest.mark.spark

TOPIC = "kill_in"
PARTITIONS = 3
WAIT = 120.0


@pytest.fixture(scope="module")
def cluster(spark: Any) -> Iterator[Any]:
    from smartnsq.devcluster.profile import REALISTIC
    from smartnsq.testing.spark import SparkDevCluster

    with SparkDevCluster(nodes=3, lookupds=1, profile=REALISTIC.scaled(0.1)) as nsq:
        yield nsq


def _until(condition: Callable[[], bool], what: str, child: subprocess.Popen[bytes]) -> None:
    def done() -> bool:
        if child.poll() is not None:
            raise AssertionError(f"the driver exited ({child.returncode}) before {what}")
        return condition()

    asyncio.run(wait_until(done, WAIT, interval=0.1))


def test_driver_sigkill_mid_stream_with_node_loss_and_leader_move(
        spark: Any, cluster: Any, tmp_path: Path) -> None:
    cluster.create_topic(TOPIC, partitions=PARTITIONS, replicas=2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    log = open(tmp_path / "driver.log", "ab")  # noqa: SIM115 - both runs append to it
    sent: list[bytes] = []
    counter = iter(range(10**9))

    def publish(n: int) -> None:
        with sync.Producer(lookupd=cluster.lookupd.split(",")) as producer:
            for first in range(0, n, 100):
                bodies = [f"m{next(counter)}".encode() for _ in range(min(100, n - first))]
                producer.publish_many(TOPIC, bodies)
                sent.extend(bodies)

    child = spawn(cluster.lookupd, TOPIC, out, checkpoint, "stream", log)
    try:
        publish(900)
        _until(lambda: committed_batches(checkpoint) >= 2, "two committed batches", child)

        # a node dies with batches in flight; its partitions have no leader for a while
        victim = cluster.cluster.leader_of(TOPIC, 0)
        cluster.run(cluster.cluster.kill_node(victim))
        committed = committed_batches(checkpoint)
        _until(lambda: committed_batches(checkpoint) > committed,
               "a batch after the node loss", child)
        sigkill(child)  # the driver dies mid-stream

        cluster.run(cluster.cluster.faults.settled(WAIT))
        cluster.run(cluster.cluster.start_node(victim))
        cluster.cluster.move_leader(TOPIC, 1)
        publish(300)

        # restarted from the checkpoint in another driver (this process's session): reads
        # what is left, then stops
        query = start_query(spark, cluster.lookupd, TOPIC, str(out), str(checkpoint), "drain")
        assert query.awaitTermination(WAIT), "the restarted query did not finish in time"
        assert query.exception() is None
    finally:
        sigkill(child)
        log.close()

    rows = spark.read.parquet(str(out)).select("partition", "queue_offset", "body").collect()
    positions = Counter((r.partition, r.queue_offset) for r in rows)
    assert [pos for pos, n in positions.items() if n > 1] == []  # 0 duplicates
    assert sorted(r.body for r in rows) == sorted(sent)  # 0 missing
