"""The asyncio Consumer: lifecycle, the public API, and the parts wired together.

A consumer holds one subscription per (nsqd, partition) it reads from (``subscription.py``):
with ``lookupd=[...]`` the partitions' leaders from ``access=r`` lookups (``discovery.py``; a
youzan nsqd serves a partition's consumers only on its leader) plus the plain nodes of a
classic topic; with ``nsqd=[...]`` each given node, for each of ``partitions`` (or its default
partition). Messages go from the links (``link.py``) through one queue (``dispatch.py``) to a
fixed set of workers (``handling.py``); RDY is spread by the flow control (``flow.py``
over ``smartnsq.model.rdy``). Everything these parts share is one :class:`~.runtime.Runtime`,
handed to each.

Closing is one deadline (``close(timeout)``, default ``drain_timeout``): RDY 0, what was
received but not started requeued, running handlers given until shortly before the deadline,
then CLS/CLOSE_WAIT and the connection closes of every subscription at once; at the deadline
the rest is aborted, so a stalled peer costs the close nothing beyond its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ..config import ConnectionConfig, close_timeout, keyword_options, one_source
from ..errors import InvalidArgument
from ..message import Message
from ..model.routes import Address, address_list, address_text, parse_address
from ..observability import otel, otel_metrics
from ..protocol import validate as v
from ..protocol.numbers import check_int
from ..transport.connection import Connection
from .config import ConsumerConfig, Handler, build_config
from .deadletter import DeadLetters
from .discovery import Discovery
from .dispatch import Dispatch
from .flow import Flow
from .handling import inline_runner, is_async, iterate, worker
from .link import link_of
from .runtime import Runtime
from .subscription import ABORT_GRACE, Subscriptions, reconnect_delay
from .targets import static_targets

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..observability.stats import ChannelLag, ConsumerStats
    from ..producer.producer import Producer
    from .options import ConsumerOptions

__all__ = ["Consumer"]

log = logging.getLogger("smartnsq.consumer")

# the most of close()'s timeout kept from the drain for CLS and closing the connections
_CLOSE_RESERVE: Final = 1.0
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)  # what run() drains on


@keyword_options(ConsumerConfig, ConnectionConfig)
class Consumer:
    """Consumes one topic's channel from youzan NSQ (partitions, ordered, ext) or classic NSQ.

    ::

        async with Consumer("orders", "billing", lookupd=["127.0.0.1:4161"],
                            handler=handle) as consumer:
            await consumer.join()          # until close() (from a handler, a signal...)

        async with Consumer("orders", "billing", lookupd=[...]) as consumer:
            async for message in consumer:  # no handler: iterate, answer by hand
                ...
                message.fin()

    Discovery: exactly one of ``lookupd=`` (``"host:http_port"`` of nsqlookupds), ``nsqd=``
    (``"host:tcp_port"`` of nodes read directly, each for each of ``partitions`` or its default
    partition) or ``lookup=`` (a started or unstarted ``smartnsq.discovery.lookup.LookupManager`` to
    share).

    Handling: ``handler(message)`` (plain function or coroutine function): return -> FIN,
    raise -> REQ (delay from ``requeue_policy``, counted for backoff).

    Options: ``config=`` a :class:`ConsumerConfig` (or a ``ConnectionConfig`` for the
    connections), and/or its fields as keywords (``max_in_flight=10``, ``ordered=True``...),
    and ConnectionConfig fields as keywords (``msg_timeout=30``...); keywords override
    ``config``. Every option is listed below. ``tracer_provider``:
    OpenTelemetry spans per handled message (``smartnsq.observability.otel``); ``meter_provider``:
    OpenTelemetry's messaging metrics (``smartnsq.observability.otel_metrics``).
    """

    def __init__(self, topic: str, channel: str, lookupd: Sequence[str] | str | None = None,
                 nsqd: Sequence[str] | str | None = None, handler: Handler | None = None, *,
                 lookup: Any = None, config: ConsumerConfig | ConnectionConfig | None = None,
                 tracer_provider: Any = None, meter_provider: Any = None,
                 **options: Unpack[ConsumerOptions]) -> None:
        v.check_topic(topic)
        v.check_channel(channel)
        self.topic = topic
        self.channel = channel
        one_source("Consumer", lookupd=lookupd, nsqd=nsqd, lookup=lookup)
        self._nsqd: tuple[Address, ...] = ()
        if nsqd is not None:
            self._nsqd = tuple(dict.fromkeys(
                parse_address(a, "nsqd") for a in address_list(nsqd, "nsqd")))
            if not self._nsqd:
                raise InvalidArgument("nsqd", "needs at least one address", nsqd)
        self._lookupd: list[str] = address_list(lookupd, "lookupd")
        self._lookup = lookup
        if handler is not None and not callable(handler):
            raise InvalidArgument("handler", "must be callable", handler)
        self._handler = handler
        self.config = cfg = build_config(config, options, Consumer.__init__)
        # spans around the handler and give-ups, when asked for (observability.otel)
        handler, self.config = otel.consumer_tracing(topic, channel, handler, cfg,
                                                     tracer_provider)
        cfg = self.config
        self._handler = handler
        if cfg.ordered and self._nsqd and cfg.partitions is None:
            raise InvalidArgument("partitions", "ordered consumption from nsqd= addresses "
                                  "needs partitions=[...]")
        concurrency = cfg.concurrency
        if concurrency is None and handler is not None:
            concurrency = (max(1, min(cfg.max_in_flight, 10_000)) if is_async(handler)
                           else 1)
        self._concurrency = concurrency or 0
        self._max_in_flight = cfg.max_in_flight
        self._rt = Runtime(topic, channel, cfg)
        self._rt.meter = otel_metrics.consumer_meter(self, self._rt.meter, meter_provider)
        if cfg.dead_letter is not None:
            self._rt.dead_letters = DeadLetters(topic, channel, cfg, self._dead_letter_producer)
        self._subs: Subscriptions | None = None
        self._discovery: Discovery | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._close_task: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        # done once closed; a future, not an Event, so that waiting on it with a timeout
        # needs no task of its own (one would outlive a timed-out wait by a loop turn)
        self._closed_signal: asyncio.Future[None] | None = None
        self._deadline = 0.0  # close()'s, in loop time
        self._lag: ChannelLag | None = None  # the last lag() reading, for stats()
        self._started = False
        self._closing = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> Consumer:
        """Start discovering and subscribing (``async with`` does it). Returns at once:
        subscriptions come up in the background and retry on their own."""
        if self._closed or self._closing:
            raise RuntimeError("a closed Consumer cannot start again")
        if self._started:
            return self
        self._started = True
        rt, cfg = self._rt, self.config
        loop = rt.loop = asyncio.get_running_loop()
        rt.loop_thread_id = threading.get_ident()
        rt.queue = Dispatch(loop)
        self._closed_signal = loop.create_future()
        rt.flow = Flow(loop, self._max_in_flight, cfg.backoff_policy, cfg.rdy_tick_interval,
                       cfg.low_rdy_idle_timeout)
        handler = self._handler
        rt.concurrency = self._concurrency
        if handler is not None and not is_async(handler):
            rt.run_now = inline_runner(rt, handler)
        if handler is not None:
            for i in range(self._concurrency):
                self._workers.append(loop.create_task(
                    worker(rt, handler), name=f"smartnsq-consumer {self.topic} worker {i}"))
        try:
            if self._nsqd:
                self._subs = Subscriptions(rt, static=True, refresh=None, fatal=self._fail)
                self._subs.apply(static_targets(self._nsqd, cfg.partitions))
            else:
                discovery = self._discovery = Discovery(
                    self.topic, self._lookupd, self._lookup, dict(cfg.lookup_options),
                    cfg.partitions, apply=self._apply_targets, delay=self._reconnect_delay,
                    fatal=self._fail, give_up_after=cfg.discovery_timeout)
                self._subs = Subscriptions(rt, static=False, refresh=discovery.refresh,
                                           fatal=self._fail)
                discovery.start()
        except BaseException:
            await self.close()
            raise
        return self

    def _dead_letter_producer(self) -> Producer:
        """The producer of ``dead_letter``'s topic, made at the first park: on the consumer's
        own lookupds (or lookup manager, or nsqd) with its connection settings, so the
        dead-letter topic is reached the way the topic itself is."""
        from ..producer.config import ProducerConfig
        from ..producer.producer import Producer

        cfg = self.config
        config = ProducerConfig(connection=cfg.connection, classic=cfg.classic)
        if self._nsqd:
            return Producer(nsqd=[address_text(a) for a in self._nsqd], config=config)
        if self._lookup is not None:
            return Producer(lookup=self._lookup, config=config)
        return Producer(lookupd=self._lookupd, config=config,
                        lookup_options=dict(cfg.lookup_options))

    def _apply_targets(self, targets: Any) -> None:
        self._rt.meter.targets(targets)  # leader changes, for stats()
        if self._subs is not None and not self._closing:
            self._subs.apply(targets)

    def _reconnect_delay(self, failures: int) -> float:
        return reconnect_delay(self.config, failures)

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def join(self) -> None:
        """Wait until the consumer is closed (by ``close()`` from elsewhere). Raises the
        error that closed it (a configuration that cannot work), if one did."""
        if not self._started:
            await self.start()
        assert self._closed_signal is not None
        await asyncio.shield(self._closed_signal)
        if self._fatal is not None:
            raise self._fatal

    async def run(self, timeout: float | None = None, *,
                  stop_on: Iterable[int] = _STOP_SIGNALS) -> bool:
        """Start if needed and wait until the consumer is closed (True), or until ``timeout``
        seconds pass (False: it keeps consuming); raise the error that closed it, as join().

        Run on the main thread's loop, the signals in ``stop_on`` (Ctrl-C's SIGINT and the
        SIGTERM a container's stop sends) close it as ``close()`` does: what is in flight is
        handled and answered within ``drain_timeout``, and ``run()`` returns True instead of
        the program ending in a ``KeyboardInterrupt`` traceback with work half done. A second
        signal while draining acts as it did before ``run()`` (under ``asyncio.run``, Ctrl-C
        interrupts). The previous handlers are back when it returns; ``stop_on=()``, or a
        loop on another thread (Python's signals reach only the main thread), installs none.
        """
        loop = asyncio.get_running_loop()
        if self._closed:
            return self._ran()
        # taken before anything waits, so that a signal right after run() began is caught
        restore = self._catch(loop, stop_on)
        try:
            if not self._started:
                await self.start()
            assert self._closed_signal is not None
            # (asyncio.wait leaves the future alone when it times out or is cancelled)
            done, _ = await asyncio.wait({self._closed_signal}, timeout=timeout)
        finally:
            restore()
        return self._ran() if done else False

    def _ran(self) -> bool:
        if self._fatal is not None:
            raise self._fatal
        return True

    def _catch(self, loop: asyncio.AbstractEventLoop,
               signals: Iterable[int]) -> Callable[[], None]:
        """Make ``signals`` close the consumer; the function that puts back what they did
        before (idempotent: the first signal calls it, so that a second one acts as before)."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous: dict[int, Any] = {}

        def restore() -> None:
            for signum, handler in previous.items():
                loop.remove_signal_handler(signum)
                # (remove_signal_handler resets to the default, not to what was there)
                signal.signal(signum, handler)
            previous.clear()

        def stopping(signum: int) -> None:
            log.info("%s received: draining %s/%s (again to interrupt)",
                     signal.Signals(signum).name, self.topic, self.channel)
            restore()
            if not self._closing and self._close_task is None:
                self._close_task = loop.create_task(self.close())

        for signum in signals:
            if signum in previous:
                continue
            handler = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, stopping, signum)
            except NotImplementedError:
                # a loop without signal support (Windows' proactor, some embeddings): as
                # stop_on=(); what was installed so far is put back
                restore()
                return lambda: None
            except (RuntimeError, ValueError, TypeError) as exc:  # SIGKILL, not a signal...
                restore()
                raise InvalidArgument("stop_on", f"cannot catch it ({exc})", signum) from None
            previous[signum] = handler
        return restore

    def _fail(self, error: BaseException) -> None:
        """A subscription found the configuration unworkable: close, report from join()."""
        if self._fatal is None:
            self._fatal = error
            log.error("%s/%s: %s; closing the consumer", self.topic, self.channel, error)
        if not self._closing and self._close_task is None:
            self._close_task = self._rt.loop.create_task(self.close())

    @property
    def error(self) -> BaseException | None:
        """The error that closed the consumer, if any."""
        return self._fatal

    async def close(self, timeout: float | None = None) -> None:
        """Drain and close, all within ``timeout`` seconds (``None``: ``drain_timeout``).

        RDY 0; what was received but not started is requeued; running handlers get until
        shortly before the deadline to finish (and answer); then CLS, waiting for
        CLOSE_WAIT, and the closing of every connection, all at once. Whatever is not done at
        the deadline is aborted: connections dropped, tasks cancelled, and the messages still
        unanswered left to the server, which redelivers them (a message whose handler did not
        succeed is never FINed). A second ``close()`` with an earlier deadline brings the
        first one's forward. Idempotent. Called from a handler it returns at once and the
        close proceeds when the handler returns."""
        timeout = close_timeout(timeout, self.config.drain_timeout)
        current = asyncio.current_task()
        if current is not None and current in self._workers:
            # from a handler: the drain waits for this very handler, so it cannot be awaited
            # here; it goes on once the handler returns
            if not self._closing:
                self._close_task = self._rt.loop.create_task(self.close(timeout))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._closing:
            await self._closed_by(deadline)
            return
        self._closing = True
        if not self._started:
            self._closed = True
            return
        self._deadline = deadline
        try:
            await self._close(timeout)
        except BaseException:
            # cancelled (or a bug): nothing may outlive the close, so everything stops now
            self._abort()
            self._finished()
            raise

    async def _close(self, timeout: float) -> None:
        rt, loop = self._rt, self._rt.loop
        subs = self._subs
        if subs is not None:
            subs.closing = True
        if self._discovery is not None:
            self._discovery.stop()
        rt.draining = True
        rt.flow.freeze()
        self._requeue_waiting()
        if rt.in_flight > 0:
            # the drain leaves a little of the time to CLS and the closes
            reserve = min(_CLOSE_RESERVE, timeout / 4)
            waiter = rt.idle_waiter = loop.create_future()
            drain = max(0.0, self._deadline - reserve - loop.time())
            await asyncio.wait({waiter}, timeout=drain)
            if not waiter.done():
                log.warning("%s/%s: %d messages still unanswered after a %.3gs drain (close "
                            "timeout %gs); closing anyway (the server redelivers them)",
                            self.topic, self.channel, rt.in_flight, drain, timeout)
        if subs is not None:
            await subs.close(self._deadline)
        rt.queue.stop()
        for task in self._workers:
            task.cancel()
        ending = [t for t in self._workers if not t.done()]
        if self._discovery is not None:
            ending.append(loop.create_task(self._discovery.close()))
        if rt.dead_letters is not None:  # (after the drain: a running handler may park)
            ending.append(loop.create_task(rt.dead_letters.close(
                max(0.0, self._deadline - loop.time()))))
        if ending:
            # until the deadline, and at least a moment: the handlers were just cancelled,
            # releasing the lookup is quick; what does not end is left behind
            left = max(self._deadline - loop.time(), ABORT_GRACE)
            _, still = await asyncio.wait(ending, timeout=left)
            for task in still:
                task.cancel()
            if still:
                log.warning("%s/%s: %d tasks (handlers, lookup) did not end in time; left "
                            "behind", self.topic, self.channel, len(still))
        self._finished()

    async def _closed_by(self, deadline: float) -> None:
        """A close is already under way: wait for it until our own deadline, bringing its
        deadline forward to ours (by aborting what is left) when ours is earlier."""
        closed = self._closed_signal
        if closed is None or closed.done():
            return
        loop = asyncio.get_running_loop()
        # (asyncio.wait leaves the future alone when it times out or is cancelled)
        await asyncio.wait({closed}, timeout=max(0.0, deadline - loop.time()))
        if not closed.done():
            log.info("%s/%s: a close with an earlier deadline: aborting what is left",
                     self.topic, self.channel)
            self._deadline = min(self._deadline, loop.time())
            self._abort()
            await asyncio.wait({closed}, timeout=ABORT_GRACE)

    def _abort(self) -> None:
        """Out of time: drop every connection, stop the drain and cancel the handlers now
        (their messages are left to the server; nothing is FINed for them)."""
        rt = self._rt
        if self._subs is not None:
            self._subs.abort()
        if self._discovery is not None:
            self._discovery.stop()
        waiter, rt.idle_waiter = rt.idle_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if rt.queue is not None:
            rt.queue.stop()
        for task in self._workers:
            task.cancel()
        if rt.dead_letters is not None:
            rt.dead_letters.abandon(rt.loop)

    def _finished(self) -> None:
        if self._closed:
            return
        if self._rt.flow is not None:
            self._rt.flow.close()
        self._closed = True
        assert self._closed_signal is not None
        if not self._closed_signal.done():
            self._closed_signal.set_result(None)

    def _requeue_waiting(self) -> None:
        """Messages received but not handed to anyone yet: give them back now."""
        waiting = self._rt.queue.take_all()
        if self._subs is not None:
            waiting += self._subs.waiting()
        for msg in waiting:
            link_of(msg).give_back(msg)

    # -- iteration ----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        return iterate(self._rt, self._begin_iteration, lambda: self._fatal)

    async def _begin_iteration(self) -> Runtime:
        if self._handler is not None:
            raise RuntimeError("a Consumer with a handler cannot be iterated")
        if not self._started:
            await self.start()
        return self._rt

    # -- flow control and switches ------------------------------------------------------------

    def set_max_in_flight(self, n: int) -> None:
        """Change ``max_in_flight`` at run time; 0 pauses, a positive value resumes."""
        check_int("max_in_flight", n, 0)
        self._max_in_flight = n
        if self._rt.flow is not None:
            self._rt.flow.set_max_in_flight(n)

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def drain_timeout(self) -> float:
        """``close()``'s default timeout (the whole close, the drain included)."""
        return float(self.config.drain_timeout)

    def is_starved(self) -> bool:
        """Some connection has (nearly) its whole RDY in flight: nothing more comes until
        messages are answered, so a batching handler should process what it holds."""
        return self._rt.flow is not None and self._rt.flow.is_starved()

    def set_trace(self, enabled: bool | None) -> None:
        """Consume-side trace lines on ``smartnsq.observability.trace`` (INFO): ``None`` (default)
        for messages with a trace id, ``True`` for every message, ``False`` for none."""
        if enabled not in (True, False, None):
            raise InvalidArgument("trace", "must be True, False or None", enabled)
        self._rt.trace = enabled

    def stats(self) -> ConsumerStats:
        """A typed snapshot (:class:`smartnsq.observability.stats.ConsumerStats`): totals, gauges,
        the handler's time, one entry per partition and per subscription, plus the last
        :meth:`lag` reading."""
        from .observe import snapshot  # (the snapshot types load when one is taken)

        lookup = self._discovery.lookup if self._discovery is not None else self._lookup
        return snapshot(self._rt, self._subs, lookup, self._max_in_flight, self._lag)

    async def lag(self, timeout: float = 5.0) -> ChannelLag:
        """Read the channel's backlog from the nodes this consumer reads (nsqd ``/stats``):
        depth, in-flight, deferred, youzan backlogs and queue ends per partition. The reading
        is kept for :meth:`stats` (``stats().lag``)."""
        from .observe import lag_nodes, read_lag

        self._lag = await read_lag(self.topic, self.channel, lag_nodes(self._subs), timeout)
        return self._lag

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connection_count(self) -> int:
        return len(self._subs.links()) if self._subs is not None else 0

    def connections(self) -> list[Connection]:
        """The live subscribed connections (for diagnostics and tests)."""
        return [link.conn for link in self._subs.links()] if self._subs is not None else []

    def __repr__(self) -> str:
        state = ("closed" if self._closed else "closing" if self._closing
                 else "running" if self._started else "new")
        return (f"<Consumer {self.topic}/{self.channel} {state} "
                f"connections={self.connection_count} in_flight={self._rt.in_flight}>")

