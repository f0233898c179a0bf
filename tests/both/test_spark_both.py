"""The Spark connector (``format("nsq")``) on the dev cluster and on the real youzan servers.

A small batch read of a topic published by a ``Producer``, and a small batch write through the
sink checked by a ``Consumer``, and bounded reads that select nothing (an empty topic,
``latest``, timestamps outside the messages: an empty DataFrame with the source's schema, as
an empty Kafka offset range is; the queue bounds and the timestamp search are the server's).
Bodies compressed as youzan/go-nsq's producers compress them read back as the originals; a
start offset inside a message is refused (the real nsqd's setoffset moves such a channel on
to the next message, so only the server tells it from a gap); a lookupd option naming a
dead port or nsqd's TCP port is refused at once, naming the address; Kafka's millisecond
timestamps select inside a second (the server searches by the second).
Spark's Python workers are other processes: they reach either
cluster over loopback. The Spark calls block, so they run in a thread while the test's event
loop keeps serving the dev cluster. One test each: a SparkSession is slow.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from typing import Any

import pytest
import spark_support
from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.message import Message
from smartnsq.model.sharding import murmur3_partition
from smartnsq.protocol import body_compression

pytestmark = pytest.mark.spark

HAVE_SPARK = spark_support.HAVE_SPARK
SPARK_WAIT = 180.0  # a JVM on a shared 2-core machine; nothing waits this long when it works


spark_session = spark_support.spark_session  # this module's SparkSession


async def test_spark_reads_a_topic(nsq_any_cluster: Any, spark_session: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("spark-read")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    bodies = [b"row-%d" % i for i in range(20)]
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for i, body in enumerate(bodies):
            async with bounded(10):
                await producer.publish(topic, body, partition=i % 2, timeout=10)
    lookupd = ",".join(cluster.lookupd_http_addresses)

    def read() -> list[Any]:
        frame = (spark_session.read.format("nsq").option("lookupd", lookupd)
                 .option("topic", topic).load())
        return list(frame.collect())

    rows = await asyncio.wait_for(asyncio.to_thread(read), SPARK_WAIT)
    assert sorted(bytes(r.body) for r in rows) == sorted(bodies)
    for row in rows:
        assert row.topic == topic and row.partition == int(bytes(row.body)[4:]) % 2, row
        assert row.raw_size > 0


async def test_spark_writes_a_topic(nsq_any_cluster: Any, spark_session: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("spark-write")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    rows = [(f"user-{i % 5}", b"event-%d" % i) for i in range(30)]
    lookupd = ",".join(cluster.lookupd_http_addresses)

    def write() -> None:
        frame = spark_session.createDataFrame(rows, "key STRING, body BINARY").repartition(2)
        (frame.write.format("nsq").option("lookupd", lookupd).option("topic", topic)
         .option("shardingKeyColumn", "key").mode("append").save())

    await asyncio.wait_for(asyncio.to_thread(write), SPARK_WAIT)
    got: dict[bytes, int] = {}
    watch = Watch()

    def handle(message: Message) -> None:
        assert message.internal_id is not None
        got[bytes(message.body)] = message.internal_id >> 50  # youzan: the partition's bits
        watch.poke()

    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle)
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: len(got) >= len(rows), 30, f"{len(rows)} messages")
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    assert sorted(got) == sorted(body for _, body in rows)
    key_of = {body: key for key, body in rows}
    for body, partition in got.items():  # routed as the Producer routes a sharding key
        assert partition == murmur3_partition(key_of[body], 2), body


async def test_spark_reads_selecting_nothing_are_empty_frames(nsq_any_cluster: Any,
                                                              spark_session: Any) -> None:
    from smartnsq.spark import read_schema

    cluster = nsq_any_cluster
    topic = fresh_name("spark-empty")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    lookupd = ",".join(cluster.lookupd_http_addresses)

    def read(**options: str) -> tuple[list[Any], Any]:
        reader = spark_session.read.format("nsq").option("lookupd", lookupd) \
            .option("topic", topic)
        for key, value in options.items():
            reader = reader.option(key, value)
        frame = reader.load()
        return list(frame.collect()), frame.schema

    async def rows_of(**options: str) -> list[Any]:
        rows, schema = await asyncio.wait_for(asyncio.to_thread(read, **options), SPARK_WAIT)
        assert schema == read_schema(), options
        return rows

    hour_ago = int(time.time()) - 3600
    assert await rows_of() == []  # nothing published yet
    assert await rows_of(endingOffsets=f"timestamp:{hour_ago}") == []  # searched, empty
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for i in range(4):
            async with bounded(10):
                await producer.publish(topic, b"row-%d" % i, partition=i % 2, timeout=10)
    assert await rows_of(startingOffsets="latest") == []
    assert await rows_of(endingOffsets=f"timestamp:{hour_ago}") == []
    hour_ahead = int(time.time()) + 3600  # after the last message: the start is the end
    assert await rows_of(startingOffsets=f"timestamp:{hour_ahead}") == []
    assert len(await rows_of()) == 4  # the same topic, read whole


COMPRESSIBLE = b'{"order": 42, "lines": [' + b'{"sku": "abc", "qty": 1}, ' * 500 + b"]}"
GO_CODECS: tuple[body_compression.BodyCodec, ...] = ("gzip", "snappy", "lz4")


def _load(spark: Any, lookupd: str, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("nsq").option("lookupd", lookupd).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return list(reader.load().collect())


async def _failure(call: Any, *args: Any, **options: str) -> str:
    """The text of the exception a Spark read raises (it must raise)."""
    def run() -> str:
        try:
            call(*args, **options)
        except Exception as exc:
            return str(exc)
        raise AssertionError(f"the read succeeded: {options}")

    return await asyncio.wait_for(asyncio.to_thread(run), SPARK_WAIT)


async def test_spark_reads_bodies_compressed_by_go_producers_as_the_originals(
        nsq_any_cluster: Any, spark_session: Any) -> None:
    """go-nsq's client-side compression (gzip, snappy, lz4 marked in the ext header): rows
    carry the original body and the producer's own headers, without the two marks; a mark
    that cannot be honoured fails the read naming the message's place."""
    cluster = nsq_any_cluster
    topic = fresh_name("spark-zip")
    bad = fresh_name("spark-zipbad")
    for name in (topic, bad):
        await cluster.create_topic(name, partitions=1, replicas=1, ext=True, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for codec in GO_CODECS:
            packed = body_compression.compress(codec, COMPRESSIBLE)
            assert packed is not None
            async with bounded(10):
                await producer.publish(topic, packed[0], partition=0, timeout=10,
                                       headers={**packed[1], "codec": codec, "key": "k1"})
        async with bounded(10):
            await producer.publish(topic, b"plain", partition=0, timeout=10,
                                   headers={"codec": "none"})
            await producer.publish(bad, b"plain", partition=0, timeout=10)
            await producer.publish(bad, b"not gzip at all", partition=0, timeout=10,
                                   headers={body_compression.CODEC_HEADER: "1",
                                            body_compression.SIZE_HEADER: "100"})
    lookupd = ",".join(cluster.lookupd_http_addresses)
    rows = await asyncio.wait_for(asyncio.to_thread(_load, spark_session, lookupd, topic),
                                  SPARK_WAIT)
    by_codec = {row.headers["codec"]: row for row in rows}
    assert sorted(by_codec) == sorted([*GO_CODECS, "none"])
    for codec in GO_CODECS:
        row = by_codec[codec]
        assert bytes(row.body) == COMPRESSIBLE, codec
        assert row.headers == {"codec": codec, "key": "k1"} and row.key == "k1"
        assert row.raw_size < len(COMPRESSIBLE)  # the queue holds the compressed bytes
    assert bytes(by_codec["none"].body) == b"plain"
    # never a silently wrong row: the task fails, naming topic, partition and offset
    text = await _failure(_load, spark_session, lookupd, bad)
    assert f"{bad}/0 at queue offset " in text and "cannot be decoded" in text, text
    assert "gzip body corrupt" in text, text
    small = await _failure(_load, spark_session, lookupd, topic, maxDecompressedSize="1000")
    assert "over the 1000-byte limit" in small and "maxDecompressedSize" in small, small


async def test_spark_refuses_a_start_offset_inside_a_message(nsq_any_cluster: Any,
                                                             spark_session: Any) -> None:
    """The real nsqd moves a channel set inside a message on to the next message: read from
    there, the message would be lost (and, with failOnDataLoss=false, silently). Refused on
    the driver, naming the next boundary, whatever failOnDataLoss says."""
    cluster = nsq_any_cluster
    topic = fresh_name("spark-inside")
    await cluster.create_topic(topic, partitions=1, replicas=1, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for i in range(5):
            async with bounded(10):
                await producer.publish(topic, b"m%d" % i, partition=0, timeout=10)
    lookupd = ",".join(cluster.lookupd_http_addresses)
    rows = sorted(await asyncio.wait_for(asyncio.to_thread(_load, spark_session, lookupd,
                                                           topic), SPARK_WAIT),
                  key=lambda r: r.queue_offset)
    assert [bytes(r.body) for r in rows] == [b"m%d" % i for i in range(5)]
    inside, after = rows[2].queue_offset + 1, rows[3].queue_offset
    end = rows[4].queue_offset + rows[4].raw_size

    def offsets(offset: int) -> str:
        return json.dumps({topic: {"0": offset}})

    for lenient in ("true", "false"):
        text = await _failure(_load, spark_session, lookupd, topic,
                              startingOffsets=offsets(inside), failOnDataLoss=lenient)
        assert "InvalidArgument" in text and "startingOffsets" in text, text
        assert (f"offset {inside} of {topic}/0 is inside a message (the next message starts "
                f"at {after})") in text, text
    last = await _failure(_load, spark_session, lookupd, topic,
                          startingOffsets=offsets(end - 1))  # inside the last message
    assert f"the next message starts at {end}" in last, last
    ending = await _failure(_load, spark_session, lookupd, topic, endingOffsets=offsets(inside))
    assert "endingOffsets" in ending and "inside a message" in ending, ending
    got = await asyncio.wait_for(asyncio.to_thread(_load, spark_session, lookupd, topic,
                                                   startingOffsets=offsets(after)), SPARK_WAIT)
    assert [bytes(r.body) for r in got] == [b"m3", b"m4"]  # on a boundary: nothing skipped


def _dead_port() -> str:
    with socket.socket() as sock:  # bound and closed again: nothing listens there now
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_spark_refuses_a_lookupd_option_naming_no_lookupd(nsq_any_cluster: Any,
                                                               spark_session: Any) -> None:
    """A dead port, or nsqd's TCP port (it answers HTTP with E_BAD_PROTOCOL): refused within
    seconds naming the address, not waited on for leaderTimeout as a leader change."""
    cluster = nsq_any_cluster
    topic = fresh_name("spark-nolookupd")
    await cluster.create_topic(topic, partitions=1, replicas=1, channels=["ch"])
    for wrong in (cluster.nsqd_tcp_addresses[0], _dead_port()):
        began = time.monotonic()
        text = await _failure(_load, spark_session, wrong, topic)
        assert f"lookupd at {wrong} does not answer" in text, text
        assert "no usable leader" not in text, text
        assert time.monotonic() - began < 60, text  # JVM time included; was 120 s + it


async def test_spark_kafka_millisecond_timestamps_select_inside_a_second(
        nsq_any_cluster: Any, spark_session: Any) -> None:
    """Kafka's timestamp options take milliseconds, and the server searches by the second:
    the messages of the second before the time are read past, on the real search too."""
    cluster = nsq_any_cluster
    topic = fresh_name("spark-kafka-ms")
    await cluster.create_topic(topic, partitions=1, replicas=1, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for i in range(50):
            async with bounded(10):
                await producer.publish(topic, b"ms-%d" % i, partition=0, timeout=10)
            await asyncio.sleep(0.03)
    lookupd = ",".join(cluster.lookupd_http_addresses)

    def ms(row: Any) -> int:
        return int(row.timestamp.timestamp() * 1_000_000) // 1000

    every = sorted(await asyncio.wait_for(asyncio.to_thread(
        _load, spark_session, lookupd, topic), SPARK_WAIT), key=lambda r: r.queue_offset)
    pick = next(r for prev, r in itertools.pairwise(every)
                if ms(prev) // 1000 == ms(r) // 1000 and ms(prev) < ms(r))
    rows = await asyncio.wait_for(asyncio.to_thread(
        _load, spark_session, lookupd, topic, startingTimestamp=str(ms(pick)),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": ms(every[-3])}})), SPARK_WAIT)
    assert [bytes(r.body) for r in sorted(rows, key=lambda r: r.queue_offset)] == \
        [bytes(r.body) for r in every if ms(pick) <= ms(r) < ms(every[-3])]
