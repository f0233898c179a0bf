"""The Spark connector (``format("nsq")``) on the dev cluster and on the real youzan servers.

A small batch read of a topic published by a ``Producer``, and a small batch write through the
sink checked by a ``Consumer``, and bounded reads that select nothing (an empty topic,
``latest``, timestamps outside the messages: an empty DataFrame with the source's schema, as
an empty Kafka offset range is; the queue bounds and the timestamp search are the server's).
Spark's Python workers are other processes: they reach either
cluster over loopback. The Spark calls block, so they run in a thread while the test's event
loop keeps serving the dev cluster. One test each: a SparkSession is slow.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.message import Message
from smartnsq.model.sharding import murmur3_partition

pytestmark = pytest.mark.spark

HAVE_SPARK = all(importlib.util.find_spec(m) is not None for m in ("pyspark", "pyarrow"))
SPARK_WAIT = 180.0  # a JVM on a shared 2-core machine; nothing waits this long when it works


@pytest.fixture(scope="module")
def spark_session() -> Iterator[Any]:
    """A local SparkSession for this module (tests/spark's settings), stopped after it."""
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[spark]')")
    from smartnsq.testing.spark import local_session

    session = local_session("smartnsq-tests-both")
    try:
        yield session
    finally:
        session.stop()


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
