"""``maxMessagesPerTrigger`` on the dev cluster and on the real youzan servers.

The driver finds where a limited micro-batch ends from the leader's message numbers
(``/message/get?search_mode=count`` and ``virtual_offset``: ``smartnsq.spark.limits``), not by
reading the range; how the server numbers messages is the server's, so the same body runs on
both: messages published by MPUB (one commit-log entry each, which a share cuts in the
middle) are planned into batches of exactly the limit, contiguous, each message once, with no
range read to plan (a server whose numbers did not answer would cost a read, counted here).
The planner is driven directly (no SparkSession: nothing here is Spark's); its calls block, so
they run in a thread while the test's event loop keeps serving the dev cluster.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest
from support import bounded, fresh_name

from smartnsq import Producer

pytestmark = pytest.mark.spark

HAVE_SPARK = all(importlib.util.find_spec(m) is not None for m in ("pyspark", "pyarrow"))
LIMIT = 100


def _reader(lookupd: str, topic: str) -> Any:
    from smartnsq.spark.options import SourceOptions
    from smartnsq.spark.source import NSQStreamReader

    return NSQStreamReader(SourceOptions.parse({"lookupd": lookupd, "topic": topic,
                                                "startingOffsets": "earliest",
                                                "maxMessagesPerTrigger": str(LIMIT)},
                                               streaming=True))


def _rows(reader: Any, start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
    from smartnsq.spark.source import _read

    return [row for part in reader.partitions(start, end)
            for batch in _read(reader._options, part) for row in batch.to_pylist()]


def _from_the_middle(lookupd: str, topic: str, start: dict[str, Any],
                     at: dict[tuple[int, int], bytes]) -> tuple[int, int, list[bytes]]:
    """A fresh reader (a restart) planning one batch from offsets it has no count for:
    (its rows, range reads to plan, the bodies that should follow ``start``)."""
    reader = _reader(lookupd, topic)
    try:
        end = reader.latestOffset(start, None)
        rows = _rows(reader, start, end)
        for pid in (0, 1):
            mine = [r for r in rows if r["partition"] == pid]
            ends = [start[topic][str(pid)]] + [r["queue_offset"] + r["raw_size"] for r in mine]
            assert [r["queue_offset"] for r in mine] == ends[:-1]
            assert end[topic][str(pid)] == ends[-1]
            assert [r["body"] for r in mine] == [at[(pid, r["queue_offset"])] for r in mine]
        return len(rows), reader._ends.reads, [r["body"] for r in rows]
    finally:
        reader.stop()


def _drain(lookupd: str, topic: str, bodies: dict[int, list[bytes]]) \
        -> tuple[int, int, int, dict[tuple[int, int], bytes]]:
    """(batches, range reads to plan, messages read, body by partition and queue offset),
    every batch's rows checked."""
    reader = _reader(lookupd, topic)
    at: dict[tuple[int, int], bytes] = {}
    try:
        start = reader.initialOffset()
        read: dict[int, list[bytes]] = {p: [] for p in bodies}
        left, batches = sum(len(b) for b in bodies.values()), 0
        while left:
            end = reader.latestOffset(start, None)
            rows = _rows(reader, start, end)
            at.update(((r["partition"], r["queue_offset"]), r["body"]) for r in rows)
            assert len(rows) == min(LIMIT, left), (batches, len(rows), left)
            for pid in bodies:
                mine = [r for r in rows if r["partition"] == pid]
                ends = [start[topic][str(pid)]] + [r["queue_offset"] + r["raw_size"]
                                                   for r in mine]
                assert [r["queue_offset"] for r in mine] == ends[:-1]  # contiguous
                assert end[topic][str(pid)] == ends[-1]
                read[pid] += [r["body"] for r in mine]
            left -= len(rows)
            batches += 1
            start = end
        assert reader.latestOffset(start, None) == start
        assert read == bodies  # each message once, in queue order
        return batches, reader._ends.reads, sum(len(b) for b in read.values()), at
    finally:
        reader.stop()


async def test_limited_batches_are_planned_from_the_leaders_message_numbers(
        nsq_any_cluster: Any) -> None:
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[spark]')")
    cluster = nsq_any_cluster
    topic = fresh_name("spark-limit")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    bodies = {0: [b"p0-%d" % i for i in range(330)], 1: [b"p1-%d" % i for i in range(150)]}
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for pid, mine in bodies.items():
            for first in range(0, len(mine), 150):
                async with bounded(10):
                    await producer.publish_many(topic, mine[first:first + 150],
                                                partition=pid, timeout=10)
    lookupd = ",".join(cluster.lookupd_http_addresses)
    batches, reads, total, at = await asyncio.wait_for(
        asyncio.to_thread(_drain, lookupd, topic, bodies), 120)
    assert (batches, total) == (5, 480)
    assert reads == 0  # every end from the message numbers: no range read to plan
    # a restart from offsets inside MPUB entries: the counts there are asked of the leader
    middle = {pid: next(o for (p, o), body in at.items() if body == b"p%d-7" % pid)
              for pid in (0, 1)}
    count, reads, _ = await asyncio.wait_for(asyncio.to_thread(
        _from_the_middle, lookupd, topic, {topic: {str(p): o for p, o in middle.items()}},
        at), 120)
    assert (count, reads) == (LIMIT, 0)
