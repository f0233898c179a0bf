"""From the connections to the handlers: the burst-friendly queue, the worker tasks and the
inline path.

A fixed set of workers (``concurrency``) reads one :class:`Dispatch` queue, or the user's
``async for`` does: no task per message. A plain-function handler skips the queue when it
can (:func:`inline_runner`): with nothing queued ahead and a slot free, the link runs it on
the message inside ``data_received``, where a worker would have run it one loop turn later
(a plain function blocks the loop wherever it runs, so nothing else changes).

A handler's return finishes the message (FIN), a raise requeues it (REQ with the requeue
policy's delay, counted as a failure for back-off). Nothing is FINed before its handler
succeeded. ``max_attempts`` gives up on messages delivered too often (``on_give_up``;
default: log and FIN), except on ordered subscriptions, where a blocked message is never
skipped unless the hook answers it explicitly.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..message import FINISHED, PENDING, REQUEUED, Message
from ..observability.counters import HANDLER_SAMPLE, ConsumeMeter, PartitionCounts
from ..observability.logs import summary
from .config import ConsumerConfig, Handler

if TYPE_CHECKING:
    from .flow import Flow

__all__ = ["Dispatch", "Responder", "Runtime", "inline_runner", "is_async", "iterate",
           "worker"]

log = logging.getLogger("smartnsq.consumer")


class Responder(Protocol):
    """What the handlers' side needs of the link that delivered a message
    (:class:`smartnsq.consumer.link.Link`): named here so that this module does not import
    the link module, which imports this one."""

    dead: bool
    ordered: bool
    counts: PartitionCounts  # its partition's counters

    def settle(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None: ...

    def give_back(self, message: Message) -> None: ...


def responder_of(message: Message) -> Responder:
    """The link that delivered ``message`` (set by ``Link.on_message``)."""
    return message._responder  # type: ignore[return-value]


class Runtime:
    """What one consumer's links, subscriptions and workers share, handed to each explicitly:
    the configuration, the loop, the dispatch queue and flow control, run-time switches and
    the counters ``Consumer.stats()`` reports."""

    __slots__ = (
        "auto_finish",
        "channel",
        "concurrency",
        "config",
        "draining",
        "duplicates",
        "finished",
        "flow",
        "give_ups",
        "handled_queued",
        "handler_errors",
        "idle_waiter",
        "in_flight",
        "inline_handled",
        "loop",
        "loop_thread_id",
        "lost_answers",
        "meter",
        "order_errors",
        "queue",
        "requeued",
        "run_now",
        "server_errors",
        "stale",
        "sub_failures",
        "suspended",
        "topic",
        "trace",
    )

    def __init__(self, topic: str, channel: str, config: ConsumerConfig) -> None:
        self.topic = topic
        self.channel = channel
        self.config = config
        self.auto_finish = config.auto_finish
        self.trace: bool | None = config.trace
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.loop_thread_id = -1
        self.queue: Dispatch = None  # type: ignore[assignment]
        self.flow: Flow = None  # type: ignore[assignment]
        self.draining = False  # RDY 0 went out: what still arrives is given straight back
        # a plain-function handler, run from data_received when a slot is free and nothing is
        # queued ahead (dispatch.inline_runner); None: every message goes through the queue
        self.run_now: Callable[[Message, Responder], None] | None = None
        self.concurrency = 0
        # workers of a plain-function handler suspended on the awaitable it returned (or on
        # a give-up hook): the slots in use while the loop runs other things
        self.suspended = 0
        self.idle_waiter: asyncio.Future[None] | None = None  # close(): in_flight reached 0
        self.in_flight = 0
        self.finished = 0
        self.requeued = 0
        self.handled_queued = 0  # by the workers and async for (the inline runner: below)
        # the inline runner's count, derived from its sample countdown (inline_runner)
        self.inline_handled: Callable[[], int] = _none
        self.handler_errors = 0
        self.give_ups = 0
        self.order_errors = 0
        self.server_errors = 0
        self.lost_answers = 0
        self.stale = 0
        self.sub_failures = 0
        self.duplicates = 0
        self.meter = ConsumeMeter()  # per partition, for Consumer.stats() (observability.stats)

    @property
    def handled(self) -> int:
        """Handlers that returned, plus messages iterated with ``async for``: the workers'
        count and the inline runner's, which it derives from its sample countdown instead of
        counting every call (one increment fewer per message)."""
        return self.handled_queued + self.inline_handled()

    @property
    def received(self) -> int:
        """Messages delivered: the partitions' counts summed (each delivery is counted once,
        on its partition, for ``Consumer.stats()``)."""
        return sum(counts.received for counts in list(self.meter.parts.values()))

    def requeue_delay(self, msg: Message) -> float:
        return float(self.config.requeue_policy.delay(msg.attempts))

    def order_error(self, msg: Message, what: str) -> None:
        self.order_errors += 1
        log.error("%s", what)
        hook = self.config.on_order_error
        if hook is not None:
            try:
                hook(msg, what)
            except Exception:
                log.exception("on_order_error failed")

    def check_idle(self) -> None:
        """Wake ``close()`` once nothing is in flight any more."""
        if self.in_flight == 0 and self.idle_waiter is not None:
            waiter, self.idle_waiter = self.idle_waiter, None
            if not waiter.done():
                waiter.set_result(None)



_UNTIMED = HANDLER_SAMPLE - 1  # the handler's time is sampled (smartnsq.observability.counters)


class Dispatch:
    """The queue between the connections and the handlers, built for bursts.

    ``asyncio.Queue`` wakes one waiting worker per ``put``: a read of 200 messages would cost
    200 task switches even when the handler never waits. Here at most one idle worker is being
    woken at a time; a worker that takes a message while more are waiting wakes the next one
    before running its handler. A handler that does not suspend lets one worker drain the whole
    burst in one step; handlers that do suspend still get every worker, one wake-up per handler
    start.
    """

    __slots__ = ("_idle", "_loop", "_waking", "pending", "started", "stopped")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.pending: deque[Message] = deque()
        # queued messages whose plain handler already ran inline and returned an awaitable:
        # a worker awaits it (the handler holds a worker's slot, as if it had started there)
        self.started: dict[Message, Awaitable[Any]] = {}
        self._idle: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        self.stopped = False

    def push(self, msg: Message) -> None:
        self.pending.append(msg)
        if not self._waking and self._idle:
            self.wake()

    def hand_over(self, msg: Message, rest: Awaitable[Any]) -> None:
        """The inline handler of ``msg`` returned ``rest``: the next free worker awaits it."""
        self.started[msg] = rest
        self.pending.appendleft(msg)
        if not self._waking and self._idle:
            self.wake()

    def wake(self) -> None:
        idle = self._idle
        while idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                self._waking += 1
                return

    async def get(self) -> Message | None:
        """The next message, waiting for one; ``None`` once stopped and empty."""
        pending = self.pending
        while True:
            if pending:
                msg = pending.popleft()
                if pending and self._idle and not self._waking:
                    self.wake()
                return msg
            if self.stopped:
                return None
            fut = self._loop.create_future()
            self._idle.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._waking -= 1  # woken, then cancelled: pass the wake-up on
                    if pending:
                        self.wake()
                raise
            self._waking -= 1

    def stop(self) -> None:
        self.stopped = True
        for fut in self._idle:
            if not fut.done():
                fut.set_result(None)
                self._waking += 1
        self._idle.clear()

    def take_all(self) -> list[Message]:
        """The messages no handler has started on (those that did stay, for the workers)."""
        started = self.started
        items = [m for m in self.pending if m not in started]
        self.pending.clear()
        self.pending.extend(started)
        return items

    def __len__(self) -> int:
        return len(self.pending)


def _none() -> int:
    return 0


def is_async(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and inspect.iscoroutinefunction(call)


async def worker(rt: Runtime, handler: Handler) -> None:
    """One of the ``concurrency`` tasks running the handler on queued messages."""
    dispatch = rt.queue
    pending = dispatch.pending
    started = dispatch.started
    max_attempts = rt.config.max_attempts
    async_handler = is_async(handler)
    sample = 0  # this worker's handler calls modulo HANDLER_SAMPLE: 0 is timed
    warm = HANDLER_SAMPLE  # its first calls are all timed (a quiet consumer is measured too)
    while True:
        if pending:  # the per-message path, inlined: no call, no wake-up when one is pending
            msg = pending.popleft()
            if pending and dispatch._idle and not dispatch._waking:
                dispatch.wake()
        else:
            got = await dispatch.get()
            if got is None:
                return
            msg = got
        link: Responder = msg._responder  # type: ignore[assignment]
        # a plain handler that began inline (Dispatch.hand_over): only its awaitable is left
        result = started.pop(msg, None) if started else None
        if result is None:
            if link.dead:
                rt.stale += 1
                continue
            if max_attempts and msg.attempts > max_attempts:
                rt.suspended += 1  # the hook may wait: the slot stays taken meanwhile
                try:
                    if await give_up(rt, msg, link):
                        continue
                finally:
                    rt.suspended -= 1
        # (kept below HANDLER_SAMPLE: a small int, no allocation per message)
        sample = (sample + 1) & _UNTIMED
        if warm:
            warm -= 1
            sample = 0
        try:
            if async_handler:
                if sample:
                    await handler(msg)
                else:
                    await rt.meter.timed_async(handler, msg)
            else:
                if result is None:
                    result = handler(msg) if sample else rt.meter.timed(handler, msg)
                if result is not None and inspect.isawaitable(result):
                    rt.suspended += 1
                    try:
                        await result
                    finally:
                        rt.suspended -= 1
        except asyncio.CancelledError:
            link.give_back(msg)
            raise
        except Exception as exc:
            failed(rt, msg, link, exc)
            continue
        rt.handled_queued += 1
        if msg._state == PENDING and msg._auto:
            link.settle(msg, FINISHED, None, False)


def _label(msg: Message) -> str:
    """The id logs name a message by: youzan's internal id, classic's 16-character id."""
    if msg.youzan:
        return str(msg.internal_id)
    return msg.id.decode("ascii", "replace")


def failed(rt: Runtime, msg: Message, link: Responder, exc: BaseException) -> None:
    """The handler raised: REQ with the requeue policy's delay, counted for back-off (unless
    the handler answered the message itself or took the answer over).

    One WARNING line per failed attempt (topic, channel, partition, message id, attempt, the
    exception in one line); the traceback once, with the attempt ``max_attempts`` allows last
    (ERROR), and on every attempt at DEBUG.
    """
    rt.handler_errors += 1
    max_attempts = rt.config.max_attempts
    where = f"{rt.topic}/{rt.channel}"
    partition = "-" if msg.partition is None else msg.partition
    if max_attempts and msg.attempts >= max_attempts:
        then = ("not skipped (ordered): handled again" if link.ordered
                else "given up on at its next delivery")
        log.error("%s partition %s: handler failed on message %s, attempt %d of %d: %s; %s",
                  where, partition, _label(msg), msg.attempts, max_attempts, summary(exc),
                  then, exc_info=exc)
    else:
        log.warning("%s partition %s: handler failed on message %s, attempt %d: %s; requeued",
                    where, partition, _label(msg), msg.attempts, summary(exc))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s partition %s: message %s, attempt %d: the handler's traceback",
                      where, partition, _label(msg), msg.attempts, exc_info=exc)
    if msg._state == PENDING and msg._auto:
        link.settle(msg, REQUEUED, None, True)


def inline_runner(rt: Runtime, handler: Handler) -> Callable[[Message, Responder], None]:
    """``Runtime.run_now`` for a plain-function handler: run it on a message inside
    ``data_received`` and answer at once, as a worker would (return: FIN; raise: REQ, counted
    for back-off). The link calls it only with nothing queued ahead and fewer than
    ``concurrency`` handlers suspended, so the concurrency and (with the lane) per-partition
    order hold. A message over ``max_attempts`` goes to the workers (its give-up hook may
    wait). When the handler returns an awaitable, a worker awaits it (it takes that worker's
    slot, as if the handler had started there)."""
    max_attempts = rt.config.max_attempts
    # the handler's time sample: the first HANDLER_SAMPLE calls (``warm``), then one in
    # HANDLER_SAMPLE, by a small-int countdown in this closure (``skip``: calls to let pass
    # untimed), which costs fewer bytecodes than a test of the partition's count
    skip = 0
    warm = HANDLER_SAMPLE
    # ``Runtime.handled``'s inline part comes from the same countdown: the calls are the timed
    # ones plus _UNTIMED per countdown started less what is left of it; those that did not
    # return to be answered here (raised, or handed an awaitable to a worker) are counted
    # apart, rarely
    timed = cycles = unhandled = 0
    before = rt.inline_handled()  # a runner made earlier for this runtime

    def handled() -> int:
        return before + timed + cycles * _UNTIMED - skip - unhandled

    rt.inline_handled = handled

    def run(msg: Message, link: Responder) -> None:
        nonlocal skip, warm, timed, cycles, unhandled
        if max_attempts and msg.attempts > max_attempts:
            rt.queue.push(msg)
            return
        try:
            if skip:
                skip -= 1
                result = handler(msg)
            else:
                timed += 1
                if warm:
                    warm -= 1
                else:
                    skip = _UNTIMED
                    cycles += 1
                result = rt.meter.timed(handler, msg)
        except Exception as exc:
            unhandled += 1
            failed(rt, msg, link, exc)
            return
        except BaseException:
            unhandled += 1
            link.give_back(msg)
            raise
        if result is not None and inspect.isawaitable(result):
            unhandled += 1  # the worker that awaits it counts it
            rt.queue.hand_over(msg, result)
            return
        if msg._state == PENDING and msg._auto:
            link.settle(msg, FINISHED, None, False)

    return run


async def give_up(rt: Runtime, msg: Message, link: Responder) -> bool:
    """``max_attempts`` exceeded: true when the message is settled and must not be handled.
    Ordered subscriptions never skip unless the hook answered the message."""
    rt.give_ups += 1
    hook = rt.config.on_give_up
    if hook is None:
        if link.ordered:
            log.error("%s/%s partition %s: ordered message %s delivered %d times "
                      "(max_attempts %d); not skipped, handling it again", rt.topic,
                      rt.channel, "-" if msg.partition is None else msg.partition,
                      _label(msg), msg.attempts, rt.config.max_attempts)
            return False
        log.warning("%s/%s partition %s: giving up on message %s, delivered %d times "
                    "(max_attempts %d): FIN", rt.topic, rt.channel,
                    "-" if msg.partition is None else msg.partition, _label(msg),
                    msg.attempts, rt.config.max_attempts)
        link.settle(msg, FINISHED, None, False)
        return True
    try:
        result = hook(msg)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s/%s: on_give_up failed on %r", rt.topic, rt.channel, msg)
    if msg._state != PENDING:
        return True
    if link.ordered:
        return False  # the hook did not skip it: handle it again
    link.settle(msg, FINISHED, None, False)
    return True


async def iterate(rt: Runtime, begin: Callable[[], Awaitable[Any]],
                  fatal: Callable[[], BaseException | None]) -> AsyncIterator[Message]:
    """``async for message in consumer``: ``begin()`` (start the consumer), then messages
    until the consumer closes (raising the error that closed it, if any)."""
    await begin()
    queue = rt.queue
    while True:
        msg = await queue.get()
        if msg is None:
            error = fatal()
            if error is not None:
                raise error
            return
        link = responder_of(msg)
        if link.dead:
            rt.stale += 1
            continue
        rt.handled_queued += 1
        try:
            yield msg
        except BaseException:
            # the loop body raised, broke out or was cancelled (GeneratorExit or the
            # exception thrown in here): a message it never answered would hold up
            # close() for the whole drain_timeout, so give it back now
            link.give_back(msg)
            raise
