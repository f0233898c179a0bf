"""smartnsq.observability.otel_metrics' pure parts: snapshots -> observations, and the metered
meters recording on the counters' sampled calls only (no opentelemetry needed: the histogram's
``record`` is a stand-in)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq.observability import otel_metrics
from smartnsq.observability.counters import (
    HANDLER_SAMPLE,
    PUBLISH_SAMPLE,
    ConsumeMeter,
    PublishMeter,
)
from smartnsq.observability.otel_metrics import (
    MeteredConsumeMeter,
    MeteredPublishMeter,
    consumed_points,
    sent_points,
)
from smartnsq.observability.stats import ConsumerPartitionStats, ProducerStats


def test_sent_points_per_partition_and_failures_with_error_type() -> None:
    meter = PublishMeter()
    for _ in range(5):
        meter.ok("orders", 0, 2, 0.0, lambda: 0.001)
    meter.ok("orders", 1, 1, 0.0, lambda: 0.001)
    meter.failed("orders", 1, TimeoutError())
    meter.failed("orders", 1, TimeoutError())
    meter.failed("plain", None, SimpleNamespace(code="E_BAD_TOPIC"))  # type: ignore[arg-type]
    stats = ProducerStats.build(meter, leaders={}, connections=0, on_wire=0,
                                leader_changes=0, lookup=None, at=0.0)
    base = {"messaging.system": "nsq", "messaging.operation.name": "publish",
            "messaging.operation.type": "send"}
    assert sent_points(stats) == [
        (10, {**base, "messaging.destination.name": "orders",
              "messaging.destination.partition.id": "0"}),
        (1, {**base, "messaging.destination.name": "orders",
             "messaging.destination.partition.id": "1"}),
        (2, {**base, "messaging.destination.name": "orders",
             "messaging.destination.partition.id": "1", "error.type": "TimeoutError"}),
        (0, {**base, "messaging.destination.name": "plain"}),
        (1, {**base, "messaging.destination.name": "plain", "error.type": "E_BAD_TOPIC"}),
    ]


def test_consumed_points_per_partition() -> None:
    stats = SimpleNamespace(topic="orders", channel="billing", partitions=(
        ConsumerPartitionStats(None, received=3), ConsumerPartitionStats(2, received=7)))
    base = {"messaging.system": "nsq", "messaging.operation.name": "receive",
            "messaging.operation.type": "receive", "messaging.destination.name": "orders",
            "messaging.consumer.group.name": "billing",
            "messaging.destination.subscription.name": "billing"}
    assert consumed_points(stats) == [
        (3, base), (7, {**base, "messaging.destination.partition.id": "2"})]


def test_the_publish_histogram_is_recorded_on_the_counters_sampled_calls_only() -> None:
    recorded: list[tuple[float, Any]] = []
    meter = MeteredPublishMeter(lambda value, attributes: recorded.append((value, attributes)))
    calls = PUBLISH_SAMPLE + 3 * PUBLISH_SAMPLE
    for _ in range(calls):
        meter.ok("orders", 3, 1, 1.0, lambda: 1.5)
    timed = meter.topics["orders"][3].latency
    assert len(recorded) == sum(timed.buckets) == PUBLISH_SAMPLE + 3  # warm, then 1 in 32
    assert {v for v, _ in recorded} == {0.5}
    assert recorded[0][1] == {"messaging.system": "nsq", "messaging.operation.name": "publish",
                              "messaging.operation.type": "send",
                              "messaging.destination.name": "orders",
                              "messaging.destination.partition.id": "3"}
    assert meter.topics["orders"][3].published == calls  # the counts stay exact


def message(partition: int | None) -> Any:
    return SimpleNamespace(youzan=partition is not None, partition=partition)


def test_the_process_histogram_records_the_handler_and_its_error_type() -> None:
    recorded: list[tuple[float, Any]] = []
    meter = MeteredConsumeMeter(lambda value, attributes: recorded.append((value, attributes)),
                                "orders", "billing")
    assert meter.timed(lambda m: "ok", message(1)) == "ok"

    def fails(m: Any) -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        meter.timed(fails, message(None))
    assert sum(meter.handler.buckets) == 2  # stats() still sees both
    [(_, ok), (_, failed)] = recorded
    assert ok["messaging.destination.partition.id"] == "1" and "error.type" not in ok
    assert ok["messaging.consumer.group.name"] == "billing"
    assert failed["error.type"] == "KeyError"
    assert "messaging.destination.partition.id" not in failed
    assert HANDLER_SAMPLE > 2  # (these two are in the consumer's warm-up: all timed)


async def test_the_async_handler_is_recorded_too() -> None:
    recorded: list[Any] = []
    meter = MeteredConsumeMeter(lambda value, attributes: recorded.append(attributes),
                                "orders", "billing")

    async def handler(m: Any) -> int:
        return 7

    assert await meter.timed_async(handler, message(0)) == 7
    assert recorded[0]["messaging.destination.partition.id"] == "0"


def test_without_a_provider_the_meters_are_given_back_untouched() -> None:
    otel_metrics.disable()
    publish, consume = PublishMeter(), ConsumeMeter()
    assert otel_metrics.producer_meter(object(), publish, None) is publish
    assert otel_metrics.consumer_meter(object(), consume, None) is consume


class FakeProducer:
    """A client for the observable counters: ``stats()`` and ``closed``."""

    def __init__(self, published: int) -> None:
        meter = PublishMeter()
        meter.ok("orders", 0, published, 0.0, lambda: 0.0)
        self.stats_value = ProducerStats.build(meter, leaders={}, connections=0, on_wire=0,
                                               leader_changes=0, lookup=None, at=0.0)
        self.closed = False
        self.broken = False

    def stats(self) -> ProducerStats:
        if self.broken:
            raise RuntimeError("dictionary changed size during iteration")
        return self.stats_value


def test_the_counters_drop_closed_collected_and_unreadable_clients() -> None:
    pytest.importorskip("opentelemetry.sdk")
    import gc

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    clients = [FakeProducer(n) for n in (1, 2, 3, 4)]
    ids = [otel_metrics.producer_meter(c, PublishMeter(), provider) and c for c in clients]
    assert len(ids) == 4

    def sent() -> list[int]:
        data = reader.get_metrics_data()
        return sorted(p.value for r in data.resource_metrics for s in r.scope_metrics
                      for m in s.metrics if m.name == otel_metrics.SENT
                      for p in m.data.data_points)

    assert sent() == [1, 2, 3, 4]
    clients[0].closed = True  # closed: gone for good
    clients[1].broken = True  # unreadable this time: skipped, the callback does not raise
    del ids
    clients.pop(2)  # collected: its weak reference is dead
    gc.collect()
    assert sent() == [4]
    clients[1].broken = False
    assert sent() == [2, 4]


def test_a_client_still_being_made_is_read_at_the_next_collection() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    client = FakeProducer(5)
    del client.closed  # as in Producer.__init__ before its flags are set
    otel_metrics.producer_meter(client, PublishMeter(), provider)

    def sent() -> list[int]:
        data = reader.get_metrics_data()  # (None when nothing was observed)
        return [p.value for r in (data.resource_metrics if data else ()) for s in r.scope_metrics
                for m in s.metrics if m.name == otel_metrics.SENT
                for p in m.data.data_points]

    assert sent() == []
    client.closed = False
    assert sent() == [5]
