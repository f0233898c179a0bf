"""Prometheus metrics for smartnsq clients, read from their snapshots at scrape time.

::

    from prometheus_client import start_http_server
    from smartnsq.observability import prometheus

    collector = prometheus.register(producer, consumer)   # the default registry
    start_http_server(9108, addr="127.0.0.1")

:class:`Collector` calls ``stats()`` on each client it was given when Prometheus scrapes, and
turns the typed snapshot (``smartnsq.observability.stats``) into metric families: nothing is done
per message for the exporter, and a process that is never scraped pays nothing. Names and labels
follow Prometheus conventions (``smartnsq_..._total`` counters, ``_seconds`` histograms,
``topic``/``channel``/``partition`` labels, ``partition="none"`` for a node read or written
without one); ``docs/observability.md`` has the table.

Clients may be asyncio ones (``smartnsq.Producer``/``Consumer``) or the blocking facades
(``smartnsq.sync``). A facade's snapshot is taken on its loop thread; an asyncio client's is
read from the scraping thread, retried if the loop changed a table meanwhile (each counter is
exact; two of them may be a message apart). The channel's backlog (``Consumer.lag()``, HTTP
to the nodes) is exported as last read: keep it fresh with :func:`poll_lag` on the
consumer's loop, or give a facade consumer with ``lag=True`` (then read at each scrape).

Needs the ``prometheus`` extra (``pip install -e '.[prometheus]'``: prometheus-client).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from .stats import ChannelLag, ConsumerStats, LatencySummary, LookupStats, ProducerStats

__all__ = ["Collector", "poll_lag", "register"]

log = logging.getLogger("smartnsq.prometheus")

NONE = "none"  # the partition label of a node read or written without a partition
_READ_TRIES = 3


def _part(partition: int | None) -> str:
    return NONE if partition is None else str(partition)


def _buckets(summary: LatencySummary) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(float(bound)), float(total))
            for bound, total in summary.cumulative()]


class Collector:
    """A Prometheus collector over smartnsq clients (see the module docstring).

    ``clients``: Producers and Consumers (asyncio or ``smartnsq.sync``); ``lag``: read the
    backlog of facade consumers at each scrape (``stats(lag=True)``, within
    ``lag_timeout``). Each client's series carry a ``client`` label: the name given to
    :meth:`add`, else ``producer``/``consumer`` (``-2``, ``-3``... for the next ones)."""

    def __init__(self, *clients: Any, lag: bool = False, lag_timeout: float = 2.0) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self.lag = lag
        self.lag_timeout = lag_timeout
        for client in clients:
            self.add(client)

    def add(self, client: Any, name: str | None = None) -> str:
        """Export ``client`` too; returns its ``client`` label."""
        if not callable(getattr(client, "stats", None)):
            raise TypeError(f"{client!r} has no stats()")
        with self._lock:
            if name is None:
                kind = "consumer" if hasattr(client, "channel") or hasattr(
                    client, "async_consumer") else "producer"
                name, n = kind, 1
                while name in self._clients:
                    n += 1
                    name = f"{kind}-{n}"
            elif name in self._clients:
                raise ValueError(f"a client is already exported as {name!r}")
            self._clients[name] = client
        return name

    def remove(self, client: Any) -> None:
        with self._lock:
            for name, known in list(self._clients.items()):
                if known is client:
                    del self._clients[name]

    def _read(self, client: Any) -> ProducerStats | ConsumerStats | None:
        for attempt in range(_READ_TRIES):
            try:
                if self.lag and hasattr(client, "async_consumer"):
                    try:
                        return client.stats(lag=True, timeout=self.lag_timeout)  # type: ignore[no-any-return]
                    except Exception as exc:
                        log.info("reading the channel's backlog failed: %s", exc)
                return client.stats()  # type: ignore[no-any-return]
            except RuntimeError:  # a table changed size under the read (asyncio clients)
                if attempt == _READ_TRIES - 1:
                    log.warning("could not read %r's stats", client, exc_info=True)
        return None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            clients = list(self._clients.items())
        out = _Families()
        for name, client in clients:
            stats = self._read(client)
            if isinstance(stats, ProducerStats):
                out.producer(name, stats)
            elif isinstance(stats, ConsumerStats):
                out.consumer(name, stats)
        yield from out.families()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: families depend on what the clients saw


class _Families:
    """The metric families of one scrape, filled client by client."""

    def __init__(self) -> None:
        self._all: dict[str, Metric] = {}

    def _get(self, kind: type[Any], name: str, doc: str, labels: list[str],
             unit: str = "") -> Any:
        family = self._all.get(name)
        if family is None:
            family = self._all[name] = kind(name, doc, labels=labels, unit=unit)
        return family

    def counter(self, name: str, doc: str, labels: list[str], values: list[str],
                value: float) -> None:
        self._get(CounterMetricFamily, name, doc, labels).add_metric(values, value)

    def gauge(self, name: str, doc: str, labels: list[str], values: list[str],
              value: float) -> None:
        self._get(GaugeMetricFamily, name, doc, labels).add_metric(values, value)

    def histogram(self, name: str, doc: str, labels: list[str], values: list[str],
                  summary: LatencySummary) -> None:
        self._get(HistogramMetricFamily, name, doc, labels).add_metric(
            values, _buckets(summary), summary.sum)

    def families(self) -> Iterable[Metric]:
        return self._all.values()

    def lookup(self, client: str, stats: LookupStats | None) -> None:
        if stats is None:
            return
        labels, values = ["client"], [client]
        self.counter("smartnsq_lookup_rounds", "Lookup rounds (every lookupd asked at once).",
                     labels, values, stats.rounds)
        self.counter("smartnsq_lookup_failed_rounds", "Lookup rounds no lookupd answered.",
                     labels, values, stats.failed_rounds)
        for health in stats.lookupds:
            lv = [client, health.address]
            self.counter("smartnsq_lookupd_requests", "HTTP requests to a lookupd.",
                         ["client", "lookupd"], lv, health.requests)
            self.counter("smartnsq_lookupd_errors", "Failed HTTP requests to a lookupd.",
                         ["client", "lookupd"], lv, health.errors)

    def producer(self, client: str, stats: ProducerStats) -> None:
        base = ["client"]
        self.gauge("smartnsq_producer_connections", "Open connections to nsqd.", base,
                   [client], stats.connections)
        self.gauge("smartnsq_producer_publishes_in_flight",
                   "Publishes written and not answered yet.", base, [client], stats.on_wire)
        self.counter("smartnsq_producer_leader_changes",
                     "Partitions the producer saw move to another leader.", base, [client],
                     stats.leader_changes)
        labels = ["client", "topic", "partition"]
        for part in stats.partitions:
            values = [client, part.topic, _part(part.partition)]
            self.counter("smartnsq_producer_published_messages",
                         "Messages acknowledged by nsqd.", labels, values, part.published)
            for reason, n in sorted(part.failed.items()):
                self.counter("smartnsq_producer_failed_publishes",
                             "Publish calls that failed, by reason (server error code or "
                             "exception class).", [*labels, "reason"], [*values, reason], n)
            for reason, n in sorted(part.retried.items()):
                self.counter("smartnsq_producer_retries",
                             "Publish attempts that failed and were retried, by reason.",
                             [*labels, "reason"], [*values, reason], n)
            self.histogram("smartnsq_producer_publish_seconds",
                           "From a publish call to its acknowledgement (retries included).",
                           labels, values, part.publish_seconds)
            if part.leader is not None:
                self.gauge("smartnsq_producer_partition_leader_info",
                           "The nsqd the producer writes the partition to (value 1).",
                           [*labels, "node"], [*values, part.leader], 1)
        self.lookup(client, stats.lookup)

    def consumer(self, client: str, stats: ConsumerStats) -> None:
        base = ["client", "topic", "channel"]
        bv = [client, stats.topic, stats.channel]
        for name, doc, value in (
                ("smartnsq_consumer_handled_messages",
                 "Handlers that returned (and messages iterated).", stats.handled),
                ("smartnsq_consumer_handler_errors", "Handlers that raised.",
                 stats.handler_errors),
                ("smartnsq_consumer_give_ups", "Messages given up after max_attempts.",
                 stats.give_ups),
                ("smartnsq_consumer_dead_lettered_messages",
                 "Messages parked by dead_letter past max_attempts, then FINed.",
                 stats.dead_lettered),
                ("smartnsq_consumer_undecodable_messages",
                 "Deliveries whose compressed body could not be decoded (not handled).",
                 stats.undecodable),
                ("smartnsq_consumer_discarded_messages",
                 "Messages whose connection closed before a handler started.",
                 stats.discarded),
                ("smartnsq_consumer_order_errors", "Order regressions seen on ordered "
                 "subscriptions.", stats.order_errors)):
            self.counter(name, doc, base, bv, value)
        for name, doc, value in (
                ("smartnsq_consumer_connections", "Subscribed connections.",
                 stats.connections),
                ("smartnsq_consumer_queued_messages", "Received, waiting for a handler.",
                 stats.queued),
                ("smartnsq_consumer_max_in_flight", "The max_in_flight in force.",
                 stats.max_in_flight)):
            self.gauge(name, doc, base, bv, value)
        self.histogram("smartnsq_consumer_handler_seconds",
                       "The handler's time, sampled (HANDLER_SAMPLE).", base, bv,
                       stats.handler_seconds)
        labels = [*base, "partition"]
        for part in stats.partitions:
            values = [*bv, _part(part.partition)]
            for name, doc, value in (
                    ("smartnsq_consumer_received_messages", "Messages delivered.",
                     part.received),
                    ("smartnsq_consumer_finished_messages", "Messages finished (FIN).",
                     part.finished),
                    ("smartnsq_consumer_requeued_messages", "Messages requeued (REQ).",
                     part.requeued),
                    ("smartnsq_consumer_timed_out_messages",
                     "Answers nsqd refused as too late (msg_timeout ran out).",
                     part.timed_out),
                    ("smartnsq_consumer_duplicates_dropped",
                     "Ordered first deliveries nsqd sent twice, dropped.",
                     part.duplicates_dropped),
                    ("smartnsq_consumer_lost_messages",
                     "In flight when their connection closed (nsqd redelivers them).",
                     part.lost),
                    ("smartnsq_consumer_subscribe_failures", "Failed subscriptions.",
                     part.subscribe_failures),
                    ("smartnsq_consumer_leader_changes",
                     "Times the partition's leader moved.", part.leader_changes)):
                self.counter(name, doc, labels, values, value)
            for code, n in sorted(part.server_errors.items()):
                self.counter("smartnsq_consumer_server_errors", "Errors nsqd sent, by code.",
                             [*labels, "code"], [*values, code], n)
            self.gauge("smartnsq_consumer_in_flight_messages",
                       "Delivered, not answered yet.", labels, values, part.in_flight)
            self.gauge("smartnsq_consumer_rdy", "The RDY count in force.", labels, values,
                       part.rdy)
            self.gauge("smartnsq_consumer_connected", "1 when the partition is subscribed.",
                       labels, values, 1 if part.connected else 0)
            self.gauge("smartnsq_consumer_backing_off",
                       "1 while the partition's flow is held back (backing off or probing).",
                       labels, values, 0 if part.backoff == "normal" else 1)
            if part.node is not None:
                self.gauge("smartnsq_consumer_partition_leader_info",
                           "The nsqd the partition is read from (value 1).",
                           [*labels, "node"], [*values, part.node], 1)
        self.channel_lag(client, stats.lag)
        self.lookup(client, stats.lookup)

    def channel_lag(self, client: str, lag: ChannelLag | None) -> None:
        if lag is None:
            return
        labels = ["client", "topic", "channel", "partition", "node"]
        self.gauge("smartnsq_channel_lag_timestamp_seconds",
                   "When the channel's backlog was read (Unix time).",
                   ["client", "topic", "channel"], [client, lag.topic, lag.channel], lag.at)
        for part in lag.partitions:
            if part.error is not None:
                continue
            values = [client, lag.topic, lag.channel, _part(part.partition), part.node]
            self.gauge("smartnsq_channel_depth_messages",
                       "Messages in the channel not delivered yet (nsqd /stats).", labels,
                       values, part.depth)
            self.gauge("smartnsq_channel_in_flight_messages",
                       "Messages in flight on the channel, every consumer (nsqd /stats).",
                       labels, values, part.in_flight)
            self.gauge("smartnsq_channel_deferred_messages",
                       "Deferred messages on the channel (nsqd /stats).", labels, values,
                       part.deferred)
            if part.backlogs is not None:
                self.gauge("smartnsq_channel_backlogs",
                           "youzan: the channel's backlog count (nsqd /stats).", labels,
                           values, part.backlogs)
            if part.backend_depth is not None:
                self.gauge("smartnsq_topic_backend_depth_bytes",
                           "youzan: where the partition's queue ends (bytes).", labels,
                           values, part.backend_depth)
            if part.backend_start is not None:
                self.gauge("smartnsq_topic_backend_start_bytes",
                           "youzan: where the partition's queue starts (bytes).", labels,
                           values, part.backend_start)


def register(*clients: Any, registry: CollectorRegistry = REGISTRY, lag: bool = False,
             lag_timeout: float = 2.0) -> Collector:
    """A :class:`Collector` over ``clients``, registered with ``registry`` (default: the
    process's default one); ``registry.unregister(collector)`` undoes it."""
    collector = Collector(*clients, lag=lag, lag_timeout=lag_timeout)
    registry.register(collector)
    return collector


def poll_lag(consumer: Any, interval: float = 15.0, timeout: float = 5.0
             ) -> asyncio.Task[None]:
    """Read an asyncio consumer's backlog (``consumer.lag()``) every ``interval`` seconds
    until it closes, so scrapes export a fresh one; call it on the consumer's loop. A failed
    reading is logged and tried again at the next interval. Cancel the task to stop."""
    async def run() -> None:
        while not consumer.closed:
            try:
                await consumer.lag(timeout)
            except Exception as exc:
                log.info("%s/%s: reading the backlog failed: %s", consumer.topic,
                         consumer.channel, exc)
            await asyncio.sleep(interval)

    return asyncio.get_running_loop().create_task(run(), name="smartnsq-prometheus lag")
