"""OpenTelemetry's messaging metrics over real sockets, read with the SDK's
``InMemoryMetricReader``: the observable counters equal what ``stats()`` says, per partition;
the sampled duration histograms carry the conventions' units and attributes; failures carry
``error.type``; closed clients stop reporting; the global switch and the blocking facade.
Skipped without the ``otel`` extra's SDK."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import BackgroundCluster, Watch, bounded, fresh_name

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import smartnsq.observability.otel
from smartnsq import Consumer, Producer, sync
from smartnsq.errors import NSQError
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.observability.otel_metrics import DURATION_BOUNDS

SENT = "messaging.client.sent.messages"
CONSUMED = "messaging.client.consumed.messages"
OPERATION = "messaging.client.operation.duration"
PROCESS = "messaging.process.duration"
FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5}
WAIT = 30.0


@pytest.fixture
def metrics() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def collect(reader: InMemoryMetricReader) -> dict[str, Any]:
    """name -> the metric (name, unit, data) of one collection."""
    data = reader.get_metrics_data()
    found: dict[str, Any] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = metric
    return found


def points(found: dict[str, Any], name: str, topic: str) -> list[Any]:
    metric = found.get(name)
    if metric is None:
        return []
    return [p for p in metric.data.data_points
            if p.attributes.get("messaging.destination.name") == topic]


def by_partition(pts: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pts:
        if "error.type" not in p.attributes:
            key = p.attributes["messaging.destination.partition.id"]
            out[key] = out.get(key, 0) + p.value
    return out


async def test_sent_and_consumed_equal_the_stats_and_the_histograms_are_there(
        nsq_any_cluster: Any, metrics: Any) -> None:
    provider, reader = metrics
    topic, count = fresh_name("ometric"), 40
    await nsq_any_cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        meter_provider=provider) as producer:
        for i in range(count):
            async with bounded(10):
                await producer.publish(topic, b"m%d" % i, partition=i % 2, timeout=10)
        stats = producer.stats()
        found = collect(reader)
    sent = points(found, SENT, topic)
    assert found[SENT].unit == "{message}"
    assert sum(p.value for p in sent) == count
    assert by_partition(sent) == {
        str(p.partition): p.published for p in stats.topic(topic)} == {"0": 20, "1": 20}
    for p in sent:
        assert p.attributes["messaging.system"] == "nsq"
        assert p.attributes["messaging.operation.name"] == "publish"
        assert p.attributes["messaging.operation.type"] == "send"
        assert p.attributes["messaging.client.id"].startswith("producer-")
    durations = points(found, OPERATION, topic)
    assert found[OPERATION].unit == "s"
    # each partition's first PUBLISH_SAMPLE (32) calls are all timed: 20 each here
    assert sorted((p.attributes["messaging.destination.partition.id"], p.count)
                  for p in durations) == [("0", 20), ("1", 20)]
    assert all(p.attributes["messaging.operation.name"] == "publish" and p.sum > 0
               and "messaging.client.id" not in p.attributes
               and tuple(p.explicit_bounds) == DURATION_BOUNDS for p in durations)
    assert not points(collect(reader), SENT, topic)  # closed: its series stopped

    got: list[Message] = []
    watch = Watch()

    async def handle(message: Message) -> None:
        got.append(message)
        watch.poke()

    async with Consumer(topic, "ch", lookupd=nsq_any_cluster.lookupd_http_addresses,
                        handler=handle, meter_provider=provider, **FAST) as consumer:
        await watch.until(lambda: len(got) >= count, WAIT, f"{count} messages")
        cstats = consumer.stats()
        found = collect(reader)
    consumed = points(found, CONSUMED, topic)
    assert found[CONSUMED].unit == "{message}"
    assert sum(p.value for p in consumed) == count == cstats.received
    assert by_partition(consumed) == {str(p.partition): p.received for p in cstats.partitions}
    assert all(p.attributes["messaging.consumer.group.name"] == "ch"
               and p.attributes["messaging.operation.type"] == "receive" for p in consumed)
    process = points(found, PROCESS, topic)
    assert found[PROCESS].unit == "s"
    assert sum(p.count for p in process) == count  # under HANDLER_SAMPLE: all timed
    assert {p.attributes["messaging.destination.partition.id"] for p in process} == {"0", "1"}
    assert all(p.attributes["messaging.operation.name"] == "process"
               and p.attributes["messaging.destination.subscription.name"] == "ch"
               and "error.type" not in p.attributes for p in process)
    assert not points(collect(reader), CONSUMED, topic)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_failures_carry_error_type(nsq_cluster: Any, metrics: Any) -> None:
    provider, reader = metrics
    await nsq_cluster.create_topic("ofail", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses,
                        meter_provider=provider) as producer:
        with pytest.raises(NSQError):
            async with bounded(5):
                await producer.publish("onowhere", b"x", timeout=1)
        await producer.publish("ofail", b"flaky")
        [(reason, n)] = producer.stats().failed.items()
        found = collect(reader)
    [failed] = [p for p in points(found, SENT, "onowhere") if "error.type" in p.attributes]
    assert failed.attributes["error.type"] == reason and failed.value == n == 1

    seen: dict[bytes, int] = {}
    watch = Watch()

    def handler(message: Message) -> None:
        seen[message.body] = seen.get(message.body, 0) + 1
        watch.poke()
        if seen[message.body] == 1:
            raise RuntimeError("not yet")

    async with Consumer("ofail", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, meter_provider=provider,
                        backoff_policy=BackoffPolicy(enabled=False),
                        requeue_policy=RequeuePolicy(initial=0.0, cap=0.0), **FAST):
        await watch.until(lambda: seen.get(b"flaky") == 2)
        found = collect(reader)
    process = points(found, PROCESS, "ofail")
    assert sorted(((p.attributes.get("error.type"), p.count) for p in process),
                  key=str) == [("RuntimeError", 1), (None, 1)]
    [consumed] = points(found, CONSUMED, "ofail")
    assert consumed.value == 2  # each delivery counts
    assert "error.type" not in consumed.attributes


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_instrument_meters_clients_created_afterwards(nsq_cluster: Any,
                                                            metrics: Any) -> None:
    provider, reader = metrics
    await nsq_cluster.create_topic("oglob", channels=["ch"])
    smartnsq.observability.otel.instrument(meter_provider=provider, tracing=False)
    try:
        assert not smartnsq.observability.otel.enabled()  # tracing stays off
        metered = Producer(lookupd=nsq_cluster.lookupd_http_addresses)
    finally:
        smartnsq.observability.otel.uninstrument()
    plain = Producer(lookupd=nsq_cluster.lookupd_http_addresses)
    async with metered, plain:
        await metered.publish("oglob", b"x")
        await plain.publish("oglob", b"y")
        [sent] = points(collect(reader), SENT, "oglob")
    assert sent.value == 1
    assert "publish" not in vars(metered)  # not traced: tracing=False


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(1, {}, WAIT)
    background.thread.run(background.cluster.create_topic(
        "osync", partitions=2, replicas=1, channels=["ch"]), WAIT)
    yield background
    background.stop()


def test_the_blocking_facades_pass_meter_provider_on(bg: BackgroundCluster,
                                                      metrics: Any) -> None:
    provider, reader = metrics
    with sync.Producer(lookupd=bg.lookupd, meter_provider=provider) as producer:
        producer.publish_many("osync", [b"a", b"b", b"c"], partition=1)
        found = collect(reader)  # read from this thread, not the client's loop
    [sent] = points(found, SENT, "osync")
    assert sent.value == 3 and sent.attributes["messaging.destination.partition.id"] == "1"

    done = threading.Event()
    got: list[bytes] = []

    def handler(message: Message) -> None:  # runs in the facade's handler threads
        got.append(bytes(message.body))
        if len(got) == 3:
            done.set()

    with sync.Consumer("osync", "ch", lookupd=bg.lookupd, handler=handler,
                       meter_provider=provider, **FAST):
        assert done.wait(WAIT)
        found = collect(reader)
    assert by_partition(points(found, CONSUMED, "osync")) == {"0": 0, "1": 3}
    # the handlers' times are recorded when their thread hands back: the closed consumer
    # has drained them all (a histogram's series outlive the client, its counters' do not)
    found = collect(reader)
    [process] = points(found, PROCESS, "osync")
    assert process.count == 3 and not points(found, CONSUMED, "osync")
