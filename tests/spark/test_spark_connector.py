"""The nsq data source and sink in a real local Spark (``local[2]``) against the dev cluster."""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict
from typing import Any

import httpx
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq import sync
from smartnsq.model.sharding import murmur3_partition

pytestmark = pytest.mark.spark

WAIT = 120.0  # generous: the machine is shared; nothing waits this long when things work


def make_producer(nsq: Any) -> sync.Producer:
    return sync.Producer(lookupd=nsq.lookupd.split(","))


def read_topic(spark: Any, nsq: Any, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("nsq").option("lookupd", nsq.lookupd).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return list(reader.load().collect())


def test_batch_write_then_read_back(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_batch", partitions=3)
    rows = [(f"user-{i % 11}", f"event {i}".encode(), i) for i in range(200)]
    df = spark.createDataFrame(rows, "key STRING, body BINARY, seq INT").repartition(2)
    (df.write.format("nsq").option("lookupd", nsq.lookupd).option("topic", "spark_batch")
     .option("shardingKeyColumn", "key").option("batchSize", "64").mode("append").save())

    got = read_topic(spark, nsq, "spark_batch")
    assert sorted(r.body for r in got) == sorted(body for _, body, _ in rows)
    # routed exactly as the Producer routes a sharding key (murmur3 % partition_num)
    key_of = {body: key for key, body, _ in rows}
    for row in got:
        assert row.partition == murmur3_partition(key_of[row.body], 3)
        assert row.topic == "spark_batch" and row.attempts >= 1 and row.raw_size > 0
        assert row.internal_id >> 50 == row.partition
    # queue offsets are contiguous per partition
    by_partition: dict[int, list[Any]] = defaultdict(list)
    for row in got:
        by_partition[row.partition].append(row)
    for part_rows in by_partition.values():
        part_rows.sort(key=lambda r: r.queue_offset)
        for a, b in itertools.pairwise(part_rows):
            assert b.queue_offset == a.queue_offset + a.raw_size


def test_bounded_read_between_offsets(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_bounded", partitions=2)
    with make_producer(nsq) as producer:
        first = [producer.publish_many("spark_bounded", [f"p{p}-{i}".encode()
                                                          for i in range(10)], partition=p)
                 for p in (0, 1)]
        producer.publish_many("spark_bounded", [b"later-0"], partition=0)
    # from the 4th message of partition 0 to the end of the first batch; all of partition 1
    rows0 = read_topic(spark, nsq, "spark_bounded")
    p0 = sorted((r for r in rows0 if r.partition == 0), key=lambda r: r.queue_offset)
    start = p0[3].queue_offset
    end = p0[10].queue_offset  # where "later-0" starts
    assert first[0].queue_offset == p0[0].queue_offset
    got = read_topic(spark, nsq, "spark_bounded",
                     startingOffsets=json.dumps({"spark_bounded": {"0": start}}),
                     endingOffsets=json.dumps({"spark_bounded": {"0": end}}))
    assert sorted(r.body for r in got if r.partition == 0) == \
        sorted(f"p0-{i}".encode() for i in range(3, 10))
    assert len([r for r in got if r.partition == 1]) == 10


def test_headers_trace_ids_and_idempotency_keys(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_ext", partitions=2, ext=True)
    rows = [(i % 2, f"m{i}".encode(), {"origin": f"row{i}"}, 1000 + i) for i in range(20)]
    df = spark.createDataFrame(rows, "p INT, body BINARY, h MAP<STRING,STRING>, trace BIGINT")
    (df.coalesce(1).write.format("nsq").option("lookupd", nsq.lookupd)
     .option("topic", "spark_ext").option("partitionColumn", "p").option("headersColumn", "h")
     .option("traceIdColumn", "trace").option("idempotencyKey", "true")
     .mode("append").save())
    got = read_topic(spark, nsq, "spark_ext")
    assert len(got) == 20
    keys = set()
    for row in got:
        i = int(row.body[1:])
        assert row.partition == i % 2
        assert row.headers["origin"] == f"row{i}"
        assert row.trace_id == 1000 + i
        keys.add(row.headers["spark_idempotency_key"])
    assert len(keys) == 20


def test_sink_failure_fails_the_task_with_the_server_error(spark: Any, nsq: Any) -> None:
    df = spark.createDataFrame([(b"x",)], "body BINARY")
    with pytest.raises(Exception, match=r"no_such_topic|TopicNotFound|not found"):
        (df.write.format("nsq").option("lookupd", nsq.lookupd).option("topic", "no_such_topic")
         .mode("append").save())


def test_bad_option_fails_before_any_task(spark: Any, nsq: Any) -> None:
    df = spark.createDataFrame([(b"x",)], "body BINARY")
    with pytest.raises(Exception, match="batchSize"):
        (df.write.format("nsq").option("lookupd", nsq.lookupd).option("topic", "t")
         .option("batchSize", "lots").mode("append").save())
    with pytest.raises(Exception, match="appended"):
        (df.write.format("nsq").option("lookupd", nsq.lookupd).option("topic", "t")
         .mode("overwrite").save())


class _Progress:
    """A StreamingQueryListener that lets the test wait for rows without sleeping."""

    def __init__(self) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self
        self.rows = 0
        self.event = threading.Event()

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                outer.rows += event.progress.numInputRows
                if outer.rows > 0:
                    outer.event.set()

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        self.listener = Listener()


def test_streaming_restart_keeps_every_message_in_partition_order(spark: Any, nsq: Any,
                                                                  tmp_path: Any) -> None:
    topic = "spark_stream"
    nsq.create_topic(topic, partitions=3)
    keys = [f"key-{k}" for k in range(12)]
    with make_producer(nsq) as producer:
        def publish(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                key = keys[i % len(keys)]
                producer.publish(topic, f"{key}|{i}".encode(), sharding_key=key)

        publish(0, 200)

        def start() -> Any:
            stream = (spark.readStream.format("nsq").option("lookupd", nsq.lookupd)
                      .option("topic", topic).option("startingOffsets", "earliest")
                      .option("maxMessagesPerTrigger", "50")
                      .option("commitChannel", "default").load())
            return (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                    .option("checkpointLocation", str(tmp_path / "checkpoint"))
                    .trigger(processingTime="0 seconds").start())

        progress = _Progress()
        spark.streams.addListener(progress.listener)
        try:
            query = start()
            assert progress.event.wait(WAIT), "no micro-batch completed"
            query.stop()  # mid-stream: 200 messages at 50 per trigger
            assert progress.rows < 200
            publish(200, 260)
            query = start()
            query.processAllAvailable()
            query.stop()
        finally:
            spark.streams.removeListener(progress.listener)

    # commitChannel moved the business channel to the committed end of every partition;
    # Spark confirms a batch to its source when it plans the next one, so the last batch
    # (at most maxMessagesPerTrigger messages) is still ahead of the channel's cursor
    depths = channel_depths(nsq, topic, "default")
    assert set(depths) == {0, 1, 2} and sum(depths.values()) <= 50

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    positions = [(r.partition, r.queue_offset) for r in rows]
    assert len(positions) == len(set(positions)) == 260  # all there, none twice (file sink)
    by_partition: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_partition[row.partition].append(row)
    assert len(by_partition) > 1
    for part, part_rows in by_partition.items():
        part_rows.sort(key=lambda r: r.queue_offset)
        last_seq: dict[str, int] = {}
        for row in part_rows:
            key, seq = row.body.decode().split("|")
            assert murmur3_partition(key, 3) == part
            assert seq_after(last_seq.get(key), int(seq))
            last_seq[key] = int(seq)


def channel_depths(nsq: Any, topic: str, channel: str) -> dict[int, int]:
    depths = {}
    for address in nsq.nsqd_http.split(","):
        stats = httpx.get(f"http://{address}/stats", params={
            "format": "json", "topic": topic, "leaderOnly": "true"}).json()
        stats = stats.get("data", stats)  # the v0 envelope (no v1 Accept header)
        for entry in stats.get("topics") or ():
            for ch in entry["channels"]:
                if ch["channel_name"] == channel:
                    depths[int(entry["topic_partition"])] = ch["depth"]
    return depths


def seq_after(previous: int | None, seq: int) -> bool:
    return previous is None or seq > previous


def test_streaming_sink_with_idempotency_keys(spark: Any, nsq: Any, tmp_path: Any) -> None:
    nsq.create_topic("spark_relay_in", partitions=2)
    nsq.create_topic("spark_relay_out", partitions=2, ext=True)
    with make_producer(nsq) as producer:
        for i in range(40):
            producer.publish("spark_relay_in", f"r{i}".encode(), sharding_key=f"k{i % 5}")
    stream = (spark.readStream.format("nsq").option("lookupd", nsq.lookupd)
              .option("topic", "spark_relay_in").option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", "15").load()
              .selectExpr("body", "concat('k', cast(partition AS STRING)) AS key"))
    query = (stream.writeStream.format("nsq").option("lookupd", nsq.lookupd)
             .option("topic", "spark_relay_out").option("shardingKeyColumn", "key")
             .option("idempotencyKey", "true")
             .option("checkpointLocation", str(tmp_path / "relay"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(WAIT)
    got = read_topic(spark, nsq, "spark_relay_out")
    assert sorted(r.body for r in got) == sorted(f"r{i}".encode() for i in range(40))
    keys = [r.headers["spark_idempotency_key"] for r in got]
    assert len(set(keys)) == 40
    query_ids = {k.split(":")[0] for k in keys}
    batch_ids = {int(k.split(":")[1]) for k in keys}
    assert query_ids == {str(query.id)}
    assert len(batch_ids) >= 3  # 40 rows at 15 per trigger: one key space per micro-batch


@pytest.mark.parametrize("ddl, value, kind", [
    ("id INT, body INT", 3, "int"),
    ("id INT, body STRUCT<a: INT>", (1,), "struct<a:int>"),
])
def test_sink_refuses_a_body_it_cannot_publish(spark: Any, nsq: Any, ddl: str, value: Any,
                                               kind: str) -> None:
    df = spark.createDataFrame([(1, value)], ddl)
    with pytest.raises(Exception, match=rf"bodyColumn.*'body' is {kind}.*binary or string"):
        (df.write.format("nsq").option("lookupd", nsq.lookupd).option("topic", "any")
         .mode("append").save())


def test_offsets_inside_a_message_are_refused(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_inside", partitions=1)
    with make_producer(nsq) as producer:
        producer.publish_many("spark_inside", [f"m{i}".encode() for i in range(5)],
                              partition=0)
    rows = sorted(read_topic(spark, nsq, "spark_inside"), key=lambda r: r.queue_offset)
    inside = rows[2].queue_offset + 1
    with pytest.raises(Exception, match=rf"startingOffsets.*offset {inside} of spark_inside/0 "
                                        rf"is inside a message \(the next message starts at "
                                        rf"{rows[3].queue_offset}\)"):
        read_topic(spark, nsq, "spark_inside",
                   startingOffsets=json.dumps({"spark_inside": {"0": inside}}))
    with pytest.raises(Exception, match=rf"endingOffsets.*offset {inside} .* inside"):
        read_topic(spark, nsq, "spark_inside",
                   endingOffsets=json.dumps({"spark_inside": {"0": inside}}))
    # on a message's start both are fine, and nothing is skipped
    got = read_topic(spark, nsq, "spark_inside", startingOffsets=json.dumps(
        {"spark_inside": {"0": rows[2].queue_offset}}))
    assert [r.body for r in got] == [b"m2", b"m3", b"m4"]


def test_stream_reads_chosen_partitions_and_reports_latest_offsets(spark: Any, nsq: Any,
                                                                  tmp_path: Any) -> None:
    nsq.create_topic("spark_some", partitions=3)
    with make_producer(nsq) as producer:
        for p in range(3):
            producer.publish_many("spark_some", [f"{p}-{i}".encode() for i in range(10)],
                                  partition=p)
    stream = (spark.readStream.format("nsq").option("lookupd", nsq.lookupd)
              .option("topic", "spark_some").option("partitions", "0,2")
              .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "8")
              .load())
    query = (stream.writeStream.format("memory").queryName("spark_some")
             .option("checkpointLocation", str(tmp_path / "some"))
             .trigger(processingTime="0 seconds").start())
    try:
        query.processAllAvailable()
        source = query.lastProgress["sources"][0]
    finally:
        query.stop()
    rows = spark.sql("SELECT partition, body FROM spark_some").collect()
    assert sorted(r.body for r in rows) == sorted(f"{p}-{i}".encode() for p in (0, 2)
                                                  for i in range(10))
    # the queue ends, for the lag: beside endOffset in the progress
    latest = json.loads(source["latestOffset"])
    assert set(latest["spark_some"]) == {"0", "2"}
    assert latest == json.loads(source["endOffset"])  # all read: no lag


def test_sink_stores_the_sharding_key_in_a_header(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_keyed", partitions=2, ext=True)
    rows = [(f"user-{i % 3}", f"k{i}".encode()) for i in range(12)]
    df = spark.createDataFrame(rows, "user STRING, body BINARY")
    (df.write.format("nsq").option("lookupd", nsq.lookupd).option("topic", "spark_keyed")
     .option("shardingKeyColumn", "user").option("keyHeader", "key").mode("append").save())
    got = read_topic(spark, nsq, "spark_keyed")
    assert sorted((r.headers["key"], r.body) for r in got) == sorted(rows)
    for row in got:
        assert row.partition == murmur3_partition(row.headers["key"], 2)
    # the key is also the source's `key` column (Kafka's), from the header keyHeader names
    assert sorted((r.key, r.body) for r in got) == sorted(rows)
    other = read_topic(spark, nsq, "spark_keyed", keyHeader="absent")
    assert {r.key for r in other} == {None}


def _publish_numbered(nsq: Any, topic: str, partitions: int, per_partition: int) -> list[bytes]:
    sent = []
    with make_producer(nsq) as producer:
        for p in range(partitions):
            for first in range(0, per_partition, 500):
                bodies = [f"{p}|{i}".encode()
                          for i in range(first, min(first + 500, per_partition))]
                producer.publish_many(topic, bodies, partition=p)
                sent.extend(bodies)
    return sent


def _check_partition_order(rows: list[Any]) -> None:
    """Each NSQ partition's rows: unique offsets, contiguous, in publish order."""
    by_partition: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_partition[row.partition].append(row)
    for part_rows in by_partition.values():
        part_rows.sort(key=lambda r: r.queue_offset)
        for a, b in itertools.pairwise(part_rows):
            assert b.queue_offset == a.queue_offset + a.raw_size  # no gap, no duplicate
        numbers = [int(r.body.split(b"|")[1]) for r in part_rows]
        assert numbers == list(range(len(numbers)))


def test_min_partitions_splits_ranges_without_gap_or_duplicate(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_minparts", partitions=2)
    sent = _publish_numbered(nsq, "spark_minparts", 2, 300)
    df = (spark.read.format("nsq").option("lookupd", nsq.lookupd)
          .option("topic", "spark_minparts").option("minPartitions", "7").load())
    assert df.rdd.getNumPartitions() >= 7
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(sent)
    _check_partition_order(rows)


def test_ordered_range_is_read_over_several_channels_in_order(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_ordered_fan", partitions=2, ordered=True)
    sent = _publish_numbered(nsq, "spark_ordered_fan", 2, 1200)
    df = (spark.read.format("nsq").option("lookupd", nsq.lookupd)
          .option("topic", "spark_ordered_fan").option("orderedReadChannels", "4").load())
    assert df.rdd.getNumPartitions() == 2  # one task per partition, pieces read inside it
    per_task = df.rdd.glom().map(
        lambda rows: [(r.partition, r.queue_offset) for r in rows]).collect()
    for offsets in per_task:
        assert offsets == sorted(offsets)  # a task yields its pieces in queue order
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(sent)
    _check_partition_order(rows)


def test_fail_on_data_loss_in_a_stream(spark: Any, nsq: Any, tmp_path: Any) -> None:
    """Retention removed messages the query had not read: the restarted query fails with
    DataLoss (default), or with failOnDataLoss=false skips them and reads the rest."""
    from test_spark_units import _trim

    nsq.create_topic("spark_loss", partitions=1)
    sent = _publish_numbered(nsq, "spark_loss", 1, 30)

    def run(fail: str) -> None:
        query = (spark.readStream.format("nsq").option("lookupd", nsq.lookupd)
                 .option("topic", "spark_loss").option("startingOffsets", "earliest")
                 .option("failOnDataLoss", fail).load()
                 .writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(WAIT)

    run("true")  # all 30 read and committed
    more = [f"0|{i}".encode() for i in range(30, 50)]
    with make_producer(nsq) as producer:
        producer.publish_many("spark_loss", more, partition=0)
    _trim(nsq, "spark_loss", 0, 40)  # 10 messages the query had not read are gone
    with pytest.raises(Exception, match=r"DataLoss|no longer in the queue"):
        run("true")
    run("false")  # skips the 10, reads the 10 retained
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.body for r in rows) == sorted(sent + more[10:])


def test_kafka_names_sink_columns_and_a_pattern_read(spark: Any, nsq: Any) -> None:
    nsq.create_topic("spark_kafka_a", partitions=2)
    nsq.create_topic("spark_kafka_b", partitions=1)
    rows = [("spark_kafka_a" if i % 3 else "spark_kafka_b", f"k{i % 5}", f"v{i}".encode())
            for i in range(30)]
    df = spark.createDataFrame(rows, "topic STRING, key STRING, value BINARY")
    df.write.format("nsq").option("lookupd", nsq.lookupd).mode("append").save()  # no options
    got = (spark.read.format("nsq").option("lookupd", nsq.lookupd)
           .option("subscribePattern", "spark_kafka_.*")
           .option("startingOffsets", '{"spark_kafka_a": {"0": -2, "1": -2}}')
           .option("endingOffsets", '{"spark_kafka_b": {"0": -1}}').load().collect())
    assert sorted((r.topic, r.body) for r in got) == sorted((t, v) for t, _, v in rows)
    for row in got:
        if row.topic == "spark_kafka_a":
            key = next(k for t, k, v in rows if v == row.body)
            assert row.partition == murmur3_partition(key, 2)
