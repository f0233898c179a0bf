"""Exactly-once through leader loss: a streaming query that outlives a node's death.

The dev cluster's ``stop_node`` (without failover) leaves the partitions the node led without a
leader until it is started again, as a real cluster does for 21-49 s after a SIGKILL; then one
partition's leadership moves (``move_leader``) and the query is stopped and started again from
its checkpoint. Two queries read the same topic meanwhile: one into parquet (exactly once: no
duplicate, nothing missing) and one into an ext topic through the NSQ sink (at least once:
nothing missing, and every duplicate carries the idempotency key of its first copy).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq import sync

pytestmark = pytest.mark.spark

WAIT = 150.0
TOPIC = "fo_in"
OUT = "fo_out"
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(spark: Any) -> Iterator[Any]:
    from smartnsq.testing.spark import SparkDevCluster

    with SparkDevCluster(nodes=3, lookupds=1) as nsq:
        yield nsq


class _Rows:
    """Input rows per query name, from a listener; ``wait(names, n)`` blocks until each named
    query has read ``n`` rows in all (or one of them failed)."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self
        self.rows: Counter[str] = Counter()
        self.errors: list[str] = []
        self.changed = threading.Condition()
        self.spark = spark

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                with outer.changed:
                    outer.rows[event.progress.name] += event.progress.numInputRows
                    outer.changed.notify_all()

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                with outer.changed:
                    if event.exception:
                        outer.errors.append(event.exception)
                    outer.changed.notify_all()

        self.listener = Listener()
        spark.streams.addListener(self.listener)

    def wait(self, names: tuple[str, ...], total: int) -> None:
        with self.changed:
            ok = self.changed.wait_for(
                lambda: self.errors or all(self.rows[n] >= total for n in names), WAIT)
            assert not self.errors, "\n".join(self.errors)
            assert ok, f"rows read: {dict(self.rows)}, wanted {total} each"

    def close(self) -> None:
        self.spark.streams.removeListener(self.listener)


def test_stream_survives_leader_loss_move_and_restart(spark: Any, cluster: Any,
                                                      tmp_path: Any) -> None:
    cluster.create_topic(TOPIC, partitions=PARTITIONS, replicas=2)
    cluster.create_topic(OUT, partitions=2, ext=True)
    sent: list[bytes] = []
    counter = iter(range(10**9))

    def publish(partitions: list[int], per_partition: int) -> None:
        with sync.Producer(lookupd=cluster.lookupd.split(",")) as producer:
            for p in partitions:
                bodies = [f"{p}|{next(counter)}".encode() for _ in range(per_partition)]
                producer.publish_many(TOPIC, bodies, partition=p)
                sent.extend(bodies)

    def start() -> list[Any]:
        def source() -> Any:
            return (spark.readStream.format("nsq").option("lookupd", cluster.lookupd)
                    .option("topic", TOPIC).option("startingOffsets", "earliest")
                    .option("maxMessagesPerTrigger", "120").load())

        files = (source().writeStream.format("parquet").queryName("fo_parquet")
                 .option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck_parquet"))
                 .trigger(processingTime="0 seconds").start())
        relay = (source().selectExpr("body").writeStream.format("nsq").queryName("fo_relay")
                 .option("lookupd", cluster.lookupd).option("topic", OUT)
                 .option("idempotencyKey", "true")
                 .option("checkpointLocation", str(tmp_path / "ck_relay"))
                 .trigger(processingTime="0 seconds").start())
        return [files, relay]

    names = ("fo_parquet", "fo_relay")
    all_parts = list(range(PARTITIONS))
    publish(all_parts, 60)
    progress = _Rows(spark)
    queries: list[Any] = []
    try:
        queries = start()
        progress.wait(names, len(sent))  # all read: no batch in flight now

        # node loss between batches: the partitions it led have no leader while it is down;
        # the next batches are planned without them and must keep their offsets
        victim = cluster.run(_leader_id(cluster, TOPIC, 0))
        led = [p for p in all_parts if cluster.run(_leader_id(cluster, TOPIC, p)) == victim]
        alive = [p for p in all_parts if p not in led]
        cluster.run(cluster.cluster.stop_node(victim))
        publish(alive, 40)
        progress.wait(names, len(sent))  # the query goes on with the partitions that lead
        cluster.run(cluster.cluster.start_node(victim))
        publish(all_parts, 30)
        progress.wait(names, len(sent))

        # node loss with batches in flight: the readers of its partitions wait for it
        publish(all_parts, 40)
        cluster.run(cluster.cluster.stop_node(victim))
        restart = threading.Timer(3.0, lambda: cluster.run(cluster.cluster.start_node(victim)))
        restart.start()
        publish(alive, 10)
        restart.join()
        progress.wait(names, len(sent))

        # a leader move
        cluster.cluster.move_leader(TOPIC, 1)
        publish(all_parts, 30)
        progress.wait(names, len(sent))

        # a driver restart from the checkpoints, with a backlog
        publish(all_parts, 40)
        for query in queries:
            query.stop()
        publish(all_parts, 20)
        queries = start()
        for query in queries:
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()
        progress.close()

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    positions = Counter((r.partition, r.queue_offset) for r in rows)
    assert [pos for pos, n in positions.items() if n > 1] == []  # no duplicate
    assert sorted(r.body for r in rows) == sorted(sent)  # nothing missing

    relayed = spark.read.format("nsq").option("lookupd", cluster.lookupd) \
        .option("topic", OUT).load().collect()
    assert set(r.body for r in relayed) == set(sent)  # nothing missing
    first_key: dict[bytes, str] = {}
    for row in relayed:
        key = row.headers["spark_idempotency_key"]
        assert first_key.setdefault(row.body, key) == key  # a duplicate is a re-run row
    assert len({r.headers["spark_idempotency_key"] for r in relayed}) == len(sent)


async def _leader_id(cluster: Any, topic: str, partition: int) -> str:
    node = cluster.cluster.leader_of(topic, partition)
    return str(cluster.cluster.node_info(node).node_id)
