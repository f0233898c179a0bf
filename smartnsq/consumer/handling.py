"""Running the handler on each message: the worker tasks, the inline path, ``async for``,
failures and give-ups.

A fixed set of workers (``concurrency``) reads the consumer's :class:`~.dispatch.Dispatch`
queue, or the user's ``async for`` does: no task per message. A plain-function handler skips
the queue when it can (:func:`inline_runner`): with nothing queued ahead and a slot free, the
link runs it on the message inside ``data_received``, where a worker would have run it one
loop turn later (a plain function blocks the loop wherever it runs, so nothing else changes).

A handler's return finishes the message (FIN), a raise requeues it (REQ with the requeue
policy's delay, counted as a failure for back-off). Nothing is FINed before its handler
succeeded. ``max_attempts`` (5 by default, as pynsq and go-nsq) gives up on messages
delivered too often (``on_give_up``; default: log and FIN), except on ordered
subscriptions, where a blocked message is never skipped unless the hook answers it
explicitly. ``dead_letter`` parks such a message first (``deadletter``) and FINs it only
once the park is confirmed; on ordered subscriptions only with ``dead_letter_ordered``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..message import FINISHED, PENDING, REQUEUED, Message, Responder
from ..observability.counters import HANDLER_SAMPLE
from ..observability.logs import summary
from .config import Handler
from .deadletter import applies
from .runtime import Runtime

__all__ = ["dead_letter", "failed", "give_up", "inline_runner", "is_async", "iterate",
           "undecodable", "worker"]

log = logging.getLogger("smartnsq.consumer")

_UNTIMED = HANDLER_SAMPLE - 1  # the handler's time is sampled (smartnsq.observability.counters)
PARK_RETRY_FLOOR = 1.0
"""The least delay before a message whose park failed comes back: the dead-letter target is
down for every such message, so an immediate retry helps nobody; and the real youzan nsqd
refused the immediate ``REQ <id> 0`` of such a message (``E_REQ_FAILED ... Message too much
requeue``), which leaves it in flight for a whole ``msg_timeout`` before it comes again."""


def is_async(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and inspect.iscoroutinefunction(call)


async def worker(rt: Runtime, handler: Handler) -> None:
    """One of the ``concurrency`` tasks running the handler on queued messages."""
    dispatch = rt.queue
    pending = dispatch.pending
    idle = dispatch.idle  # (the same deque for the queue's life)
    started = dispatch.started
    max_attempts = rt.config.max_attempts
    undecoded = rt.undecoded
    async_handler = is_async(handler)
    sample = 0  # this worker's handler calls modulo HANDLER_SAMPLE: 0 is timed
    warm = HANDLER_SAMPLE  # its first calls are all timed (a quiet consumer is measured too)
    while True:
        if pending and not idle:
            # what Dispatch.get does when no worker waits (nobody to wake), without awaiting
            # a coroutine: every queued message's path
            msg = pending.popleft()
        else:
            got = await dispatch.get()
            if got is None:
                return
            msg = got
        link = msg._responder
        # a plain handler that began inline (Dispatch.hand_over): only its awaitable is left
        result = started.pop(msg, None) if started else None
        if result is None:
            if undecoded and msg in undecoded:
                await undecodable(rt, msg, link)
                continue
            if link.dead:
                rt.discarded += 1
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

    One line per failed attempt (topic, channel, partition, message id, attempt, the
    exception in one line): WARNING, ERROR from the last attempt ``max_attempts`` allows on.
    The traceback once per message, where it helps most: with that last attempt, which
    decides the give-up (or, on an ordered subscription, that the message blocks its
    partition); with ``max_attempts=0``, which has no last attempt, with the first. Every
    other attempt's goes at DEBUG, so that a message retried a hundred times does not fill
    the log with a hundred copies of one traceback.
    """
    rt.handler_errors += 1
    max_attempts = rt.config.max_attempts
    where = f"{rt.topic}/{rt.channel}"
    partition = "-" if msg.partition is None else msg.partition
    parking = rt.dead_letters
    if parking is not None:
        parking.errors.note(msg.id, exc)  # what its dead-letter copy will say
    traced = msg.attempts == (max_attempts or 1)  # once per message (the docstring's why)
    if max_attempts and msg.attempts >= max_attempts:
        if parking is not None and applies(rt.config, link.ordered):
            then = f"dead-lettered at its next delivery ({rt.config.dead_letter!r})"
        elif link.ordered:
            then = "not skipped (ordered): handled again"
        else:
            then = "given up on at its next delivery"
        log.error("%s partition %s: handler failed on message %s, attempt %d of %d: %s; %s",
                  where, partition, _label(msg), msg.attempts, max_attempts, summary(exc),
                  then, exc_info=exc if traced else None)
    else:
        log.warning("%s partition %s: handler failed on message %s, attempt %d: %s; requeued",
                    where, partition, _label(msg), msg.attempts, summary(exc),
                    exc_info=exc if traced else None)
    if not traced and log.isEnabledFor(logging.DEBUG):
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

    undecoded = rt.undecoded

    def run(msg: Message, link: Responder) -> None:
        nonlocal skip, warm, timed, cycles, unhandled
        if (max_attempts and msg.attempts > max_attempts) or (undecoded and msg in undecoded):
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
    Ordered subscriptions never skip unless the hook answered the message, or
    ``dead_letter_ordered`` lets ``dead_letter`` park it."""
    rt.give_ups += 1
    parking = rt.dead_letters
    if parking is not None and applies(rt.config, link.ordered):
        await dead_letter(rt, msg, link, parking.errors.peek(msg.id))
        return True
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


async def dead_letter(rt: Runtime, msg: Message, link: Responder, error: str) -> None:
    """Park ``msg`` (past ``max_attempts``) with ``dead_letter``, then FIN it; when the park
    fails, requeue it instead (counted for back-off: the dead-letter topic or the hook's
    store is down for every such message, not just this one), so that nothing is FINed
    unparked. A hook that answered the message itself keeps its answer."""
    parking = rt.dead_letters
    assert parking is not None
    where = f"{rt.topic}/{rt.channel} partition {'-' if msg.partition is None else msg.partition}"
    why = await parking.park(msg, error)
    if why is None:
        parking.errors.pop(msg.id)
        answer = "FIN" if msg._state == PENDING else "answered by the hook"
        log.warning("%s: message %s, delivered %d times (max_attempts %d), parked on %r "
                    "(last error: %s): %s", where, _label(msg), msg.attempts,
                    rt.config.max_attempts, rt.config.dead_letter, error, answer)
        if msg._state == PENDING:
            link.settle(msg, FINISHED, None, False)
        return
    delay = max(rt.requeue_delay(msg), PARK_RETRY_FLOOR)
    log.error("%s: message %s, attempt %d, could not be parked on %r (%s); requeued for "
              "%gs, not FINed", where, _label(msg), msg.attempts, rt.config.dead_letter, why,
              delay)
    if msg._state == PENDING:
        link.settle(msg, REQUEUED, delay, True)


async def undecodable(rt: Runtime, msg: Message, link: Responder) -> None:
    """A body its publisher compressed that cannot be decoded (``Message.body_error``): it
    reaches no handler and is not FINed unseen. Past ``max_attempts`` ``dead_letter`` parks
    it (the body as stored, its marks, the reason as its last error), or else the give-up
    hook, if there is one, decides, as for a message its handler keeps failing; otherwise it is
    requeued with the requeue policy's growing delay, so that a fix (the missing codec
    installed, a larger ``max_decompressed_size``) finds it still queued. It does not slow
    the consumer down (no back-off): the fault is this message's, not the handler's or
    what the handler writes to, and the messages behind it are fine."""
    rt.undecoded.discard(msg)
    if link.dead:
        rt.discarded += 1
        return
    rt.undecodable += 1
    max_attempts = rt.config.max_attempts
    if rt.dead_letters is not None and max_attempts and msg.attempts > max_attempts \
            and applies(rt.config, link.ordered):
        rt.give_ups += 1
        rt.suspended += 1
        try:
            await dead_letter(rt, msg, link, f"undecodable body: {msg.body_error}")
        finally:
            rt.suspended -= 1
        return
    if rt.config.on_give_up is not None and max_attempts and msg.attempts > max_attempts:
        rt.suspended += 1
        try:
            if await give_up(rt, msg, link):
                return
        finally:
            rt.suspended -= 1
    log.error("%s/%s partition %s: message %s, attempt %d: its compressed body cannot be "
              "decoded (%s); requeued, not handled", rt.topic, rt.channel,
              "-" if msg.partition is None else msg.partition, _label(msg), msg.attempts,
              msg.body_error)
    if msg._state == PENDING:
        link.settle(msg, REQUEUED, None, False)


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
        link = msg._responder
        if rt.undecoded and msg in rt.undecoded:
            await undecodable(rt, msg, link)
            continue
        if link.dead:
            rt.discarded += 1
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
