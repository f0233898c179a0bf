"""Blocking, thread-safe facades over the asyncio clients (for WSGI apps, Spark executors, scripts).

Each facade owns an async client living on a background event loop
(:class:`smartnsq.transport.loop_thread.LoopThread`, one per process by default, shared by every
facade) and forwards each call to it, blocking until the async call finishes. The logic
exists once, in the async client; a facade only crosses threads. Many threads may call one
facade at once: their publishes meet on the loop, where the connection coalesces them into
few socket writes, so a thread pool publishing through one ``smartnsq.sync.Producer`` gets
the same batching an asyncio program gets.

Facades are for code outside an event loop. Inside one (or in a callback running on the
facade's own loop) use the async clients: a blocking call there raises ``RuntimeError``
rather than deadlock.

Constructors do not wait for the network: they build the async client (checking every
argument) and return; the producer connects on its first call, within that call's deadline,
and the consumer's subscriptions come up in the background.

A facade's error is the async call's own (``Timeout``, ``TopicNotFound``, ``ServerError``...,
with their causes). Only when the async call overruns its own deadline by ``_GUARD`` seconds
does the facade give up on it, with a ``Timeout`` saying so (its cause is the loop thread's
``LoopTimeout``).

Writing another facade: subclass ``_Facade``, build the async client with
``self._start(factory)`` and forward calls with ``self._run(coro, timeout, what)``; async
iterators go through ``self._loop_thread.iterate(...)``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import threading
import weakref
from collections.abc import (
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .config import ConnectionConfig, close_timeout, keyword_options, refuse_unknown
from .consumer.config import ConsumerConfig
from .consumer.core import Consumer as AsyncConsumer
from .consumer.options import ConsumerOptions
from .errors import ClientClosed, InvalidArgument, LoopTimeout, Timeout
from .message import Message
from .model.routes import TopicRoutes
from .model.sharding import ShardingKey
from .producer.config import ProducerConfig
from .producer.options import ProducerOptions
from .producer.producer import Producer as AsyncProducer
from .producer.results import BatchResult, PublishResult
from .producer.validation import batch_items
from .protocol.numbers import check_int, is_real
from .transport import loop_thread as _loops
from .transport.event_loop import warn_if_blocking_a_loop
from .transport.loop_thread import LoopThread, Slot

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .model.routes import RouteSource
    from .observability.stats import ConsumerStats, ProducerStats

__all__ = ["Consumer", "Producer"]

T = TypeVar("T")
F = TypeVar("F", bound="_Facade")

log = logging.getLogger("smartnsq.sync")

# Extra time a blocking call waits beyond the async call's own deadline before giving up on
# it: the async layer enforces deadlines itself; this only guards against a wedged loop.
_GUARD = 5.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what sync.Consumer.run() drains on


def _finalize(loop_thread: LoopThread, shared: bool,
              closer: Callable[[], Coroutine[Any, Any, None]] | None,
              grace: float = 0.0) -> None:
    """Close the async client and give the loop back (on close() or garbage collection)."""
    try:
        if closer is not None and loop_thread.running and not loop_thread.in_loop_thread():
            try:
                loop_thread.run(closer(), timeout=_GUARD + grace)
            except Exception:
                log.debug("closing a facade's client failed", exc_info=True)
    finally:
        if shared:
            _loops.release_shared(loop_thread)


def _read(loop_thread: LoopThread, read: Callable[[], T]) -> T:
    """``read()`` on the loop thread, which is what mutates the client's state; directly once
    that loop is gone (nothing mutates it any more)."""
    if loop_thread.running and not loop_thread.in_loop_thread():
        return loop_thread.call(read)
    return read()


def _overran(what: str, timeout: float | None) -> Timeout:
    return Timeout(f"{what} did not finish within its {timeout:g}s deadline (+{_GUARD:g}s): "
                   "the call overran its deadline or the event loop thread is blocked")


def _guard_for(timeout: object) -> float:
    """How long a blocking call waits for the loop: the async deadline plus ``_GUARD`` (a
    bad ``timeout`` is the async call's to refuse, with ``InvalidArgument``)."""
    if is_real(timeout) and timeout > 0:
        return float(timeout) + _GUARD
    return _GUARD


class _Facade:
    """Shared machinery of the blocking facades: the loop thread, calls, closing."""

    _instead = "use the asyncio client"  # what to use in async code (each facade names its own)

    def __init__(self, loop_thread: LoopThread | None) -> None:
        if loop_thread is not None and not isinstance(loop_thread, LoopThread):
            raise InvalidArgument("loop_thread", "must be a smartnsq.LoopThread (or None for the "
                                  "shared one)", loop_thread)
        self._shared = loop_thread is None
        self._loop_thread = _loops.shared() if loop_thread is None else loop_thread.start()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    def _start(self, factory: Callable[[], T],
               closer_of: Callable[[T], Callable[[], Coroutine[Any, Any, None]]],
               grace: Callable[[T], float] | None = None) -> T:
        """Build the async client on the loop (no I/O: construction only checks arguments);
        register its closing for close() and GC (``grace``: how much longer than the usual
        guard the closing may take)."""
        try:
            client = self._loop_thread.call(factory, timeout=_GUARD)
        except LoopTimeout as exc:
            if self._shared:
                _loops.release_shared(self._loop_thread)
            raise Timeout(f"the event loop thread did not build the client within "
                          f"{_GUARD:g}s (is it blocked?)") from exc
        except BaseException:
            if self._shared:
                _loops.release_shared(self._loop_thread)
            raise
        self._finalizer = weakref.finalize(self, _finalize, self._loop_thread, self._shared,
                                           closer_of(client),
                                           0.0 if grace is None else grace(client))
        return client

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None, what: str = "") -> T:
        """Run ``coro`` on the loop and wait; ``timeout`` is the async call's own deadline.
        The call's errors are raised as they are; the facade's guard only ends a call that
        overran that deadline by ``_GUARD`` seconds."""
        if self._closed:
            coro.close()
            raise self._closed_error()
        guard = None if timeout is None else timeout + _GUARD
        future = self._loop_thread.submit(coro)  # (refused on the loop's own thread)
        warn_if_blocking_a_loop(f"smartnsq.sync.{type(self).__name__}", self._instead, 2)
        try:
            return self._loop_thread.wait(future, guard)
        except LoopTimeout as exc:
            raise _overran(what or type(self).__name__, timeout) from exc

    def _closed_error(self) -> ClientClosed:
        """What a call on a closed facade raises (a ``ConnectionFailed``, as the async
        client's calls raise after close, and a ``RuntimeError``, as they raised before)."""
        return ClientClosed(f"this {type(self).__name__} is closed")

    def close(self) -> None:
        """Close the async client and release the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def loop_thread(self) -> LoopThread:
        return self._loop_thread

    def __enter__(self: F) -> F:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@keyword_options(ProducerConfig, ConnectionConfig)
class Producer(_Facade):
    """``smartnsq.Producer`` as blocking calls; safe to share between threads.

    Takes the async Producer's arguments, plus ``loop_thread`` (a started
    ``smartnsq.transport.loop_thread.LoopThread``; default: the process-wide one). Nothing is
    dialled at construction: the first call connects, within its deadline. Use it as a context
    manager or call ``close()``::

        with smartnsq.sync.Producer(lookupd=["127.0.0.1:4161"]) as producer:
            producer.publish("orders", b"...", sharding_key=order_id)
    """

    _instead = "await smartnsq.Producer's methods"

    def __init__(self, lookupd: Sequence[str] | str | None = None,
                 nsqd: Sequence[str] | str | None = None, *,
                 config: ProducerConfig | None = None, source: RouteSource | None = None,
                 lookup: Any = None, lookup_options: Mapping[str, Any] | None = None,
                 tracer_provider: Any = None, meter_provider: Any = None,
                 loop_thread: LoopThread | None = None,
                 **options: Unpack[ProducerOptions]) -> None:
        # refused before the loop thread is taken, with this facade's parameters suggested
        refuse_unknown("Producer", options, ProducerOptions.__annotations__, Producer.__init__)
        super().__init__(loop_thread)

        def create() -> AsyncProducer:
            # not started: the first call connects, within its own deadline
            return AsyncProducer(lookupd, nsqd, config=config, source=source, lookup=lookup,
                                 lookup_options=lookup_options,
                                 tracer_provider=tracer_provider,
                                 meter_provider=meter_provider, **options)

        # closing waits for unanswered publishes (drain_timeout) before the usual guard
        self._producer = self._start(create, lambda p: p.close,
                                     lambda p: p.config.drain_timeout)
        self._timeout = self._producer.config.timeout

    def publish(self, topic: str, body: bytes, *, sharding_key: ShardingKey | None = None,
                partition: int | None = None, trace_id: int | None = None,
                headers: Mapping[str, str] | None = None, delay: float | None = None,
                timeout: float | None = None) -> PublishResult:
        """Blocking ``Producer.publish``: same arguments, result and errors."""
        # No coroutine, no Task, no future: the loop runs the task-free publish_nowait path
        # with a Slot as its result, which the answer settles directly, waking this thread in
        # the loop step that read it (argument errors included).
        if self._closed:
            raise self._closed_error()
        slot: Slot[PublishResult] = self._loop_thread.call_slot(
            self._publish_on_loop, topic, body, sharding_key, partition, trace_id, headers,
            delay, timeout)
        warn_if_blocking_a_loop("smartnsq.sync.Producer.publish", self._instead)
        deadline = self._timeout if timeout is None else timeout
        try:
            return self._loop_thread.wait(slot, _guard_for(deadline))
        except LoopTimeout as exc:
            raise _overran(f"publish to {topic!r}", _guard_for(deadline) - _GUARD) from exc

    def _publish_on_loop(self, topic: str, body: bytes, sharding_key: ShardingKey | None,
                         partition: int | None, trace_id: int | None,
                         headers: Mapping[str, str] | None, delay: float | None,
                         timeout: float | None, slot: Slot[PublishResult]) -> None:
        if self._closed:  # closed while this call was queued
            raise self._closed_error()
        # (a Slot settles like the asyncio future publish_nowait would otherwise create)
        self._producer._nowait(cast("asyncio.Future[PublishResult]", slot), topic, body,
                               sharding_key, partition, trace_id, headers, delay, timeout)

    def publish_many(self, topic: str, bodies: Iterable[bytes], *,
                     sharding_key: ShardingKey | None = None, partition: int | None = None,
                     trace_id: int | Sequence[int] | None = None,
                     headers: Mapping[str, str] | Sequence[Mapping[str, str] | None]
                     | None = None,
                     timeout: float | None = None) -> BatchResult:
        """Blocking ``Producer.publish_many``: same arguments, result and errors."""
        return self._run(self._producer.publish_many(
            topic, batch_items(bodies), sharding_key=sharding_key, partition=partition,
            trace_id=trace_id, headers=headers, timeout=timeout),
            self._timeout if timeout is None else timeout, f"publish_many to {topic!r}")

    def routes(self, topic: str, timeout: float | None = None) -> TopicRoutes:
        """The topic's current routes (partition count, leaders, meta), looked up if unknown."""
        return self._run(self._producer.routes(topic, timeout),
                         self._timeout if timeout is None else timeout, f"routes of {topic!r}")

    def set_trace(self, enabled: bool | None, topic: str | None = None) -> None:
        """``Producer.set_trace``, applied on the loop thread."""
        if self._closed:
            raise self._closed_error()
        self._loop_thread.call(self._producer.set_trace, enabled, topic)

    def trace_enabled(self, topic: str) -> bool | None:
        return self._producer.trace_enabled(topic)

    def stats(self) -> ProducerStats:
        """``Producer.stats()``, taken on the loop thread."""
        return _read(self._loop_thread, self._producer.stats)

    @property
    def config(self) -> ProducerConfig:
        return self._producer.config

    @property
    def async_producer(self) -> AsyncProducer:
        """The async Producer behind this facade (use it only on ``loop_thread.loop``)."""
        return self._producer

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<smartnsq.sync.Producer {state}>"


_handler_thread = threading.local()


@keyword_options(ConsumerConfig, ConnectionConfig, skip={"concurrency"})
class Consumer(_Facade):
    """``smartnsq.Consumer`` for code without an event loop: the handler runs in a
    thread pool, so it may block (database calls, HTTP requests...).

    Same arguments as the async Consumer (``handler`` is a plain function taking a
    :class:`~smartnsq.message.Message`; return -> FIN, raise -> REQ), plus ``threads`` (the
    pool size, which is the handler concurrency; default ``min(32, max_in_flight)``) and
    ``loop_thread``. Subscriptions start at construction, in the background (the constructor
does not wait for lookupd or nsqd; ``run()`` and iteration raise a failed start's error)::

        consumer = smartnsq.sync.Consumer("orders", "billing", lookupd=[...], handler=handle)
        consumer.run()  # blocks until stop(), Ctrl-C or SIGTERM; then drains and returns

    Without a handler, iterate: ``for message in consumer: ...; message.fin()``.
    ``message.fin()/req()/touch()`` may be called from any thread. ``stop()`` is thread-safe
    and never blocks (a handler may call it); ``close()`` stops and waits for the drain.
    """

    _instead = "use smartnsq.Consumer (await consumer.join(), async for)"

    def __init__(self, topic: str, channel: str, lookupd: Sequence[str] | str | None = None,
                 nsqd: Sequence[str] | str | None = None,
                 handler: Callable[[Message], Any] | None = None, *,
                 threads: int | None = None, loop_thread: LoopThread | None = None,
                 lookup: Any = None, config: ConsumerConfig | ConnectionConfig | None = None,
                 tracer_provider: Any = None, meter_provider: Any = None,
                 **options: Unpack[ConsumerOptions]) -> None:
        if handler is not None and not callable(handler):
            raise InvalidArgument("handler", "must be callable", handler)
        if "concurrency" in options:
            raise InvalidArgument("concurrency", "the sync Consumer's concurrency is threads=")
        # refused before a thread is started, with this facade's parameters suggested
        refuse_unknown("Consumer", options, ConsumerOptions.__annotations__, Consumer.__init__)
        max_in_flight = options.get("max_in_flight", 100)
        if threads is None:
            threads = max(1, min(32, max_in_flight if isinstance(max_in_flight, int) else 1))
        check_int("threads", threads, 1)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        wrapper = None
        if handler is not None:
            executor = self._executor = concurrent.futures.ThreadPoolExecutor(
                threads, thread_name_prefix=f"smartnsq-handler-{topic}")

            def in_thread(msg: Message) -> Any:
                _handler_thread.active = True
                try:
                    return handler(msg)
                finally:
                    _handler_thread.active = False

            async def wrapper(msg: Message) -> None:
                await asyncio.get_running_loop().run_in_executor(executor, in_thread, msg)

        super().__init__(loop_thread)

        given: dict[str, Any] = {**options,
                                 "concurrency": threads if wrapper is not None else None}

        def create() -> AsyncConsumer:
            return AsyncConsumer(topic, channel, lookupd, nsqd, wrapper, lookup=lookup,
                                 config=config, tracer_provider=tracer_provider,
                                 meter_provider=meter_provider, **given)

        try:
            self._consumer = self._start(create, lambda c: c.close)
        except BaseException:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            raise
        self._stopped = threading.Event()
        # subscriptions come up in the background: the constructor does not wait for them
        self._starting = self._loop_thread.submit(self._consumer.start())

    def _started(self) -> None:
        """Wait for the background start; raise what it raised (its own error, as is)."""
        self._loop_thread.wait(self._starting)

    def run(self, timeout: float | None = None, *,
            stop_on: Iterable[int] = _STOP_SIGNALS) -> bool:
        """Block until the consumer is stopped and drained (or ``timeout`` s pass: then
        return False and keep consuming).

        Called on the main thread, the signals in ``stop_on`` (Ctrl-C's SIGINT and the
        SIGTERM a container's stop sends) stop it as ``stop()`` does: what is in flight is
        handled and answered within ``drain_timeout``, and ``run()`` returns True instead of
        a ``KeyboardInterrupt`` leaving work half done. A second signal while draining acts
        as it did before ``run()`` (Ctrl-C raises). The handlers are restored on return;
        ``stop_on=()`` installs none."""
        if self._closed and self._stopped.is_set():
            return True
        self._started()
        future = self._loop_thread.submit(self._consumer.join())
        previous = self._catch(stop_on)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self._after_stop()
        return True

    def _catch(self, signals: Iterable[int]) -> dict[int, Any]:
        """Install the stopping handlers (main thread only: Python's rule); the previous
        handlers, to restore."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def stopping(signum: int, frame: object) -> None:
            log.info("%s received: draining the consumer (again to interrupt)",
                     signal.Signals(signum).name)
            for each, handler in previous.items():  # a second signal: as before run()
                signal.signal(each, handler)
            self.stop()

        for signum in signals:
            previous[signum] = signal.signal(signum, stopping)
        return previous

    def stop(self) -> None:
        """Ask the consumer to drain and close; returns at once, from any thread."""
        if self._consumer.closed or not self._loop_thread.running:
            return

        def begin() -> None:
            asyncio.get_running_loop().create_task(self._consumer.close())

        self._loop_thread.call_soon(begin)

    def close(self, timeout: float | None = None) -> None:
        """Drain, close the connections and release the loop thread, all within ``timeout``
        (default the consumer's ``drain_timeout``; the async ``close`` says what is aborted
        at the deadline). From a handler thread use ``stop()``."""
        if getattr(_handler_thread, "active", False):
            raise RuntimeError("close() from a handler would wait for itself; use stop()")
        deadline = close_timeout(timeout, self._consumer.drain_timeout)
        if self._closed:
            return
        if not self._starting.done():
            self._loop_thread.abandon(self._starting)  # a start still under way ends here
        if self._loop_thread.running and not self._consumer.closed:
            try:
                self._run(self._consumer.close(deadline), deadline, "close")
            except Exception:
                log.warning("closing the consumer failed", exc_info=True)
        self._after_stop()
        super().close()

    def _after_stop(self) -> None:
        self._stopped.set()
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def __iter__(self) -> Iterator[Message]:
        if self._closed:
            raise self._closed_error()
        self._started()
        aiterator = self._consumer.__aiter__()
        return self._loop_thread.iterate(aiterator, getattr(aiterator, "aclose", None))

    def set_max_in_flight(self, n: int) -> None:
        if self._closed:
            raise self._closed_error()
        self._loop_thread.call(self._consumer.set_max_in_flight, n)

    def set_trace(self, enabled: bool | None) -> None:
        if self._closed:
            raise self._closed_error()
        self._loop_thread.call(self._consumer.set_trace, enabled)

    def is_starved(self) -> bool:
        if self._closed:
            raise self._closed_error()
        return bool(self._loop_thread.call(self._consumer.is_starved))

    def stats(self, lag: bool = False, timeout: float = 5.0) -> ConsumerStats:
        """``Consumer.stats()``, taken on the loop thread (after ``close()``: the last
        snapshot); ``lag=True`` first reads the channel's backlog from the nodes
        (``Consumer.lag``, within ``timeout``), which needs an open consumer."""
        if lag:
            if self._closed:
                raise self._closed_error()
            self._run(self._consumer.lag(timeout), timeout, "lag")
        return _read(self._loop_thread, self._consumer.stats)

    @property
    def async_consumer(self) -> AsyncConsumer:
        """The async Consumer behind this facade (use it only on ``loop_thread.loop``)."""
        return self._consumer

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<smartnsq.sync.Consumer {self._consumer.topic}/{self._consumer.channel} {state}>"
