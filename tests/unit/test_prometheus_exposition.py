"""The Prometheus collector turns the clients' typed snapshots into the exposition an
operator scrapes: every counter, gauge and histogram with its labels (``partition="none"``
for a node without one, a series per failure reason and server error code, leader info,
the channel's backlog with youzan's extra gauges only when the node reports them); clients
named ``producer``/``consumer``, ``-2``, ``-3``... or as given, once each; a snapshot that
cannot be read is retried, then skipped without failing the scrape; a facade's backlog read
at scrape time falls back to the plain snapshot when it fails; ``poll_lag`` keeps reading
an asyncio consumer's backlog until it closes. Driven with snapshots built here, rendered
by prometheus_client's own text format. Skipped without the ``prometheus`` extra."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from smartnsq.observability import prometheus  # noqa: E402
from smartnsq.observability.stats import (  # noqa: E402
    ChannelLag,
    ConsumerPartitionStats,
    ConsumerStats,
    LatencySummary,
    LookupdHealth,
    LookupStats,
    PartitionLag,
    ProducerPartitionStats,
    ProducerStats,
)

LATENCY = LatencySummary(bounds=(0.1, 1.0), buckets=(2, 1, 1), count=4, sum=3.5, max=2.0)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def snapshot(cls: type[Any], **values: Any) -> Any:
    """A snapshot of ``cls`` with ``values``; every other field without a default zero
    (or empty) for its type, so the test names only what it checks."""
    zero = {"int": 0, "float": 0.0, "str": "", "bool": False}
    for field in dataclasses.fields(cls):
        if field.name in values or field.default is not dataclasses.MISSING \
                or field.default_factory is not dataclasses.MISSING:
            continue
        kind = str(field.type)
        if kind in zero:
            values[field.name] = zero[kind]
        elif kind.startswith("Mapping"):
            values[field.name] = {}
        elif kind.startswith("tuple"):
            values[field.name] = ()
        elif kind == "LatencySummary":
            values[field.name] = LatencySummary()
        else:
            raise AssertionError(f"no zero for {cls.__name__}.{field.name}: {kind}")
    return cls(**values)


class Client:
    """A client as the collector sees one: ``stats()``, answering ``answers`` in turn
    (an exception is raised), the last one for ever."""

    def __init__(self, *answers: Any, **attributes: Any) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        for name, value in attributes.items():
            setattr(self, name, value)

    def stats(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def scrape(*collectors: Any) -> Samples:
    registry = prometheus_client.CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    text = prometheus_client.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


LOOKUP = LookupStats(rounds=7, failed_rounds=2, lookupds=(
    LookupdHealth("127.0.0.1:4161", "up", requests=6, errors=1, failures=0),
    LookupdHealth("127.0.0.1:4261", "down", requests=3, errors=3, failures=3)))


def producer_stats() -> ProducerStats:
    return snapshot(ProducerStats, connections=2, on_wire=5, leader_changes=1, lookup=LOOKUP,
                    partitions=(
                        ProducerPartitionStats("orders", 0, leader="127.0.0.1:4150",
                                               published=10,
                                               failed={"E_TIMEOUT": 2, "ConnectionFailed": 1},
                                               retried={"E_FAILED_ON_NOT_LEADER": 3},
                                               publish_seconds=LATENCY),
                        ProducerPartitionStats("legacy", None, published=4)))


def consumer_stats(lag: ChannelLag | None = None) -> ConsumerStats:
    return snapshot(ConsumerStats, topic="orders", channel="billing", connections=1,
                    handled=9, handler_errors=2, give_ups=1, discarded=3, order_errors=4,
                    queued=6, max_in_flight=100, handler_seconds=LATENCY, lag=lag,
                    partitions=(
                        ConsumerPartitionStats(0, node="127.0.0.1:4150", connected=True,
                                               received=11, finished=8, requeued=3,
                                               timed_out=1, duplicates_dropped=2, lost=5,
                                               server_errors={"E_FIN_FAILED": 2,
                                                              "E_INVALID": 1},
                                               in_flight=4, rdy=25, backoff="backing_off",
                                               subscribe_failures=6, leader_changes=7),
                        ConsumerPartitionStats(None)))


def test_a_producer_snapshot_is_exported_with_its_labels() -> None:
    samples = scrape(prometheus.Collector(Client(producer_stats())))
    base = {"client": "producer"}
    part = {**base, "topic": "orders", "partition": "0"}
    assert value(samples, "smartnsq_producer_connections", **base) == 2
    assert value(samples, "smartnsq_producer_publishes_in_flight", **base) == 5
    assert value(samples, "smartnsq_producer_leader_changes_total", **base) == 1
    assert value(samples, "smartnsq_producer_published_messages_total", **part) == 10
    assert value(samples, "smartnsq_producer_published_messages_total", client="producer",
                 topic="legacy", partition="none") == 4
    assert value(samples, "smartnsq_producer_failed_publishes_total", reason="E_TIMEOUT",
                 **part) == 2
    assert value(samples, "smartnsq_producer_failed_publishes_total",
                 reason="ConnectionFailed", **part) == 1
    assert value(samples, "smartnsq_producer_retries_total", reason="E_FAILED_ON_NOT_LEADER",
                 **part) == 3
    assert value(samples, "smartnsq_producer_partition_leader_info", node="127.0.0.1:4150",
                 **part) == 1
    # the partition without a leader has no leader series
    assert not [labels for name, labels in samples
                if name == "smartnsq_producer_partition_leader_info"
                and ("topic", "legacy") in labels]
    buckets = {le: value(samples, "smartnsq_producer_publish_seconds_bucket", le=le, **part)
               for le in ("0.1", "1.0", "+Inf")}
    assert buckets == {"0.1": 2, "1.0": 3, "+Inf": 4}
    assert value(samples, "smartnsq_producer_publish_seconds_count", **part) == 4
    assert value(samples, "smartnsq_producer_publish_seconds_sum", **part) == 3.5
    assert value(samples, "smartnsq_lookup_rounds_total", **base) == 7
    assert value(samples, "smartnsq_lookup_failed_rounds_total", **base) == 2
    assert value(samples, "smartnsq_lookupd_requests_total", lookupd="127.0.0.1:4261",
                 **base) == 3
    assert value(samples, "smartnsq_lookupd_errors_total", lookupd="127.0.0.1:4161",
                 **base) == 1


def test_a_consumer_snapshot_is_exported_per_partition_with_its_backlog() -> None:
    lag = ChannelLag("orders", "billing", at=1700000000.5, partitions=(
        PartitionLag(0, "127.0.0.1:4151", depth=12, in_flight=4, deferred=1, backlogs=13,
                     backend_start=100, backend_depth=900),
        PartitionLag(1, "127.0.0.1:4152", error="cannot reach 127.0.0.1:4152"),
        PartitionLag(None, "127.0.0.1:4153", depth=2)))
    samples = scrape(prometheus.Collector(Client(consumer_stats(lag), channel="billing")))
    base = {"client": "consumer", "topic": "orders", "channel": "billing"}
    zero = {**base, "partition": "0"}
    none = {**base, "partition": "none"}
    for name, expected in (("smartnsq_consumer_handled_messages_total", 9),
                           ("smartnsq_consumer_handler_errors_total", 2),
                           ("smartnsq_consumer_give_ups_total", 1),
                           ("smartnsq_consumer_discarded_messages_total", 3),
                           ("smartnsq_consumer_order_errors_total", 4),
                           ("smartnsq_consumer_connections", 1),
                           ("smartnsq_consumer_queued_messages", 6),
                           ("smartnsq_consumer_max_in_flight", 100),
                           ("smartnsq_consumer_handler_seconds_count", 4)):
        assert value(samples, name, **base) == expected, name
    for name, expected in (("smartnsq_consumer_received_messages_total", 11),
                           ("smartnsq_consumer_finished_messages_total", 8),
                           ("smartnsq_consumer_requeued_messages_total", 3),
                           ("smartnsq_consumer_timed_out_messages_total", 1),
                           ("smartnsq_consumer_duplicates_dropped_total", 2),
                           ("smartnsq_consumer_lost_messages_total", 5),
                           ("smartnsq_consumer_subscribe_failures_total", 6),
                           ("smartnsq_consumer_leader_changes_total", 7),
                           ("smartnsq_consumer_in_flight_messages", 4),
                           ("smartnsq_consumer_rdy", 25),
                           ("smartnsq_consumer_connected", 1),
                           ("smartnsq_consumer_backing_off", 1)):
        assert value(samples, name, **zero) == expected, name
    assert value(samples, "smartnsq_consumer_connected", **none) == 0
    assert value(samples, "smartnsq_consumer_backing_off", **none) == 0
    assert value(samples, "smartnsq_consumer_received_messages_total", **none) == 0
    assert value(samples, "smartnsq_consumer_server_errors_total", code="E_FIN_FAILED",
                 **zero) == 2
    assert value(samples, "smartnsq_consumer_server_errors_total", code="E_INVALID",
                 **zero) == 1
    assert value(samples, "smartnsq_consumer_partition_leader_info", node="127.0.0.1:4150",
                 **zero) == 1
    leaders = [labels for name, labels in samples
               if name == "smartnsq_consumer_partition_leader_info"]
    assert len(leaders) == 1  # the partition without a node has none

    assert value(samples, "smartnsq_channel_lag_timestamp_seconds", **base) == 1700000000.5
    node0 = {**zero, "node": "127.0.0.1:4151"}
    assert value(samples, "smartnsq_channel_depth_messages", **node0) == 12
    assert value(samples, "smartnsq_channel_in_flight_messages", **node0) == 4
    assert value(samples, "smartnsq_channel_deferred_messages", **node0) == 1
    assert value(samples, "smartnsq_channel_backlogs", **node0) == 13
    assert value(samples, "smartnsq_topic_backend_start_bytes", **node0) == 100
    assert value(samples, "smartnsq_topic_backend_depth_bytes", **node0) == 900
    classic = {**none, "node": "127.0.0.1:4153"}
    assert value(samples, "smartnsq_channel_depth_messages", **classic) == 2
    # the node that failed exports nothing; classic nodes have no youzan gauges
    depth = [dict(labels) for name, labels in samples
             if name == "smartnsq_channel_depth_messages"]
    assert sorted(d["partition"] for d in depth) == ["0", "none"]
    for name in ("smartnsq_channel_backlogs", "smartnsq_topic_backend_start_bytes",
                 "smartnsq_topic_backend_depth_bytes"):
        assert [dict(labels)["partition"] for n, labels in samples if n == name] == ["0"]


def test_a_consumer_never_read_for_its_backlog_exports_no_backlog() -> None:
    samples = scrape(prometheus.Collector(Client(consumer_stats(), channel="billing")))
    assert "smartnsq_consumer_handled_messages_total" in names(samples)
    assert not {n for n in names(samples) if n.startswith(("smartnsq_channel_",
                                                           "smartnsq_lookup"))}


def test_clients_are_named_by_kind_in_turn_or_as_given_once() -> None:
    collector = prometheus.Collector()
    producers = [Client(producer_stats()) for _ in range(3)]
    facade = Client(consumer_stats(), async_consumer=object())
    asyncio_consumer = Client(consumer_stats(), channel="billing")
    assert [collector.add(p) for p in producers] == ["producer", "producer-2", "producer-3"]
    assert collector.add(asyncio_consumer) == "consumer"
    assert collector.add(facade) == "consumer-2"
    assert collector.add(Client(producer_stats()), name="orders-api") == "orders-api"
    with pytest.raises(ValueError, match="'orders-api'"):
        collector.add(Client(producer_stats()), name="orders-api")
    with pytest.raises(TypeError, match="has no stats"):
        collector.add(object())
    collector.remove(producers[1])
    samples = scrape(collector)
    exported = {dict(labels)["client"] for name, labels in samples
                if name == "smartnsq_producer_connections"}
    assert exported == {"producer", "producer-3", "orders-api"}
    assert {dict(labels)["client"] for name, labels in samples
            if name == "smartnsq_consumer_connections"} == {"consumer", "consumer-2"}
    # a removed name is free again
    assert collector.add(Client(producer_stats())) == "producer-2"
    assert list(collector.describe()) == []


def test_a_snapshot_read_while_a_table_changes_is_retried_then_skipped(
        caplog: pytest.LogCaptureFixture) -> None:
    changing = RuntimeError("dictionary changed size during iteration")
    flaky = Client(changing, changing, producer_stats())
    broken = Client(changing, channel="ch")
    with caplog.at_level(logging.WARNING, "smartnsq.prometheus"):
        samples = scrape(prometheus.Collector(flaky, broken))
    assert len(flaky.calls) == 3 and len(broken.calls) == 3
    assert value(samples, "smartnsq_producer_connections", client="producer") == 2
    assert not [n for n in names(samples) if n.startswith("smartnsq_consumer_")]
    [warning] = [r for r in caplog.records if r.name == "smartnsq.prometheus"]
    assert "could not read" in warning.getMessage()
    assert warning.exc_info is not None and warning.exc_info[1] is changing


def test_a_facade_consumer_is_read_with_its_backlog_or_without_when_that_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    lag = ChannelLag("orders", "billing", at=5.0,
                     partitions=(PartitionLag(0, "127.0.0.1:4151", depth=3),))
    with_lag = consumer_stats(lag)
    facade = Client(with_lag, async_consumer=object())
    samples = scrape(prometheus.Collector(facade, lag=True, lag_timeout=0.25))
    assert facade.calls == [{"lag": True, "timeout": 0.25}]
    assert value(samples, "smartnsq_channel_depth_messages", client="consumer",
                 topic="orders", channel="billing", partition="0", node="127.0.0.1:4151") == 3

    # the backlog cannot be read: the scrape exports the snapshot as it is
    failing = Client(TimeoutError("lag: no answer within 0.25s"), consumer_stats(),
                     async_consumer=object())
    with caplog.at_level(logging.INFO, "smartnsq.prometheus"):
        samples = scrape(prometheus.Collector(failing, lag=True, lag_timeout=0.25))
    assert failing.calls == [{"lag": True, "timeout": 0.25}, {}]
    assert value(samples, "smartnsq_consumer_handled_messages_total", client="consumer",
                 topic="orders", channel="billing") == 9
    assert any("reading the channel's backlog failed: lag: no answer" in r.getMessage()
               for r in caplog.records)

    # lag=True reads asyncio clients plainly (their backlog is poll_lag's)
    plain = Client(consumer_stats(), channel="billing")
    scrape(prometheus.Collector(plain, lag=True))
    assert plain.calls == [{}]


def test_register_adds_the_collector_to_a_registry_until_unregistered() -> None:
    registry = prometheus_client.CollectorRegistry()
    collector = prometheus.register(Client(producer_stats()), registry=registry)
    assert registry.get_sample_value("smartnsq_producer_connections",
                                     {"client": "producer"}) == 2
    registry.unregister(collector)
    assert registry.get_sample_value("smartnsq_producer_connections",
                                     {"client": "producer"}) is None


class LaggingConsumer:
    """An asyncio consumer as ``poll_lag`` sees one: ``lag()`` fails once, then closes it."""

    topic = "orders"
    channel = "billing"

    def __init__(self) -> None:
        self.closed = False
        self.timeouts: list[float] = []
        self.done = asyncio.Event()

    async def lag(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        if len(self.timeouts) == 1:
            raise ConnectionError("node down")
        self.closed = True
        self.done.set()


async def test_poll_lag_reads_until_the_consumer_closes_and_logs_failed_readings(
        caplog: pytest.LogCaptureFixture) -> None:
    consumer = LaggingConsumer()
    with caplog.at_level(logging.INFO, "smartnsq.prometheus"):
        task = prometheus.poll_lag(consumer, interval=0.0, timeout=1.5)
        assert task.get_name() == "smartnsq-prometheus lag"
        await asyncio.wait_for(task, 10)
    assert consumer.timeouts == [1.5, 1.5]
    assert [r.getMessage() for r in caplog.records if r.name == "smartnsq.prometheus"] == [
        "orders/billing: reading the backlog failed: node down"]


async def test_poll_lag_stops_when_cancelled_mid_reading() -> None:
    consumer = LaggingConsumer()
    reading = asyncio.Event()

    async def forever(timeout: float) -> None:
        reading.set()
        await asyncio.Event().wait()

    consumer.lag = forever  # type: ignore[method-assign]
    task = prometheus.poll_lag(consumer, interval=60.0)
    await asyncio.wait_for(reading.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled() and not consumer.closed
