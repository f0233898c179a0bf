"""Bounded Spark reads that select nothing, on the dev cluster and on the real youzan servers.

The queue bounds of an empty partition and the leader's timestamp search are the server's,
so the empty reads are checked against both: an empty topic, ``startingOffsets=latest``, and
an end timestamp before the first message are each an empty DataFrame with the source's
schema (as an empty Kafka offset range is), not a failed task. One test: a SparkSession is
slow to start.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import bounded, fresh_name

from smartnsq import Producer

pytestmark = pytest.mark.spark

HAVE_SPARK = all(importlib.util.find_spec(m) is not None for m in ("pyspark", "pyarrow"))
SPARK_WAIT = 180.0  # a JVM on a shared 2-core machine; nothing waits this long when it works


@pytest.fixture(scope="module")
def spark_session() -> Iterator[Any]:
    """A local SparkSession for this module (tests/spark's settings), stopped after it."""
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[spark]')")
    from smartnsq.testing.spark import local_session

    session = local_session("smartnsq-tests-edges-both")
    try:
        yield session
    finally:
        session.stop()


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
