"""``maxMessagesPerTrigger``: where a limited micro-batch ends, planned without a SparkSession.

What a query relies on: every batch holds exactly the limit (the last one the rest), the
batches are contiguous and read each message once, in queue order, and the driver finds each
batch's end without reading the range (issue 34: a second read of every range cost a 10-batch
run 2.5 s of 9.3): at most two HTTP calls per partition for the first batch, one after, no
subscription. A leader whose message numbers do not answer (another count than the one asked,
a failed call) costs a read of the range, never a row.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq import sync
from smartnsq.errors import ClusterError
from smartnsq.protocol.operations import StoredMessage
from smartnsq.spark import cluster as spark_cluster
from smartnsq.spark import ranges as spark_ranges
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.source import NSQStreamReader, _read

pytestmark = pytest.mark.spark

LIMIT = 100
_TOPICS = itertools.count()


def publish(nsq: Any, topic: str, count: int, partition: int) -> list[bytes]:
    bodies = [f"p{partition}-{i}".encode() for i in range(count)]
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:
        for start in range(0, count, 150):  # MPUB batches that a share cuts in the middle
            producer.publish_many(topic, bodies[start:start + 150], partition=partition)
    return bodies


@pytest.fixture
def reader(nsq: Any) -> Iterator[NSQStreamReader]:
    topic = f"limit_ends_{next(_TOPICS)}"
    nsq.create_topic(topic, partitions=2)
    made = NSQStreamReader(SourceOptions.parse(
        {"lookupd": nsq.lookupd, "topic": topic, "startingOffsets": "earliest",
         "maxMessagesPerTrigger": str(LIMIT)}, streaming=True))
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The driver's HTTP calls by kind, and the subscriptions it opens (``subscribe``)."""
    seen: Counter[str] = Counter()
    call, open_ = spark_cluster.ClusterClient._call, spark_ranges.RangeReader.open

    def counted_call(self: Any, what: str, fn: Any) -> Any:
        seen["message/get" if "/message/get" in what else what.split()[0]] += 1
        return call(self, what, fn)

    async def counted_open(self: Any) -> None:
        seen["subscribe"] += 1
        await open_(self)

    monkeypatch.setattr(spark_cluster.ClusterClient, "_call", counted_call)
    monkeypatch.setattr(spark_ranges.RangeReader, "open", counted_open)
    return seen


def drain(reader: NSQStreamReader, calls: Counter[str],
          bodies: dict[int, list[bytes]]) -> list[Counter[str]]:
    """Plan and read batches until the stream is caught up; checks every batch's rows."""
    options = reader._options
    start = reader.initialOffset()
    (topic,) = start
    read: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    planning: list[Counter[str]] = []
    left = sum(len(b) for b in bodies.values())
    while left:
        calls.clear()
        end = reader.latestOffset(start, None)
        planning.append(Counter(calls))
        rows = [row for part in reader.partitions(start, end)
                for batch in _read(options, part) for row in batch.to_pylist()]
        assert len(rows) == min(LIMIT, left)  # the limit, exactly, until the last batch
        left -= len(rows)
        for pid in (0, 1):
            mine = [r for r in rows if r["partition"] == pid]
            offsets = [start[topic][str(pid)]] + [r["queue_offset"] + r["raw_size"]
                                                  for r in mine]
            # contiguous: each row starts where the last ended; the batch ends after its last
            assert [r["queue_offset"] for r in mine] == offsets[:-1]
            assert end[topic][str(pid)] == offsets[-1]
            read[pid] += mine
        start = end
    assert reader.latestOffset(start, None) == start  # caught up
    for pid, expected in bodies.items():
        assert [r["body"] for r in read[pid]] == expected  # each message once, in order
    return planning


def test_limited_batches_end_exactly_without_a_read_of_the_range(
        nsq: Any, reader: NSQStreamReader, calls: Counter[str]) -> None:
    topic = reader._options.topics[0]
    bodies = {0: publish(nsq, topic, 730, 0), 1: publish(nsq, topic, 240, 1)}
    planning = drain(reader, calls, bodies)
    assert len(planning) == 10
    assert all(p["subscribe"] == 0 for p in planning), planning  # no range read to plan
    assert planning[0]["message/get"] <= 2 * 2  # the first: the counts at the start too
    assert all(p["message/get"] <= 2 for p in planning[1:]), planning  # then one per partition
    assert reader._ends.reads == 0


@pytest.mark.parametrize("answer", ["another count", "a failed call"])
def test_a_leader_whose_counts_do_not_answer_costs_a_read_not_a_row(
        nsq: Any, reader: NSQStreamReader, calls: Counter[str],
        monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    topic = reader._options.topics[0]
    bodies = {0: publish(nsq, topic, 330, 0), 1: publish(nsq, topic, 150, 1)}
    real = spark_cluster.ClusterClient.message_at

    def wrong(self: Any, *args: Any, **kwargs: Any) -> StoredMessage:
        found = real(self, *args, **kwargs)
        if answer == "a failed call":
            raise ClusterError("GET /message/get: HTTP 500 INTERNAL_ERROR")
        return StoredMessage(found.id, found.trace_id, found.body, found.timestamp,
                             found.attempts, found.queue_offset, (found.count or 0) + 1)

    monkeypatch.setattr(spark_cluster.ClusterClient, "message_at", wrong)
    planning = drain(reader, calls, bodies)
    assert reader._ends.reads > 0
    assert sum(p["subscribe"] for p in planning) == reader._ends.reads
