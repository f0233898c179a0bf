"""Typed snapshots of what a Producer or Consumer did and where it stands.

``Producer.stats()`` returns a :class:`ProducerStats`, ``Consumer.stats()`` a
:class:`ConsumerStats`: frozen dataclasses taken at one moment, per topic and partition,
safe to keep, compare, print or export (``smartnsq.observability.prometheus`` turns them into
metrics at scrape time, so nothing is done per message for an exporter).

The counters the snapshots are read from live in ``smartnsq.observability.counters`` (what the hot
paths touch, with the sampling constants; ``docs/observability.md`` has the measured cost).
The clients import this module only when a snapshot is taken.

Pure values and decisions (floor 1): no I/O, no clock of its own (callers pass times).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .counters import LATENCY_BOUNDS, Histogram, PublishMeter

__all__ = [
    "ChannelLag",
    "ConsumerPartitionStats",
    "ConsumerStats",
    "LatencySummary",
    "LookupStats",
    "LookupdHealth",
    "PartitionLag",
    "ProducerPartitionStats",
    "ProducerStats",
    "SubscriptionStats",
    "latency_summary",
]

# -- latency -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LatencySummary:
    """A latency histogram at one moment, in seconds.

    ``buckets[i]`` counts observations ``<= bounds[i]`` (and above the bound before); the last
    one those above ``bounds[-1]``. ``count``, ``sum`` and ``max`` are exact."""

    bounds: tuple[float, ...] = LATENCY_BOUNDS
    buckets: tuple[int, ...] = (0,) * (len(LATENCY_BOUNDS) + 1)
    count: int = 0
    sum: float = 0.0
    max: float = 0.0

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` pairs, the last one ``(inf, count)``: what a
        Prometheus histogram exposes."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.buckets, strict=True):
            total += n
            out.append((bound, total))
        return out

    def quantile(self, q: float) -> float | None:
        """An upper estimate of the ``q`` quantile: the bound of the bucket it falls in
        (``max`` for the last bucket); ``None`` without observations."""
        if not self.count:
            return None
        rank = q * self.count
        for bound, total in self.cumulative():
            if total >= rank and total > 0:
                return min(bound, self.max)
        return self.max

    def __add__(self, other: LatencySummary) -> LatencySummary:
        if self.bounds != other.bounds:
            raise ValueError("latency summaries with different buckets")
        return LatencySummary(self.bounds,
                              tuple(a + b for a, b in zip(self.buckets, other.buckets,
                                                          strict=True)),
                              self.count + other.count, self.sum + other.sum,
                              max(self.max, other.max))


def latency_summary(histogram: Histogram) -> LatencySummary:
    """A counters histogram as its snapshot (the snapshot types live here, not in
    ``smartnsq.observability.counters``, so a client that never takes a snapshot never loads
    them)."""
    buckets = tuple(histogram.buckets)
    return LatencySummary(histogram.bounds, buckets, sum(buckets), histogram.sum, histogram.max)


def _add_counts(into: dict[str, int], more: Mapping[str, int]) -> None:
    for key, n in more.items():
        into[key] = into.get(key, 0) + n


# -- lookup ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LookupdHealth:
    """One nsqlookupd as the client's lookup manager sees it."""

    address: str
    state: str
    requests: int
    errors: int
    failures: int


@dataclass(frozen=True)
class LookupStats:
    """The lookup manager behind a client (``None`` on clients given ``nsqd=``).

    ``rounds``: lookup rounds (every lookupd asked at once); ``failed_rounds``: rounds no
    lookupd answered; ``requests``/``errors``: HTTP requests and the failed ones;
    ``changes``: views that changed (a leader moved, a partition came or went)."""

    rounds: int = 0
    failed_rounds: int = 0
    requests: int = 0
    errors: int = 0
    changes: int = 0
    lookupds: tuple[LookupdHealth, ...] = ()

    @classmethod
    def of(cls, manager: Any) -> LookupStats | None:
        """From a :class:`smartnsq.discovery.lookup.LookupManager` (duck-typed: its ``counters`` and
        ``health()``); ``None`` for ``None``."""
        if manager is None:
            return None
        counters = dict(manager.counters)
        health = tuple(LookupdHealth(h.address, h.state, h.requests, h.errors, h.failures)
                       for h in manager.health())
        return cls(rounds=counters.get("rounds", 0),
                   failed_rounds=counters.get("failed_rounds", 0),
                   requests=counters.get("requests", 0),
                   errors=sum(h.errors for h in health),
                   changes=counters.get("changes", 0), lookupds=health)


# -- producer --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProducerPartitionStats:
    """One (topic, partition) of a producer. ``partition`` ``None``: publishes written
    without a partition (classic nodes, or youzan nodes given as ``nsqd=``); ``leader``:
    ``"host:port"`` of the node the producer writes the partition to now, if known.

    ``published`` counts messages acknowledged (a ``publish_many`` of 100 counts 100);
    ``failed``/``retried`` count calls and attempts by reason (the server's error code, or
    the exception's class name); ``publish_seconds``: from a call to its acknowledgement,
    retries included, observed on one acknowledged call in
    :data:`~smartnsq.observability.counters.PUBLISH_SAMPLE` of the partition, the first
    included (a batch is one call): the counts above are exact."""

    topic: str
    partition: int | None
    leader: str | None = None
    published: int = 0
    failed: Mapping[str, int] = field(default_factory=dict)
    retried: Mapping[str, int] = field(default_factory=dict)
    publish_seconds: LatencySummary = field(default_factory=LatencySummary)


@dataclass(frozen=True)
class ProducerStats:
    """``Producer.stats()``: totals, then one entry per (topic, partition) it published to.

    ``connections``: open connections to nsqd; ``leader_changes``: partitions whose leader
    the producer saw move; ``on_wire``: publishes written and not answered yet; ``lookup``:
    the lookup manager's rounds and failures (``None`` with ``nsqd=``)."""

    at: float
    published: int
    failed: Mapping[str, int]
    retried: Mapping[str, int]
    publish_seconds: LatencySummary
    connections: int
    on_wire: int
    leader_changes: int
    partitions: tuple[ProducerPartitionStats, ...]
    lookup: LookupStats | None = None

    def partition(self, topic: str, partition: int | None) -> ProducerPartitionStats | None:
        return next((p for p in self.partitions
                     if p.topic == topic and p.partition == partition), None)

    def topic(self, topic: str) -> tuple[ProducerPartitionStats, ...]:
        return tuple(p for p in self.partitions if p.topic == topic)

    @classmethod
    def build(cls, meter: PublishMeter, *, leaders: Mapping[Any, str],
              connections: int, on_wire: int, leader_changes: int,
              lookup: LookupStats | None, at: float | None = None) -> ProducerStats:
        parts = []
        published = 0
        failed: dict[str, int] = {}
        retried: dict[str, int] = {}
        latency = LatencySummary()
        for (topic, partition), counts in sorted(meter.items(), key=_part_key):
            summary = latency_summary(counts.latency)
            parts.append(ProducerPartitionStats(
                topic, partition, leaders.get((topic, partition)), counts.published,
                dict(counts.failed), dict(counts.retried), summary))
            published += counts.published
            _add_counts(failed, counts.failed)
            _add_counts(retried, counts.retried)
            latency = latency + summary
        return cls(time.time() if at is None else at, published, failed, retried, latency,
                   connections, on_wire, leader_changes, tuple(parts), lookup)


def _part_key(item: tuple[tuple[str, int | None], Any]) -> tuple[str, int]:
    (topic, partition), _ = item
    return topic, -1 if partition is None else partition


# -- consumer --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConsumerPartitionStats:
    """One partition a consumer reads (``None``: a node read without a partition).

    Counts are over every connection the partition was read on: ``received`` (deliveries
    handed on), ``finished`` (FIN sent), ``requeued`` (REQ sent), ``timed_out`` (answers the
    server refused as too late: :data:`~smartnsq.observability.counters.TIMED_OUT_CODES`),
    ``duplicates_dropped`` (the ordered first delivery the server sends twice), ``lost`` (in
    flight when their connection closed: the server redelivers them),
    ``subscribe_failures`` (attempts to subscribe that failed). Gauges are the live
    subscriptions': ``node`` (the leader it reads from), ``connected``, ``in_flight``,
    ``rdy``, ``backoff`` (``normal``, ``backing_off``, ``probing``... on an ordered partition;
    the consumer's own otherwise), ``last_error``."""

    partition: int | None
    node: str | None = None
    connected: bool = False
    ordered: bool | None = None
    received: int = 0
    finished: int = 0
    requeued: int = 0
    timed_out: int = 0
    duplicates_dropped: int = 0
    lost: int = 0
    server_errors: Mapping[str, int] = field(default_factory=dict)
    in_flight: int = 0
    rdy: int = 0
    backoff: str = "normal"
    subscribe_failures: int = 0
    leader_changes: int = 0
    last_error: str | None = None


@dataclass(frozen=True)
class SubscriptionStats:
    """One (nsqd, partition) the consumer keeps subscribed, now: on a classic topic read from
    several nodes, a partition's entry (``None``) covers them all, and this tells them apart.

    ``node``: ``"host:port"`` (TCP); ``connected``: subscribed now; ``ordered``: what the live
    subscription is (``None`` while not connected); ``in_flight`` and ``rdy`` on its
    connection; ``failures``: failed attempts and lost connections since it last subscribed
    (what its reconnect delay grows with; 0 once subscribed); ``last_error``: the last
    failure, kept after a success."""

    node: str
    partition: int | None
    connected: bool = False
    ordered: bool | None = None
    in_flight: int = 0
    rdy: int = 0
    failures: int = 0
    last_error: str | None = None


@dataclass(frozen=True)
class PartitionLag:
    """A partition's channel as its nsqd reports it (``Consumer.lag()``, ``AsyncAdmin.lag``):
    ``depth`` (messages not yet delivered), ``in_flight``, ``deferred``, youzan's
    ``backlogs`` and the topic's queue ends (``backend_start``/``backend_depth``, bytes).

    ``node`` is the nsqd's HTTP address, the one asked (a client's own stats name a node by
    its TCP address). ``topic_depth`` is the topic's own ``depth``, in the server's unit: on
    classic the messages not yet given to a channel, on youzan the partition's queue in
    bytes."""

    partition: int | None
    node: str
    depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    requeued: int = 0
    timed_out: int = 0
    clients: int = 0
    backlogs: int | None = None
    topic_depth: int = 0
    message_count: int = 0
    backend_start: int | None = None
    backend_depth: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class ChannelLag:
    """A channel's backlog over its partitions, read from the nodes at ``at``."""

    topic: str
    channel: str
    at: float
    partitions: tuple[PartitionLag, ...] = ()

    @property
    def depth(self) -> int:
        return sum(p.depth for p in self.partitions)

    @property
    def in_flight(self) -> int:
        return sum(p.in_flight for p in self.partitions)


@dataclass(frozen=True)
class ConsumerStats:
    """``Consumer.stats()``: totals, gauges, then one entry per partition and per subscription.

    Totals: ``received``, ``finished``, ``requeued``, ``handled`` (handlers that returned,
    plus messages iterated), ``handler_errors``, ``give_ups`` (``max_attempts`` exceeded),
    ``dead_lettered`` (of those, parked by ``dead_letter`` and FINed),
    ``undecodable`` (deliveries whose compressed body could not be decoded: not handled),
    ``timed_out``, ``duplicates_dropped``, ``discarded`` (received on a connection that closed
    before a handler started: left to the server), ``lost`` (in flight when their connection
    closed), ``lost_answers`` (FIN or REQ given after the message's connection closed: the
    server redelivers the message), ``order_errors``, ``server_errors`` by code,
    ``subscribe_failures``, ``leader_changes``. Gauges: ``connections``, ``in_flight``,
    ``queued`` (waiting for a handler), ``max_in_flight``, ``rdy`` (the RDY in force, summed),
    ``backoff`` (the consumer's back-off state), ``starved``. ``handler_seconds``: the
    handler's time, on the first
    :data:`~smartnsq.observability.counters.HANDLER_SAMPLE` handler calls, then on one in
    that many. ``lag``: the last :meth:`Consumer.lag` reading (``None`` if never read).
    ``lookup``: the lookup manager (``None`` with ``nsqd=``)."""

    at: float
    topic: str
    channel: str
    connections: int
    received: int
    finished: int
    requeued: int
    handled: int
    handler_errors: int
    give_ups: int
    undecodable: int
    timed_out: int
    duplicates_dropped: int
    discarded: int
    lost: int
    lost_answers: int
    order_errors: int
    server_errors: Mapping[str, int]
    subscribe_failures: int
    leader_changes: int
    in_flight: int
    queued: int
    max_in_flight: int
    rdy: int
    backoff: str
    starved: bool
    handler_seconds: LatencySummary
    partitions: tuple[ConsumerPartitionStats, ...]
    subscriptions: tuple[SubscriptionStats, ...] = ()
    lookup: LookupStats | None = None
    lag: ChannelLag | None = None
    dead_lettered: int = 0

    def partition(self, partition: int | None) -> ConsumerPartitionStats | None:
        return next((p for p in self.partitions if p.partition == partition), None)
