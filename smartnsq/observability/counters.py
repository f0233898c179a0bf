"""The counters behind ``Producer.stats()`` and ``Consumer.stats()``: what the hot paths
touch, kept apart from the snapshot types (``smartnsq.observability.stats``) so that a client
imports no dataclass machinery for them.

A publish adds one call that bumps a slotted counter and a fixed-bucket histogram; a delivery
one integer increment on its partition's counter (finished is derived: received - requeued -
lost - in flight); the handler's time and a publish's latency are measured on a partition's
first calls, then on one in :data:`HANDLER_SAMPLE` and :data:`PUBLISH_SAMPLE`.
No per-message allocation: histograms are lists of integers indexed by ``bisect``.

Pure values (floor 1): no I/O, no clock of its own (callers pass times).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any, Final, TypeVar

from ..model.routes import address_text

__all__ = [
    "HANDLER_SAMPLE",
    "LATENCY_BOUNDS",
    "PUBLISH_SAMPLE",
    "TIMED_OUT_CODES",
    "ConsumeMeter",
    "Histogram",
    "PartitionCounts",
    "PublishCounts",
    "PublishMeter",
    "reason_of",
]

T = TypeVar("T")

LATENCY_BOUNDS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                         0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds, inclusive) of the latency histograms' buckets; one more bucket
holds what is above the last."""

HANDLER_SAMPLE: Final = 256
"""The handler's time is measured on a consumer's first this many handler calls (a quiet
consumer is measured at once), then on one in this many (a power of two, at most 256: the
countdowns stay cached small ints; the inline runner and each worker count their own): two
clock reads per message would cost more than every counter together (docs/observability.md,
"What it costs")."""

PUBLISH_SAMPLE: Final = 32
"""A partition's publish latency is observed on its first this many acknowledged calls (a
new or quiet partition is measured at once), then on one call in this many (a power of two);
the counts stay exact. Reading the clock and filling the bucket on every call cost a
one-at-a-time publish 3.3% of its instructions."""

TIMED_OUT_CODES: Final = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})
"""Server errors that say an answer came too late: the message was no longer in flight (its
``msg_timeout`` ran out, and the server requeued it). Counted as ``timed_out``."""


def reason_of(error: BaseException | None) -> str:
    """A short, bounded label for why a publish failed or was retried: the server's error
    code (``E_BAD_TOPIC``...) when it gave one, else the exception's class name."""
    if error is None:
        return "unknown"
    code = getattr(error, "code", None)
    if isinstance(code, str) and code:
        return code
    return type(error).__name__


# -- latency -------------------------------------------------------------------------------------

class Histogram:
    """A fixed-bucket latency histogram: per-bucket counts, sum and max (no allocation per
    observation; the count is the buckets' sum)."""

    __slots__ = ("bounds", "buckets", "max", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.max = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        if seconds > self.max:
            self.max = seconds


# -- producer --------------------------------------------------------------------------------------

class PublishCounts:
    """What one (topic, partition) saw of the publishes: mutable, owned by the producer's
    event loop (``partition`` ``None``: written without a partition, classic nodes)."""

    __slots__ = ("failed", "latency", "published", "retried", "skip", "warm")

    def __init__(self) -> None:
        self.published = 0
        # the latency's sample: calls to let pass untimed, and the first calls left to time
        self.skip = 0
        self.warm = PUBLISH_SAMPLE
        self.failed: dict[str, int] = {}
        self.retried: dict[str, int] = {}
        self.latency = Histogram()


class PublishMeter:
    """A producer's counters, per topic and partition (see :class:`ProducerStats`).

    ``topics`` (topic -> partition -> :class:`PublishCounts`) is public for one reader: the
    producer's ``publish_nowait`` answer, which does :meth:`ok`'s count inline (the call
    alone was over 1% of a pipelined publish's CPU)."""

    __slots__ = ("topics",)

    def __init__(self) -> None:
        self.topics: dict[str, dict[int | None, PublishCounts]] = {}

    def counts(self, topic: str, partition: int | None) -> PublishCounts:
        """The counts of (``topic``, ``partition``), made on first use."""
        parts = self.topics.get(topic)
        if parts is None:
            parts = self.topics[topic] = {}
        counts = parts.get(partition)
        if counts is None:
            counts = parts[partition] = PublishCounts()
        return counts

    def ok(self, topic: str, partition: int | None, messages: int, start: float,
           clock: Callable[[], float]) -> None:
        """A publish call (of ``messages`` messages) that began at ``start`` (``clock``'s
        time) is acknowledged. Counted exactly, every call; its latency is observed on the
        partition's first :data:`PUBLISH_SAMPLE` calls, then on one in :data:`PUBLISH_SAMPLE`,
        the only calls that read ``clock``. The other calls cost two subscripts, the count
        and a small-int countdown (no allocation beyond the count)."""
        try:
            counts = self.topics[topic][partition]
        except KeyError:
            counts = self.counts(topic, partition)
        counts.published += messages
        skip = counts.skip
        if skip:
            counts.skip = skip - 1
        else:
            self.timed(counts, start, clock)

    @staticmethod
    def timed(counts: PublishCounts, start: float, clock: Callable[[], float]) -> None:
        """The sampled call of :meth:`ok` (its countdown ran out): observe its latency and
        start the next countdown."""
        if counts.warm:
            counts.warm -= 1
        else:
            counts.skip = PUBLISH_SAMPLE - 1
        counts.latency.observe(clock() - start)

    def failed(self, topic: str, partition: int | None, error: BaseException | None) -> None:
        failed = self.counts(topic, partition).failed
        reason = reason_of(error)
        failed[reason] = failed.get(reason, 0) + 1

    def retried(self, topic: str, partition: int | None, error: BaseException | None) -> None:
        retried = self.counts(topic, partition).retried
        reason = reason_of(error)
        retried[reason] = retried.get(reason, 0) + 1

    def items(self) -> list[tuple[tuple[str, int | None], PublishCounts]]:
        # (list(d.items()) is one C call: safe against the loop's inserts from other threads)
        return [((topic, partition), counts) for topic, parts in list(self.topics.items())
                for partition, counts in list(parts.items())]


# -- consumer --------------------------------------------------------------------------------------

class PartitionCounts:
    """What one partition's deliveries did, over every connection it was read on (mutable,
    owned by the consumer's event loop). The links increment ``received``, ``requeued``,
    ``lost`` (in flight on a connection that closed) and ``duplicates``; finished is derived.
    The consumer's totals are the partitions' sums."""

    __slots__ = ("duplicates", "errors", "leader_changes", "lost", "node", "received",
                 "requeued", "subscribe_failures")

    def __init__(self) -> None:
        self.received = 0
        self.requeued = 0
        self.lost = 0
        self.duplicates = 0
        self.errors: dict[str, int] = {}
        self.subscribe_failures = 0  # attempts to subscribe that failed (each counted once)
        self.leader_changes = 0
        self.node: str | None = None


class ConsumeMeter:
    """A consumer's per-partition counters and the handler-time histogram."""

    __slots__ = ("handler", "leader_changes", "parts")

    def __init__(self) -> None:
        self.parts: dict[int | None, PartitionCounts] = {}
        self.handler = Histogram()
        self.leader_changes = 0

    def partition(self, partition: int | None) -> PartitionCounts:
        counts = self.parts.get(partition)
        if counts is None:
            counts = self.parts[partition] = PartitionCounts()
        return counts

    def server_error(self, partition: int | None, code: str) -> None:
        errors = self.partition(partition).errors
        errors[code] = errors.get(code, 0) + 1

    def targets(self, targets: Iterable[Any]) -> None:
        """The places to read from changed: count partitions whose node moved (duck-typed
        targets: ``partition`` and ``address``)."""
        for target in targets:
            if target.partition is None:
                continue
            node = address_text(target.address)
            counts = self.partition(target.partition)
            if counts.node is not None and counts.node != node:
                counts.leader_changes += 1
                self.leader_changes += 1
            counts.node = node

    def timed(self, handler: Callable[[Any], T], message: Any) -> T:
        """``handler(message)``, its time observed (the sampled path)."""
        started = perf_counter()
        try:
            return handler(message)
        finally:
            self.handler.observe(perf_counter() - started)

    async def timed_async(self, handler: Callable[[Any], Any], message: Any) -> Any:
        started = perf_counter()
        try:
            return await handler(message)
        finally:
            self.handler.observe(perf_counter() - started)
