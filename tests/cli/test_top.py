"""``smartnsq top``: the ``--json`` one-shot as a subprocess against a dev cluster
(the cluster keeps serving on the test's loop while the command runs), and the live table
drawn in place (``--count``), in-process."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support import bounded

from smartnsq import Producer
from smartnsq.cli import main

ROOT = Path(__file__).resolve().parents[2]


async def load(cluster: Any, topic: str, per_partition: dict[int, int]) -> None:
    await cluster.create_topic(topic, partitions=len(per_partition), channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=10) as producer:
        for partition, count in per_partition.items():
            async with bounded(10):
                await producer.publish_many(topic, [b"m"] * count, partition=partition)


async def test_json_one_shot_in_a_subprocess(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    await load(cluster, "topt", {0: 3, 1: 5})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SMARTNSQ_LOOKUPD", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "top", "topt", "--json", "--interval", "0.2",
        "--lookupd", cluster.lookupd_http_addresses[0],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    rows = [json.loads(line) for line in out.decode().splitlines()]
    channels = {r["partition"]: r for r in rows if r["channel"] == "ch"}
    assert sorted(channels) == [0, 1]
    assert (channels[0]["depth"], channels[1]["depth"]) == (3, 5)
    assert all(r["in_flight"] == 0 and r["clients"] == 0 for r in channels.values())
    # the node asked, named as `smartnsq lookup` names it ("leader http")
    assert {r["leader_http"] for r in rows} <= set(cluster.nsqd_http_addresses)
    assert all(r["pub_rate"] == 0 and r["out_rate"] == 0 for r in channels.values())
    topics = {r["partition"]: r for r in rows if r["channel"] is None}
    assert sorted(topics) == [0, 1]  # each partition once: its leader
    # a youzan node's topic "depth" is the partition's queue in bytes, not messages waiting
    # (tests/fixtures/youzan/http_nsqd_stats_json_topic_v1.txt: 240 for 6 messages)
    assert all(r["depth"] is None for r in topics.values())
    assert topics[1]["queue_bytes"] > topics[0]["queue_bytes"] > 0
    assert (topics[0]["messages"], topics[1]["messages"]) == (3, 5)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_json_classic_topic_depth_is_messages(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    await cluster.create_topic("toptc", channels=[])  # no channel: messages wait in the topic
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=10) as producer, \
            bounded(10):
        await producer.publish_many("toptc", [b"m"] * 4)
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(
        main, ["top", "toptc", "--json", "--interval", "0", "--lookupd",
               cluster.lookupd_http_addresses[0]], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    [row] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (row["channel"], row["depth"], row["queue_bytes"]) == (None, 4, None)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_live_table_is_drawn_in_place(nsq_cluster: Any) -> None:
    await load(nsq_cluster, "toplive", {0: 2})
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(
        main, ["top", "--count", "2", "--interval", "0.1", "--lookupd",
               nsq_cluster.lookupd_http_addresses[0]], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    screens = out.getvalue().split("\x1b[H\x1b[2J")[1:]
    assert len(screens) == 2
    assert "toplive" in screens[1] and "pub/s" in screens[1]
    assert "0.0" in screens[1]  # the second screen has rates


async def test_usage_errors_are_one_line() -> None:
    err = io.StringIO()
    code = await asyncio.to_thread(main, ["top"], stdout=io.StringIO(), stderr=err)
    assert code != 0 and len(err.getvalue().strip().splitlines()) == 1


def _channel_row(messages: int, depth: int, in_flight: int = 0, deferred: int = 0
                 ) -> dict[str, Any]:
    return {"messages": messages, "depth": depth, "in_flight": in_flight,
            "deferred": deferred}


def test_out_rate_counts_what_left_the_channel_not_what_entered() -> None:
    """A channel nobody reads: ten messages entered in the second and all wait (depth 10).
    What left it is 0/s; messages_count alone would say 10/s."""
    from smartnsq.cli.top import _rates

    topic_key = ("t", 0, None)
    before = {topic_key: {"messages": 0}, ("t", 0, "idle"): _channel_row(0, 0),
              ("t", 0, "busy"): _channel_row(0, 0)}
    now = {topic_key: {"messages": 10}, ("t", 0, "idle"): _channel_row(10, 10),
           ("t", 0, "busy"): _channel_row(10, 2, in_flight=3)}
    _rates(now, before, 1.0)
    assert now[("t", 0, "idle")]["out_rate"] == 0
    assert now[("t", 0, "busy")]["out_rate"] == 5  # 10 in, 2 waiting, 3 in flight
    assert now[("t", 0, "idle")]["pub_rate"] == 10
