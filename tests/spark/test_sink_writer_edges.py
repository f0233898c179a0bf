"""The sink's writers, called as Spark calls them on a task, without a SparkSession.

What a job relies on: rows go where their sharding key or partition column sends them (the
Producer's own choice), with their trace ids, headers, key header and idempotency keys;
bodies may be binary or text; batches are cut at ``batchSize`` and kept in order per
partition; a row the sink cannot publish (a null body, key, partition or topic) fails the
task naming the column; column options are checked on the driver; Arrow batches are taken
as rows are; commit and abort report what was published. The rows are read back from the
shared dev cluster with the replay source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from smartnsq import sync
from smartnsq.errors import InvalidArgument
from smartnsq.spark import sink as sink_module
from smartnsq.spark.options import SinkOptions, SourceOptions
from smartnsq.spark.sink import (
    NSQCommitMessage,
    NSQStreamWriter,
    NSQWriter,
    check_columns,
    make_stream_writer,
    make_writer,
)
from smartnsq.spark.source import NSQBatchReader

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def close_cached_producers() -> Iterator[None]:
    """A worker keeps one producer per option set for its tasks; the test closes them."""
    yield
    producers = list(sink_module._producers.values())
    sink_module._producers.clear()
    for producer in producers:
        producer.close()


def schema(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])


def sink(nsq: Any, **options: str) -> SinkOptions:
    return SinkOptions.parse({"lookupd": nsq.lookupd, **options})


def read_back(nsq: Any, topic: str) -> list[dict[str, Any]]:
    options = SourceOptions.parse({"lookupd": nsq.lookupd, "topic": topic}, streaming=False)
    reader = NSQBatchReader(options)
    return [row for part in reader.partitions() for batch in reader.read(part)
            for row in batch.to_pylist()]


def test_rows_land_where_their_sharding_key_sends_them(nsq: Any) -> None:
    nsq.create_topic("sink_keyed", partitions=3, ext=True)
    options = sink(nsq, topic="sink_keyed", shardingKeyColumn="k", traceIdColumn="trace",
                   headersColumn="h", keyHeader="key", batchSize="2", maxInFlight="1")
    fields = schema(("body", BinaryType()), ("k", StringType()), ("trace", LongType()),
                    ("h", MapType(StringType(), StringType())))
    check_columns(options, fields)
    writer = NSQWriter(options, fields)  # Spark's Row path (make_writer picks Arrow's)
    rows = [(b"b%d" % i, f"order-{i % 4}", -1 if i == 0 else i, {"n": str(i)} if i else None)
            for i in range(12)]
    message = writer.write(iter(rows))
    assert isinstance(message, NSQCommitMessage)
    assert message.rows == 12 and message.batches >= 6  # at most 2 rows per MPUB
    assert sum(message.partitions.values()) == 12
    nsq.create_topic("sink_keyed_probe", partitions=3, ext=True)
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:  # where publish puts them
        expected = {f"order-{k}": producer.publish("sink_keyed_probe", b"probe",
                                                   sharding_key=f"order-{k}").partition
                    for k in range(4)}
    back = read_back(nsq, "sink_keyed")
    assert sorted(r["body"] for r in back) == sorted(b for b, *_ in rows)
    for row in back:
        i = int(row["body"][1:])
        headers = dict(row["headers"])
        assert row["partition"] == expected[headers["key"]] == expected[f"order-{i % 4}"]
        assert row["trace_id"] == (-1 if i == 0 else i)  # a negative long travels unsigned
        assert headers.get("n") == (str(i) if i else None)
    for k in range(4):  # one key's rows keep their order
        mine = [int(r["body"][1:]) for r in sorted(back, key=lambda r: r["queue_offset"])
                if dict(r["headers"])["key"] == f"order-{k}"]
        assert mine == sorted(mine)


def test_partition_column_text_bodies_and_idempotency_keys(nsq: Any) -> None:
    nsq.create_topic("sink_parts", partitions=2, ext=True)
    options = sink(nsq, topic="sink_parts", partitionColumn="p", bodyColumn="text",
                   idempotencyKey="true", idempotencyId="job-7")
    writer = NSQStreamWriter(options, schema(("text", StringType()), ("p", IntegerType())))
    message = writer.write(iter([("zero", 0), ("one", 1), (bytearray(b"raw"), 1)]))
    assert message.rows == 3 and message.partitions == {"sink_parts/0": 1, "sink_parts/1": 2}
    back = sorted(read_back(nsq, "sink_parts"), key=lambda r: (r["partition"],
                                                                r["queue_offset"]))
    assert [(r["partition"], r["body"]) for r in back] == \
        [(0, b"zero"), (1, b"one"), (1, b"raw")]
    keys = [dict(r["headers"])["spark_idempotency_key"] for r in back]
    assert keys == ["job-7:0:-1:0", "job-7:0:-1:1", "job-7:0:-1:2"]  # id:batch:task:row


def test_rows_from_arrow_batches_and_a_topic_column(nsq: Any) -> None:
    nsq.create_topic("sink_arrow_a", partitions=1)
    nsq.create_topic("sink_arrow_b", partitions=1)
    options = sink(nsq, topicColumn="topic")
    fields = schema(("body", BinaryType()), ("topic", StringType()))
    writer = make_stream_writer(options, fields)
    batch = pa.RecordBatch.from_pydict({"body": [b"1", b"2", b"3"],
                                        "topic": ["sink_arrow_a", "sink_arrow_b",
                                                  "sink_arrow_a"]})
    message = writer.write(iter([batch]))
    assert message.rows == 3
    assert message.partitions == {"sink_arrow_a/0": 2, "sink_arrow_b/0": 1}
    assert [r["body"] for r in read_back(nsq, "sink_arrow_a")] == [b"1", b"3"]
    assert [r["body"] for r in read_back(nsq, "sink_arrow_b")] == [b"2"]


@pytest.mark.parametrize("options, row, column, text", [
    ({"topic": "sink_refused"}, (None, "k", 0), "bodyColumn", "null body"),
    ({"topic": "sink_refused", "shardingKeyColumn": "k"}, (b"x", None, 0),
     "shardingKeyColumn", "null sharding key"),
    ({"topic": "sink_refused", "partitionColumn": "p"}, (b"x", "k", None),
     "partitionColumn", "null partition"),
    ({"topicColumn": "k"}, (b"x", "", 0), "topicColumn", "no topic"),
])
def test_a_row_the_sink_cannot_publish_fails_the_task(
        nsq: Any, options: dict[str, str], row: tuple[Any, ...], column: str,
        text: str) -> None:
    nsq.create_topic("sink_refused", partitions=1)
    fields = schema(("body", BinaryType()), ("k", StringType()), ("p", IntegerType()))
    writer = NSQWriter(sink(nsq, **options), fields)
    with pytest.raises(InvalidArgument, match=text) as info:
        writer.write(iter([(b"fine", "k", 0), row]))
    assert info.value.field == column


def test_column_options_are_checked_on_the_driver(nsq: Any) -> None:
    fields = schema(("body", BinaryType()), ("n", IntegerType()), ("s", StringType()),
                    ("m", MapType(StringType(), IntegerType())))
    cases = [({"topic": "t", "bodyColumn": "n"}, "bodyColumn", "must be binary or string"),
             ({"topic": "t", "bodyColumn": "missing"}, "bodyColumn", "no column 'missing'"),
             ({"topic": "t", "partitionColumn": "s"}, "partitionColumn", "integer type"),
             ({"topic": "t", "headersColumn": "m"}, "headersColumn", "map<string,string>"),
             ({"topicColumn": "n"}, "topicColumn", "must be string")]
    for options, column, text in cases:
        with pytest.raises(InvalidArgument, match=text) as info:
            make_writer(sink(nsq, **options), fields)
        assert info.value.field == column
    check_columns(sink(nsq, topic="t", shardingKeyColumn="n", traceIdColumn="n"), fields)
    with pytest.raises(InvalidArgument, match="no column 'gone'") as info:
        NSQWriter(sink(nsq, topic="t", traceIdColumn="gone"), fields).write(iter([]))
    assert info.value.field == "traceIdColumn"  # the task checks too, naming the option


def test_commit_and_abort_report_what_was_published(nsq: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from smartnsq.observability import logs

    logs.reset()  # the library holds back a warning identical to a recent one
    fields = schema(("body", BinaryType()))
    done = [NSQCommitMessage(rows=3, batches=1), None, NSQCommitMessage(rows=4, batches=2)]
    batch_writer = NSQWriter(sink(nsq, topic="t"), fields)
    stream_writer = NSQStreamWriter(sink(nsq, topic="t"), fields)
    with caplog.at_level(logging.INFO, logger="smartnsq.spark"):
        batch_writer.commit(done)
        batch_writer.abort(done)
        stream_writer.commit(done, 5)
        stream_writer.abort(done, 6)
    assert "committed: 7 rows in 3 batches" in caplog.text
    assert "aborted after publishing 7 rows" in caplog.text
    assert "stream batch 5 committed: 7 rows in 3 MPUB batches" in caplog.text
    assert "stream batch 6 aborted after publishing 7 rows" in caplog.text


def test_kafkas_column_names_are_taken_without_options(nsq: Any) -> None:
    from pyspark.sql.types import ArrayType

    nsq.create_topic("sink_kafka_cols", partitions=3, ext=True)
    nsq.create_topic("sink_kafka_plain", partitions=1)
    kafka_headers = ArrayType(StructType([StructField("key", StringType()),
                                          StructField("value", BinaryType())]))
    fields = schema(("topic", StringType()), ("key", StringType()), ("value", BinaryType()),
                    ("partition", IntegerType()), ("headers", kafka_headers))
    writer = make_writer(SinkOptions.parse({"lookupd": nsq.lookupd}), fields)
    batch = pa.RecordBatch.from_pylist([
        {"topic": "sink_kafka_cols", "key": "k1", "value": b"keyed", "partition": None,
         "headers": [{"key": "h", "value": b"v"}]},
        {"topic": "sink_kafka_cols", "key": None, "value": b"pinned", "partition": 2,
         "headers": None},
        {"topic": "sink_kafka_cols", "key": None, "value": b"neither", "partition": None,
         "headers": []},
        {"topic": "sink_kafka_plain", "key": None, "value": b"plain", "partition": None,
         "headers": []},  # no headers on a non-ext topic: sent without an ext header
    ], schema=pa.schema([("topic", pa.string()), ("key", pa.string()),
                         ("value", pa.binary()), ("partition", pa.int32()),
                         ("headers", pa.list_(pa.struct([("key", pa.string()),
                                                         ("value", pa.binary())])))]))
    assert writer.write(iter([batch])).rows == 4
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:
        keyed_to = producer.routes("sink_kafka_cols")
    from smartnsq.model.partitions import partition_for
    from smartnsq.model.sharding import make_router

    back = {r["body"]: r for r in read_back(nsq, "sink_kafka_cols")}
    assert back[b"keyed"]["partition"] == partition_for(keyed_to, make_router("murmur3"),
                                                        sharding_key="k1")
    assert dict(back[b"keyed"]["headers"]) == {"h": "v"}
    assert back[b"pinned"]["partition"] == 2 and b"neither" in back
    assert [r["body"] for r in read_back(nsq, "sink_kafka_plain")] == [b"plain"]
