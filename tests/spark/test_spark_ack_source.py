"""The acknowledging source (``mode=ack``) on a classic dev cluster, in a real local Spark."""

from __future__ import annotations

import pathlib
import re
import threading
import time
from typing import Any

import httpx
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq import sync

pytestmark = pytest.mark.spark

WAIT = 120.0


@pytest.fixture(scope="module")
def classic(spark: Any) -> Any:
    from smartnsq.testing.spark import SparkDevCluster

    with SparkDevCluster(mode="classic", nodes=1, lookupds=1) as cluster:
        yield cluster


class _RowsSeen:
    """A listener counting input rows of one query; ``wait(n)`` blocks until n were seen."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self
        self.rows = 0
        self.target = 1
        self.reached = threading.Event()
        self.spark = spark

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                outer.rows += event.progress.numInputRows
                if outer.rows >= outer.target:
                    outer.reached.set()

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                if event.exception:
                    outer.error = event.exception
                    outer.reached.set()

        self.error: str | None = None
        self.listener = Listener()
        spark.streams.addListener(self.listener)

    def wait(self, target: int) -> None:
        self.target = target
        if self.rows < target:
            assert self.reached.wait(WAIT), f"saw {self.rows} of {target} rows"
        assert self.error is None, self.error

    def close(self) -> None:
        self.spark.streams.removeListener(self.listener)


def waiting_in_channel(cluster: Any, topic: str, channel: str) -> int:
    stats = httpx.get(f"http://{cluster.nsqd_http}/stats",
                      params={"format": "json", "topic": topic}).json()
    stats = stats.get("data", stats)
    total = 0
    for entry in stats["topics"]:
        for ch in entry["channels"]:
            if ch["channel_name"] == channel:
                total += ch["depth"] + ch["in_flight_count"] + ch["deferred_count"]
    return total


def start_query(spark: Any, classic: Any, name: str, tmp_path: Any) -> Any:
    stream = (spark.readStream.format("nsq").option("mode", "ack").option("nsqd", classic.nsqd_tcp)
              .option("topic", "acked").option("channel", "spark")
              .option("maxMessagesPerTrigger", "40").load())
    return (stream.writeStream.format("memory").queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(processingTime="0 seconds").start())


def test_ack_source_fins_only_committed_batches(spark: Any, classic: Any,
                                                tmp_path: Any) -> None:
    classic.create_topic("acked", channels=["spark"])
    with sync.Producer(nsqd=classic.nsqd_tcp.split(",")) as producer:
        producer.publish_many("acked", [f"m{i}".encode() for i in range(100)])

        seen = _RowsSeen(spark)
        try:
            query = start_query(spark, classic, "acked_1", tmp_path)
            seen.wait(100)
            query.stop()
        finally:
            seen.close()
        first = {r.body for r in spark.sql("SELECT body FROM acked_1").collect()}
        assert first == {f"m{i}".encode() for i in range(100)}

        # what the first query had not committed went back to the channel (REQ at stop)
        left = waiting_in_channel(classic, "acked", "spark")
        assert left < 100  # at least one micro-batch was committed: its messages FINed
        producer.publish_many("acked", [f"n{i}".encode() for i in range(20)])

        seen = _RowsSeen(spark)
        try:
            query = start_query(spark, classic, "acked_2", tmp_path)
            seen.wait(left + 20)
            query.stop()
        finally:
            seen.close()
    second = [r.body for r in spark.sql("SELECT body FROM acked_2").collect()]
    assert {f"n{i}".encode() for i in range(20)} <= set(second)
    assert first | set(second) == {f"m{i}".encode() for i in range(100)} | \
        {f"n{i}".encode() for i in range(20)}
    assert len(second) >= left + 20


def wait_for(condition: Any, what: str, timeout: float = WAIT) -> None:
    """Poll a state nothing signals (a channel's counts on the server), bounded."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout:g}s: {what}"
        pause.wait(0.1)


def docs_example(marker: str) -> str:
    """The first python block of docs/spark.md containing ``marker``."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if marker in block:
            return str(block)
    raise AssertionError(f"no python block with {marker!r} in docs/spark.md")


def test_ack_docs_example_drains_a_backlog_larger_than_the_budget(spark: Any, classic: Any,
                                                                  tmp_path: Any) -> None:
    """The docs' ack example as written (default budget, 1000) on a 2600-message backlog:
    every message read and FINed, none left in flight once the query stopped cleanly.
    A source FINing only at Spark's ``commit`` (which comes with the next planned batch)
    stalls after one budget: 1000 of 2600. It FINs when Spark asks for the next offset."""
    code = docs_example('option("mode", "ack")').replace("10.0.0.1:4161", classic.lookupd)
    classic.create_topic("clicks", channels=["spark-clicks"])
    total = 2600
    with sync.Producer(nsqd=classic.nsqd_tcp.split(",")) as producer:
        for start in range(0, total, 520):
            producer.publish_many("clicks", [f"b{i}".encode()
                                             for i in range(start, start + 520)])
    seen = _RowsSeen(spark)
    try:
        scope: dict[str, Any] = {"spark": spark}
        exec(code, scope)
        query = (scope["stream"].writeStream.format("memory").queryName("clicks")
                 .option("checkpointLocation", str(tmp_path / "clicks"))
                 .trigger(processingTime="0 seconds").start())
        seen.wait(total)
        # what Spark committed is FINed without more data arriving
        wait_for(lambda: waiting_in_channel(classic, "clicks", "spark-clicks") == 0,
                 "every message FINed")
        query.stop()
    finally:
        seen.close()
    bodies = [r.body for r in spark.sql("SELECT body FROM clicks").collect()]
    assert sorted(bodies) == sorted(f"b{i}".encode() for i in range(total))
    assert waiting_in_channel(classic, "clicks", "spark-clicks") == 0  # nothing redelivered


def test_ack_missing_topic_fails_after_the_timeout(spark: Any, classic: Any,
                                                   tmp_path: Any) -> None:
    stream = (spark.readStream.format("nsq").option("mode", "ack")
              .option("lookupd", classic.lookupd).option("topic", "ack_nowhere")
              .option("channel", "spark").option("connectTimeout", "3").load())
    query = (stream.writeStream.format("memory").queryName("ack_nowhere")
             .option("checkpointLocation", str(tmp_path / "nowhere"))
             .trigger(processingTime="0 seconds").start())
    try:
        expected = r"no nsqd connection for topic 'ack_nowhere'.* in 3s"
        with pytest.raises(Exception, match=expected) as info:
            query.awaitTermination(WAIT)
        assert "connectTimeout" in str(info.value)
    finally:
        query.stop()
