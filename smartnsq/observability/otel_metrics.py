"""OpenTelemetry's messaging metrics for smartnsq clients, read from what they already count.

Off, and free, unless asked for, in one of two ways:

* per client: ``Producer(..., meter_provider=provider)``, ``Consumer(..., meter_provider=
  provider)`` (the blocking facades pass it on);
* for every client created afterwards: ``smartnsq.observability.otel.instrument()`` (the global
meter
  provider, or the one given; ``metrics=False`` leaves them off), until ``uninstrument()``.

A client without it never imports opentelemetry and keeps its plain counters
(``smartnsq.observability.counters``): the constructors hand them through :func:`producer_meter` and
:func:`consumer_meter`, which give them back untouched.

**The counters are observable.** ``messaging.client.sent.messages`` and
``messaging.client.consumed.messages`` are OpenTelemetry observable counters whose callbacks
read each live client's ``stats()`` snapshot when the reader collects, as the Prometheus
collector does at scrape time: nothing is done per message for them. Each client is its own
series (``messaging.client.id``: an observable counter reports a running total, and two
clients' totals under one attribute set would overwrite each other); a closed client, or
one garbage-collected, is dropped at the next collection and its series stop.

**The histograms are sampled.** OpenTelemetry has no asynchronous histogram, so a duration
is recorded when it happens. ``messaging.client.operation.duration`` (publish) and
``messaging.process.duration`` (the handler) are recorded on the calls the counters already
time: a partition's first :data:`~smartnsq.observability.counters.PUBLISH_SAMPLE` acknowledged
publishes then one in ``PUBLISH_SAMPLE``; the consumer's first
:data:`~smartnsq.observability.counters.HANDLER_SAMPLE` handler calls then one in
``HANDLER_SAMPLE``. The histograms' counts are therefore a sample (their distribution is right,
their count is not the rate: the counters are). The Python SDK's ``Histogram.record`` is about
105,000 instructions: recording every handler call made the consumer's layer 6.6 times as costly per
message, sampled it is +2.2% (``docs/observability.md``, "Metrics"). The clients' meters
are subclasses of the counters' own whose timed path also records: the untimed calls run
the very same code as without metrics.

Attributes follow the messaging semantic conventions: ``messaging.system`` ``nsq``,
``messaging.operation.name``/``.type``, ``messaging.destination.name`` (the topic),
``messaging.destination.partition.id`` (when there is a partition),
``messaging.consumer.group.name`` and ``messaging.destination.subscription.name`` (the
channel), ``error.type`` (the server's error code or the exception's class): every value
bounded by the topics, partitions, channels and reasons a client sees.

Needs the ``otel`` extra (opentelemetry-api; an SDK or another implementation to export).
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from time import perf_counter
from typing import Any, TypeVar

from .. import __version__
from .counters import ConsumeMeter, PublishCounts, PublishMeter, reason_of

__all__ = [
    "DURATION_BOUNDS",
    "MeteredConsumeMeter",
    "MeteredPublishMeter",
    "consumed_points",
    "consumer_meter",
    "disable",
    "enable",
    "enabled",
    "producer_meter",
    "sent_points",
]

log = logging.getLogger("smartnsq.otel")

T = TypeVar("T")
SYSTEM = "nsq"
SENT = "messaging.client.sent.messages"
CONSUMED = "messaging.client.consumed.messages"
OPERATION = "messaging.client.operation.duration"
PROCESS = "messaging.process.duration"
DURATION_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0)
"""The duration histograms' bucket bounds (seconds): the ones the conventions advise."""

_READ_TRIES = 3  # a snapshot read off the loop's thread may meet a table changing size
_global: dict[str, Any] = {"on": False, "provider": None}
_lock = threading.Lock()
_ids = {"producer": itertools.count(1), "consumer": itertools.count(1)}


def enable(meter_provider: Any = None) -> None:
    """Meter every Producer and Consumer created from now on (``meter_provider``: default
    the global one, as ``opentelemetry.metrics.get_meter_provider()`` gives it when a client
    is created). ``smartnsq.observability.otel.instrument()`` calls it."""
    import opentelemetry.metrics  # noqa: F401  - fail here, not in a client, without the extra

    _global["on"] = True
    _global["provider"] = meter_provider


def disable() -> None:
    """Clients created from now on are not metered (unless given ``meter_provider=``)."""
    _global["on"] = False
    _global["provider"] = None


def enabled() -> bool:
    """Whether :func:`enable` (``smartnsq.observability.otel.instrument``) is in force for
    metrics."""
    return bool(_global["on"])


# -- stats -> observations (pure) ----------------------------------------------------------------

def _partition(attributes: dict[str, Any], partition: int | None) -> dict[str, Any]:
    if partition is not None:
        attributes["messaging.destination.partition.id"] = str(partition)
    return attributes


def sent_points(stats: Any) -> list[tuple[int, dict[str, Any]]]:
    """``messaging.client.sent.messages`` of a :class:`~smartnsq.observability.stats.ProducerStats`:
    ``(value, attributes)`` per (topic, partition), the messages acknowledged, and one per
    failure reason with ``error.type`` (failed publish *calls*: a failed ``publish_many``
    counts one, as ``ProducerStats.failed`` does; retried attempts are not counted apart)."""
    points: list[tuple[int, dict[str, Any]]] = []
    for part in stats.partitions:
        base = _partition({"messaging.system": SYSTEM, "messaging.operation.name": "publish",
                           "messaging.operation.type": "send",
                           "messaging.destination.name": part.topic}, part.partition)
        points.append((part.published, base))
        for reason, n in sorted(part.failed.items()):
            points.append((n, {**base, "error.type": reason}))
    return points


def consumed_points(stats: Any) -> list[tuple[int, dict[str, Any]]]:
    """``messaging.client.consumed.messages`` of a
    :class:`~smartnsq.observability.stats.ConsumerStats`: ``(value, attributes)`` per partition, the
    deliveries received (a redelivery counts again: once per delivery, as the conventions ask)."""
    return [(part.received, _partition(
        {"messaging.system": SYSTEM, "messaging.operation.name": "receive",
         "messaging.operation.type": "receive", "messaging.destination.name": stats.topic,
         "messaging.consumer.group.name": stats.channel,
         "messaging.destination.subscription.name": stats.channel}, part.partition))
        for part in stats.partitions]


# -- the instruments, one set per meter provider ------------------------------------------------

class _Instruments:
    """A meter provider's four instruments and the live clients its counters read."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.metrics import Observation

        self._observation = Observation
        self._lock = threading.Lock()
        # client id -> the client, weakly: a metered client is not kept alive by its meter
        self._producers: dict[str, weakref.ref[Any]] = {}
        self._consumers: dict[str, weakref.ref[Any]] = {}
        meter = provider.get_meter("smartnsq", __version__)
        meter.create_observable_counter(
            SENT, callbacks=[self._sent], unit="{message}",
            description="Messages the producer sent: acknowledged, or (with error.type) "
                        "publish calls that failed.")
        meter.create_observable_counter(
            CONSUMED, callbacks=[self._consumed], unit="{message}",
            description="Messages delivered to the consumer (redeliveries count again).")
        self.operation = _histogram(
            meter, OPERATION, "From a publish call to its acknowledgement, retries included; "
                              "sampled (smartnsq.observability.counters.PUBLISH_SAMPLE).")
        self.process = _histogram(
            meter, PROCESS,
            "The handler's time; sampled (smartnsq.observability.counters.HANDLER_SAMPLE).")

    def add(self, kind: str, client: Any) -> str:
        """Read ``client`` (``kind``: producer or consumer) at each collection; its id."""
        name = f"{kind}-{next(_ids[kind])}"
        table = self._producers if kind == "producer" else self._consumers
        with self._lock:
            table[name] = weakref.ref(client)
        return name

    def _live(self, table: dict[str, weakref.ref[Any]]) -> list[tuple[str, Any]]:
        """The clients to read now; closed or collected ones leave for good."""
        live = []
        with self._lock:
            for name, ref in list(table.items()):
                client = ref()
                closed = getattr(client, "closed", None)  # None: collected, or half-made
                if client is None or closed:
                    del table[name]
                elif closed is not None:  # (a client still in __init__: next time)
                    live.append((name, client))
        return live

    def _observe(self, table: dict[str, weakref.ref[Any]],
                 points: Callable[[Any], list[tuple[int, dict[str, Any]]]]) -> Iterator[Any]:
        observation = self._observation
        for name, client in self._live(table):
            stats = _read(client)
            if stats is None:
                continue
            for value, attributes in points(stats):
                attributes["messaging.client.id"] = name
                yield observation(value, attributes)

    def _sent(self, options: Any) -> Iterable[Any]:
        return list(self._observe(self._producers, sent_points))

    def _consumed(self, options: Any) -> Iterable[Any]:
        return list(self._observe(self._consumers, consumed_points))


def _histogram(meter: Any, name: str, description: str) -> Any:
    """A duration histogram with the conventions' buckets as advice, where the API takes
    advice (opentelemetry-api 1.30 and later; before, the SDK's default buckets or a view)."""
    try:
        return meter.create_histogram(name, unit="s", description=description,
                                      explicit_bucket_boundaries_advisory=DURATION_BOUNDS)
    except TypeError:
        return meter.create_histogram(name, unit="s", description=description)


def _read(client: Any) -> Any:
    """``client.stats()`` from the collecting thread (an asyncio client's tables may change
    size under the read: tried again), or None (logged): a callback never raises."""
    for attempt in range(_READ_TRIES):
        try:
            return client.stats()
        except RuntimeError:
            if attempt == _READ_TRIES - 1:
                log.warning("could not read %r's stats for its metrics", client,
                            exc_info=True)
        except Exception:
            log.warning("could not read %r's stats for its metrics", client, exc_info=True)
            return None
    return None


# a provider's instruments live as long as it does (a test's provider goes with its test)
_by_provider: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_strong: dict[int, _Instruments] = {}
_strong_providers: list[Any] = []


def _instruments(meter_provider: Any) -> _Instruments:
    provider = meter_provider if meter_provider is not None else _global["provider"]
    if provider is None:
        from opentelemetry import metrics

        provider = metrics.get_meter_provider()
    with _lock:
        try:
            found = _by_provider.get(provider)
        except TypeError:  # not weakly referable: kept for the process's life
            found = _strong.get(id(provider))
            if found is None:
                found = _strong[id(provider)] = _Instruments(provider)
                _strong_providers.append(provider)  # so that its id stays its own
            return found
        if found is None:
            found = _by_provider[provider] = _Instruments(provider)
    return found


def _wanted(meter_provider: Any) -> bool:
    return meter_provider is not None or bool(_global["on"])


# -- the clients' meters -------------------------------------------------------------------------

def producer_meter(producer: Any, meter: PublishMeter, meter_provider: Any) -> PublishMeter:
    """The meter ``producer`` should count with (``Producer.__init__`` calls it with its new,
    empty one): ``meter`` itself unless metrics are asked for (``meter_provider``, or
    :func:`enable` in force), else a :class:`MeteredPublishMeter` its metrics read."""
    if not _wanted(meter_provider):
        return meter
    instruments = _instruments(meter_provider)
    metered = MeteredPublishMeter(instruments.operation.record)
    instruments.add("producer", producer)
    return metered


def consumer_meter(consumer: Any, meter: ConsumeMeter, meter_provider: Any) -> ConsumeMeter:
    """The meter ``consumer`` should count with (``Consumer.__init__`` calls it with its new,
    empty one): ``meter`` itself unless metrics are asked for, else a
    :class:`MeteredConsumeMeter` for ``consumer.topic``/``channel``."""
    if not _wanted(meter_provider):
        return meter
    instruments = _instruments(meter_provider)
    metered = MeteredConsumeMeter(instruments.process.record, consumer.topic,
                                  consumer.channel)
    instruments.add("consumer", consumer)
    return metered


class MeteredPublishMeter(PublishMeter):
    """A producer's counters whose sampled publish (:meth:`timed`) is also recorded on
    ``messaging.client.operation.duration``; the other calls run the base class's code."""

    __slots__ = ("_attributes", "_record")

    def __init__(self, record: Callable[..., None]) -> None:
        super().__init__()
        self._record = record
        # id(counts) -> the attributes of its (topic, partition): the counts live as long
        # as the meter, so their ids stay theirs
        self._attributes: dict[int, dict[str, Any]] = {}

    def counts(self, topic: str, partition: int | None) -> PublishCounts:
        counts = super().counts(topic, partition)
        if id(counts) not in self._attributes:  # (a new partition: rare)
            self._attributes[id(counts)] = _partition(
                {"messaging.system": SYSTEM, "messaging.operation.name": "publish",
                 "messaging.operation.type": "send", "messaging.destination.name": topic},
                partition)
        return counts

    def timed(self, counts: PublishCounts, start: float,  # type: ignore[override]
              clock: Callable[[], float]) -> None:
        PublishMeter.timed(counts, start, clock)
        self._record(clock() - start, self._attributes.get(id(counts)))


class MeteredConsumeMeter(ConsumeMeter):
    """A consumer's counters whose sampled handler calls (:meth:`timed`,
    :meth:`timed_async`) are also recorded on ``messaging.process.duration``, with
    ``error.type`` when the handler raised."""

    __slots__ = ("_attributes", "_channel", "_record", "_topic")

    def __init__(self, record: Callable[..., None], topic: str, channel: str) -> None:
        super().__init__()
        self._record = record
        self._topic = topic
        self._channel = channel
        # (partition, error type or None) -> attributes, made once each
        self._attributes: dict[tuple[int | None, str | None], dict[str, Any]] = {}

    def _attributes_of(self, message: Any, error: BaseException | None
                       ) -> dict[str, Any]:
        partition = message.partition if message.youzan else None
        reason = None if error is None else reason_of(error)
        key = (partition, reason)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = _partition(
                {"messaging.system": SYSTEM, "messaging.operation.name": "process",
                 "messaging.operation.type": "process",
                 "messaging.destination.name": self._topic,
                 "messaging.consumer.group.name": self._channel,
                 "messaging.destination.subscription.name": self._channel}, partition)
            if reason is not None:
                attributes["error.type"] = reason
            self._attributes[key] = attributes
        return attributes

    def _done(self, started: float, message: Any, error: BaseException | None) -> None:
        seconds = perf_counter() - started
        self.handler.observe(seconds)
        self._record(seconds, self._attributes_of(message, error))

    def timed(self, handler: Callable[[Any], T], message: Any) -> T:
        started = perf_counter()
        try:
            result = handler(message)
        except BaseException as exc:
            self._done(started, message, exc)
            raise
        self._done(started, message, None)
        return result

    async def timed_async(self, handler: Callable[[Any], Awaitable[Any]],
                          message: Any) -> Any:
        started = perf_counter()
        try:
            result = await handler(message)
        except BaseException as exc:
            self._done(started, message, exc)
            raise
        self._done(started, message, None)
        return result
