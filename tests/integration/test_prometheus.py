"""The Prometheus collector: names, labels and values read from the clients'
snapshots at scrape time, over real HTTP, on the dev cluster and the real servers; and
``examples/prometheus_metrics.py`` run as CI runs it. Skipped without the ``prometheus`` extra."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import Watch, bounded, settled_lag

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import smartnsq.observability.prometheus  # noqa: E402
from smartnsq import Consumer, Producer  # noqa: E402
from smartnsq.message import Message  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_a_scrape_exports_the_snapshots(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    await cluster.create_topic("pm", partitions=2, channels=["ch"])
    watch = Watch()
    got: list[Message] = []

    def handler(msg: Message) -> None:
        got.append(msg)
        watch.poke()

    registry = prometheus_client.CollectorRegistry()
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1",
                                                         registry=registry)
    try:
        async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=10) as producer, \
                Consumer("pm", "ch", lookupd=cluster.lookupd_http_addresses,
                         handler=handler, reconnect_delay=0.05) as consumer:
            collector = smartnsq.observability.prometheus.register(producer, consumer,
                                                                   registry=registry)
            for i in range(6):
                async with bounded(10):
                    await producer.publish("pm", b"%d" % i, partition=i % 2)
            await watch.until(lambda: len(got) == 6)
            await settled_lag(consumer)
            samples = await asyncio.to_thread(scrape, server.server_port)
            registry.unregister(collector)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    for p in ("0", "1"):
        producer_labels = {"client": "producer", "topic": "pm", "partition": p}
        assert value("smartnsq_producer_published_messages_total", **producer_labels) == 3
        assert value("smartnsq_producer_publish_seconds_count", **producer_labels) == 3
        assert value("smartnsq_producer_publish_seconds_bucket", le="+Inf",
                     **producer_labels) == 3
        consumer_labels = {"client": "consumer", "topic": "pm", "channel": "ch", "partition": p}
        assert value("smartnsq_consumer_received_messages_total", **consumer_labels) == 3
        assert value("smartnsq_consumer_in_flight_messages", **consumer_labels) in (0, 1)
        assert value("smartnsq_consumer_connected", **consumer_labels) == 1
    depth = [v for (name, _), v in samples.items() if name == "smartnsq_channel_depth_messages"]
    assert depth == [0, 0]
    assert value("smartnsq_lookup_rounds_total", client="producer") >= 1
    assert value("smartnsq_producer_connections", client="producer") >= 1
    # conventions: counters end in _total, latencies are _seconds histograms
    names = {name for name, _ in samples}
    assert all(n.startswith("smartnsq_") for n in names)
    assert "smartnsq_consumer_handler_seconds_count" in names


def test_the_example_serves_and_exits() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "prometheus_metrics.py")],
                          capture_output=True, text=True, timeout=180, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "smartnsq_consumer_finished_messages_total" in done.stdout
    assert "smartnsq_channel_depth_messages" in done.stdout
