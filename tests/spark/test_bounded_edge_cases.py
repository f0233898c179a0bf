"""Edge cases a user of Spark's Kafka connector meets first, and what the nsq source does.

* A bounded read that selects nothing (an empty topic, ``startingOffsets=latest``, a start
  equal to its end, an end timestamp before the first message) is an empty DataFrame with the
  source's schema, as Kafka's empty offset ranges are: pyspark hands the reader one
  ``InputPartition(None)`` when ``partitions()`` plans none, and that reads as no rows. A
  ``timestamp:`` on an empty partition is its end, unasked (the real nsqd refuses the search).
* ``partitions`` naming a partition the topic lacks is refused with the ``InvalidArgument``
  naming the option, for a bounded read and for a stream's first offsets.
* Explicit offsets keyed by a topic the source does not read are refused (Kafka refuses
  offsets that do not match the assigned partitions), naming the topic(s) expected.
* A ``timestamp:`` in milliseconds (Kafka's unit) is refused with a message naming the unit
  instead of being taken as seconds tens of thousands of years ahead; Kafka's own options
  (``startingTimestamp``...) take Kafka's milliseconds, and refuse seconds the same way.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql.datasource import InputPartition

from smartnsq import sync
from smartnsq.errors import InvalidArgument
from smartnsq.spark import read_schema
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.source import NSQBatchReader, NSQStreamReader

pytestmark = pytest.mark.spark

LOOKUPD = "127.0.0.1:4161"  # for checks that fail before any cluster is asked


def publish(nsq: Any, topic: str, count: int, partition: int = 0) -> list[bytes]:
    bodies = [f"m{i}".encode() for i in range(count)]
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:
        producer.publish_many(topic, bodies, partition=partition)
    return bodies


def parse(streaming: bool = False, topic: str = "orders", **options: str) -> SourceOptions:
    return SourceOptions.parse({"lookupd": LOOKUPD, "topic": topic, **options},
                               streaming=streaming)


def load(spark: Any, nsq: Any, topic: str, **options: str) -> Any:
    reader = spark.read.format("nsq").option("lookupd", nsq.lookupd).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# -- row 1: a bounded read that selects nothing ----------------------------------------------------

def test_the_placeholder_partition_pyspark_substitutes_reads_as_no_rows(nsq: Any) -> None:
    options = SourceOptions.parse({"lookupd": nsq.lookupd, "topic": "edge_placeholder"},
                                  streaming=False)
    assert list(NSQBatchReader(options).read(InputPartition(None))) == []


def test_a_read_of_an_empty_topic_is_an_empty_frame_with_the_schema(spark: Any,
                                                                    nsq: Any) -> None:
    nsq.create_topic("edge_empty", partitions=2)
    frame = load(spark, nsq, "edge_empty")
    assert frame.collect() == []
    assert frame.schema == read_schema()


def test_reads_selecting_no_message_are_empty_frames(spark: Any, nsq: Any) -> None:
    nsq.create_topic("edge_none", partitions=1)
    publish(nsq, "edge_none", 3)
    end = NSQBatchReader(SourceOptions.parse({"lookupd": nsq.lookupd, "topic": "edge_none"},
                                             streaming=False)).partitions()[0].end
    hour_ago = int(time.time()) - 3600  # before the first message: the end is its start
    cases = {
        "latest": {"startingOffsets": "latest"},
        "start == end": {"startingOffsets": json.dumps({"edge_none": {"0": end}}),
                         "endingOffsets": json.dumps({"edge_none": {"0": end}})},
        "end before the first message": {"endingOffsets": f"timestamp:{hour_ago}"},
    }
    for case, options in cases.items():
        frame = load(spark, nsq, "edge_none", **options)
        assert frame.collect() == [], case
        assert frame.schema == read_schema(), case
    assert len(load(spark, nsq, "edge_none").collect()) == 3  # the topic does hold messages


# -- row 2: partitions the topic does not have ----------------------------------------------------

def test_partitions_beyond_the_topic_are_refused_naming_the_option(nsq: Any) -> None:
    nsq.create_topic("edge_seven", partitions=4)
    options = SourceOptions.parse({"lookupd": nsq.lookupd, "topic": "edge_seven",
                                   "partitions": "7"}, streaming=False)
    with pytest.raises(InvalidArgument, match=r"no partition\(s\) \[7\] \(it has 4\)") as batch:
        NSQBatchReader(options).partitions()
    assert batch.value.field == "partitions"
    stream = NSQStreamReader(SourceOptions.parse(
        {"lookupd": nsq.lookupd, "topic": "edge_seven", "partitions": "7"}, streaming=True))
    try:
        with pytest.raises(InvalidArgument, match=r"no partition") as first:
            stream.initialOffset()
        assert first.value.field == "partitions"
    finally:
        stream.stop()


def test_partitions_beyond_the_topic_fail_a_spark_read_with_the_option_named(
        spark: Any, nsq: Any) -> None:
    nsq.create_topic("edge_seven_spark", partitions=4)
    with pytest.raises(Exception, match=r"InvalidArgument: invalid partitions \[7\]") as failed:
        load(spark, nsq, "edge_seven_spark", partitions="7").collect()
    assert "StopIteration" not in str(failed.value)


# -- row 7: offsets keyed by another topic --------------------------------------------------------

@pytest.mark.parametrize("name", ["startingOffsets", "endingOffsets"])
def test_offsets_of_a_topic_the_source_does_not_read_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match=r"'othertopic'.*reads 'orders'") as refused:
        parse(**{name: '{"othertopic": {"0": 5}}'})
    assert refused.value.field == name
    with pytest.raises(InvalidArgument, match=r"'c'.*reads 'a', 'b'"):
        parse(topic="a,b", **{name: '{"a": {"0": 0}, "c": {"0": 5}}'})
    assert parse(topic="a,b", **{name: '{"b": {"0": 0}}'})  # a subset is fine


def test_a_stream_refuses_starting_offsets_of_another_topic() -> None:
    with pytest.raises(InvalidArgument, match="othertopic") as refused:
        parse(streaming=True, startingOffsets='{"othertopic": {"0": 5}}')
    assert refused.value.field == "startingOffsets"


# -- row 8: milliseconds where seconds are expected -----------------------------------------------

@pytest.mark.parametrize("streaming", [False, True])
def test_a_millisecond_timestamp_is_refused_naming_the_unit(streaming: bool) -> None:
    with pytest.raises(InvalidArgument, match=r"looks like milliseconds.*seconds since the "
                       r"epoch.*divide by 1000.*timestamp:1700000000\b") as refused:
        parse(streaming=streaming, startingOffsets="timestamp:1700000000123")
    assert refused.value.field == "startingOffsets"


def test_a_millisecond_end_timestamp_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="looks like milliseconds") as refused:
        parse(endingOffsets="timestamp:1700000000000")
    assert refused.value.field == "endingOffsets"


def test_second_timestamps_up_to_the_limit_are_taken() -> None:
    assert parse(startingOffsets="timestamp:1700000000").starting == "timestamp:1700000000"
    assert parse(startingOffsets="timestamp:9999999999").starting == "timestamp:9999999999"
    with pytest.raises(InvalidArgument, match="milliseconds"):
        parse(startingOffsets="timestamp:10000000000")


@pytest.mark.parametrize("kafka, ours", [("startingTimestamp", "startingOffsets"),
                                         ("endingTimestamp", "endingOffsets")])
def test_kafkas_timestamp_options_take_kafkas_milliseconds(kafka: str, ours: str) -> None:
    from smartnsq.spark.offsets import ByTimestamp

    options = parse(**{kafka: "1700000000123"})
    assert getattr(options, ours[:-len("Offsets")]) == ByTimestamp(every=1700000000123)
    with pytest.raises(InvalidArgument, match=r"looks like seconds.*milliseconds") as refused:
        parse(**{kafka: "1700000000"})  # seconds where Kafka's option takes milliseconds
    assert refused.value.field == kafka


def test_a_timestamp_on_an_empty_queue_is_its_end_without_a_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real nsqd refuses a timestamp search on an empty queue (HTTP 500 "commit log end
    of file"); no message can be at or after any time there, so the answer is the end."""
    from smartnsq.spark.source import _Planner

    planner = _Planner(parse(topic="t"))

    def searched(*args: Any) -> int:
        raise AssertionError(f"searched an empty queue: {args}")

    monkeypatch.setattr(planner, "offset_at", searched)
    try:
        bounds = {"t": {0: (0, 0), 1: (96, 96)}}  # never written; emptied by retention
        for spec in ("timestamp:0", "timestamp:1700000000"):
            assert planner.resolve(spec, bounds, "endingOffsets") == {"t": {"0": 0, "1": 96}}
    finally:
        planner.close()
