"""The asyncio Consumer: partition-aware subscriptions, flow control, handlers, graceful drain.

Shape. A consumer holds one *subscription* per (nsqd, partition) it reads from: with
``lookupd=[...]`` the partitions' leaders from ``access=r`` lookups (a youzan nsqd serves a
partition's consumers only on its leader, replicas refuse ``SUB`` with
``E_FAILED_ON_NOT_LEADER``) plus the plain nodes of a classic topic; with ``nsqd=[...]`` each
given node, for each of ``partitions`` (or its default partition). A subscription owns one
connection at a time and reconnects with a jittered, doubling delay; with lookupd a lost
connection also asks for a fresh lookup, and the lookup's changes (a leader moved, a partition
added or removed) open and close subscriptions.

What goes on the wire per subscription: ``SUB`` (with the partition on youzan nodes),
``SUB_ORDERED`` for ordered topics or ``ordered=True``, ``SUB_ADVANCED`` with a start position
for ``start=`` (first subscription of each partition only: a reconnect must not rewind), and
IDENTIFY ``extend_support`` from the topic's meta (with ``desired_tag``/``ext_filter``). When
the meta is unknown (``nsqd=``), the server's refusal teaches it: ``E_SUB_EXTEND_NEED``,
``E_SUB_EXTEND_FORBIDDON`` and ``E_SUB_ORDER_IS_MUST`` flip the guess and resubscribe.

Messages. The connection decodes frames straight into :class:`smartnsq.message.Message` and
calls ``_Link.on_message`` inside ``data_received``; that puts the message on one queue read by
a fixed set of worker tasks (``concurrency``), or by ``async for message in consumer``. No task
per message. Ordered subscriptions have a lane: while one of the partition's messages is being
handled, the next ones wait behind it, so a sharding key's messages are handled in publish
order whatever the concurrency. Answers (FIN/REQ/TOUCH) are queued on the connection and leave
in one write per event-loop iteration.

A handler's return finishes the message (FIN), a raise requeues it (REQ with the requeue
policy's delay, counted as a failure for backoff). Nothing is FINed before its handler
succeeded. ``max_attempts`` gives up on messages delivered too often (``on_give_up``; default:
log and FIN) - except on ordered subscriptions, where a blocked message is never skipped unless
the hook says so explicitly (it answers the message itself).

Ordered subscriptions check order: internal id and queue offset must grow per partition; a
regression is logged at ERROR, counted in ``stats()`` and passed to ``on_order_error``.

Draining: ``close()`` sends RDY 0, requeues what was received but not started, lets running
handlers finish (and answer) within ``drain_timeout``, sends CLS, waits for CLOSE_WAIT, closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Union

from . import trace as tracing
from .backoff import BackoffPolicy, RequeuePolicy, exponential_delay
from .config import ConnectionConfig
from .connection import Connection
from .dialect import DEFAULT_POLICY, ClassicDialect
from .errors import (
    Action,
    ConnectionError_,
    InvalidArgument,
    NSQError,
    ServerError,
    TopicNotFound,
)
from .message import Message
from .pool import Address, parse_address
from .protocol import commands
from .protocol import validate as v
from .protocol.commands import StartPosition
from .protocol.frames import MessageLayout
from .protocol.lookup import ACCEPT_V1
from .rdy import RdyController

__all__ = ["Consumer", "Handler", "Message", "StartPosition"]

log = logging.getLogger("smartnsq.consumer")
trace_log = tracing.trace_log

Handler = Callable[[Message], Union[Awaitable[Any], Any]]  # noqa: UP007 - runtime alias
GiveUpHook = Callable[[Message], Union[Awaitable[Any], Any]]  # noqa: UP007
OrderErrorHook = Callable[[Message, str], None]

_INFO: Final = logging.INFO
_SUB_ERRORS_LEARNT: Final = frozenset({"E_SUB_EXTEND_NEED", "E_SUB_EXTEND_FORBIDDON",
                                       "E_SUB_ORDER_IS_MUST"})
_MAX_REQ_DELAY_MS: Final = 3_600_000 * 72  # youzan's max_req_timeout default (72 h)
_CLAIM_LOCK: Final = threading.Lock()  # answers given from threads other than the loop's


def _ms(seconds: float) -> int:
    return min(_MAX_REQ_DELAY_MS, max(0, round(seconds * 1000)))


@dataclass(frozen=True)
class _Target:
    """One place to read from: a node, a partition on it (``None``: no partition token), and
    what is known of the topic there (``None``: unknown, learnt from the server)."""

    address: Address
    partition: int | None
    youzan: bool | None = None
    ordered: bool | None = None
    ext: bool | None = None
    # SUB_ADVANCED with a start position only reaches the node's default partition (the
    # lowest it leads); for another one the start is set over HTTP (``http``) after SUB
    inline_start: bool = True
    http: str | None = None

    @property
    def key(self) -> tuple[Address, int | None]:
        return self.address, self.partition


class _Link:
    """One subscribed connection: the responder of the messages it delivered."""

    __slots__ = (
        "_fin",
        "_req",
        "_send",
        "channel",
        "conn",
        "consumer",
        "dead",
        "detail",
        "in_flight",
        "lane",
        "lane_busy",
        "last_id",
        "last_offset",
        "local",
        "node",
        "ordered",
        "partition",
        "rdy",
        "rdy_cap",
        "sub",
        "topic",
        "youzan",
    )

    def __init__(self, sub: _Subscription, conn: Connection, *, ordered: bool,
                 detail: bool, rdy_cap: int | None = None) -> None:
        self.sub = sub
        self.rdy_cap = rdy_cap
        self.consumer = sub.consumer
        self.conn = conn
        self.topic = sub.consumer.topic
        self.channel = sub.consumer.channel
        self.node = conn.address_text
        self.partition = sub.target.partition
        self.youzan = conn.is_youzan
        self.ordered = ordered
        self.detail = detail
        self.in_flight = 0  # delivered, not yet answered
        self.dead = False  # closed() ran: answers are dropped
        self.rdy = 0  # last RDY sent
        self.lane: deque[Message] = deque()  # ordered: messages waiting behind the busy one
        self.lane_busy = False
        self.last_id = -1
        self.last_offset = -1
        self.local = conn.local_address
        self._send = conn.send
        self._fin = commands.fin
        self._req = commands.req

    @property
    def alive(self) -> bool:
        return not self.conn.is_closed

    def send_rdy(self, count: int) -> None:
        if self.conn.is_closed:
            return
        self.rdy = count
        self._send(commands.rdy(count))

    # -- delivery (inside data_received) ------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        msg._responder = self
        msg._state = 0
        consumer = self.consumer
        msg._auto = consumer._auto_finish
        self.in_flight += 1
        consumer._in_flight += 1
        consumer._received += 1
        consumer._flow.on_message(self)
        if self.detail:
            self._check_order(msg)
        trace = consumer._trace
        if trace is not False and trace_log.isEnabledFor(_INFO) and (
                trace or (msg.youzan and msg.id[8:] != b"\x00" * 8)):
            self._trace_line(msg)
        if consumer._draining:
            # RDY 0 already went out; this one was on the wire: give it straight back
            self.respond_now(msg, False, 0.0, False, state=2)
            return
        if self.ordered:
            if self.lane_busy:
                self.lane.append(msg)
                return
            self.lane_busy = True
        consumer._queue.push(msg)

    def _check_order(self, msg: Message) -> None:
        if msg.attempts > 1 and not self.ordered:
            return  # a requeued or timed-out message comes back after newer ones: normal
        internal_id = msg.internal_id
        offset = msg.queue_offset if msg.queue_offset is not None else -1
        if internal_id == self.last_id:
            return  # a redelivery of the same message
        if internal_id < self.last_id or offset < self.last_offset:
            what = (f"order regression on {self.topic}/{self.partition} at {self.node}: "
                    f"internal_id {internal_id} after {self.last_id}, queue_offset {offset} "
                    f"after {self.last_offset}")
            self.consumer._order_error(msg, what)
        self.last_id = internal_id
        self.last_offset = offset

    def _trace_line(self, msg: Message) -> None:
        if msg.youzan:
            tracing.line("CONSUME", topic=self.topic, channel=self.channel,
                       partition=self.partition, node=self.node, local=self.local,
                       internal_id=msg.internal_id, trace_id=msg.trace_id,
                       queue_offset=msg.queue_offset, raw_size=msg.raw_size,
                       attempts=msg.attempts, timestamp=msg.timestamp)
        else:
            tracing.line("CONSUME", topic=self.topic, channel=self.channel, node=self.node,
                       local=self.local, id=msg.id.decode("ascii", "replace"),
                       attempts=msg.attempts, timestamp=msg.timestamp)

    # -- answers (Message.fin/req/touch land here) --------------------------------------------

    def answer(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        """``Message.fin()/req()``: the first answer wins, whatever the threads."""
        consumer = self.consumer
        if threading.get_ident() != consumer._loop_thread_id:
            # claim under the lock (other threads), send from the loop if still ours
            with _CLAIM_LOCK:
                if message._state != 0:
                    message._refuse()
                message._state = -state
            consumer._loop.call_soon_threadsafe(self._answer_claimed, message, state, delay,
                                                backoff)
            return
        # the loop's own thread: nothing else runs here, no lock needed
        if message._state != 0:
            message._refuse()
        message._state = state
        self._respond(message, state == 1, delay, backoff)

    def _answer_claimed(self, message: Message, state: int, delay: float | None,
                        backoff: bool) -> None:
        if message._state != -state:
            # the loop answered it (auto-answer, drain) between the claim and now
            log.debug("%s: a second answer to %r raced the first; dropped", self.node, message)
            return
        message._state = state
        self._respond(message, state == 1, delay, backoff)

    def respond_now(self, message: Message, finish: bool, delay: float | None, backoff: bool,
                    *, state: int) -> None:
        """Answer on the consumer's behalf (not through the message's public methods)."""
        message._state = state
        self._respond(message, finish, delay, backoff)

    def _respond(self, message: Message, finish: bool, delay: float | None,
                 backoff: bool) -> None:
        consumer = self.consumer
        if self.dead:
            consumer._lost_answers += 1
            log.debug("%s: %s of a message after its connection closed; the server "
                      "redelivers it", self.node, "FIN" if finish else "REQ")
            return
        self.in_flight -= 1
        consumer._in_flight -= 1
        if finish:
            consumer._finished += 1
        else:
            consumer._requeued += 1
        if not self.conn.is_closed:
            if finish:
                self._send(self._fin(message.id))
            else:
                if self.ordered:
                    delay_ms = 0  # the server ignores a delayed REQ on ordered channels
                elif delay is None:
                    delay_ms = _ms(consumer._requeue_delay(message))
                else:
                    delay_ms = _ms(delay)
                self._send(self._req(message.id, delay_ms))
        else:
            consumer._lost_answers += 1
            log.debug("%s: %s of a message after its connection closed; the server "
                      "redelivers it", self.node, "FIN" if finish else "REQ")
        consumer._flow.on_answer(self, True if finish else (False if backoff else None))
        if self.ordered:
            lane = self.lane
            if lane:
                consumer._queue.push(lane.popleft())
            else:
                self.lane_busy = False
        if consumer._in_flight == 0 and consumer._idle_waiter is not None:
            waiter, consumer._idle_waiter = consumer._idle_waiter, None
            if not waiter.done():
                waiter.set_result(None)

    def touch(self, message: Message) -> None:
        consumer = self.consumer
        if threading.get_ident() != consumer._loop_thread_id:
            consumer._loop.call_soon_threadsafe(self._touch, message)
            return
        self._touch(message)

    def _touch(self, message: Message) -> None:
        if not self.conn.is_closed and message._state == 0:
            self._send(commands.touch(message.id))

    def closed(self) -> None:
        """The connection is gone: its messages can no longer be answered (the server
        redelivers them); forget them so in-flight counts stay true."""
        consumer = self.consumer
        self.dead = True
        lost = self.in_flight
        if lost:
            consumer._in_flight -= lost
            self.in_flight = 0
        self.lane.clear()
        self.lane_busy = False
        if consumer._in_flight == 0 and consumer._idle_waiter is not None:
            waiter, consumer._idle_waiter = consumer._idle_waiter, None
            if not waiter.done():
                waiter.set_result(None)

    def __repr__(self) -> str:
        return f"<_Link {self.node} {self.topic}/{self.partition} in_flight={self.in_flight}>"


class _Subscription:
    """Keeps one target subscribed: connect, IDENTIFY, SUB, hand RDY to the flow control;
    on loss, wait (jittered, doubling) and do it again until the target is no longer wanted."""

    def __init__(self, consumer: Consumer, target: _Target) -> None:
        self.consumer = consumer
        self.target = target
        self.link: _Link | None = None
        self.wanted = True
        self.failures = 0
        self.last_error: BaseException | None = None
        self._ext_guess: bool | None = None
        self._ordered_guess: bool | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        host, port = target.address
        self.name = f"{host}:{port}" + ("" if target.partition is None
                                        else f"/{target.partition}")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"smartnsq-consumer {self.consumer.topic} {self.name}")

    def retarget(self, target: _Target) -> None:
        """Same node and partition, new knowledge of the topic (meta): applies on the next
        (re)subscription; a contradicting live subscription is dropped to resubscribe."""
        old, self.target = self.target, target
        link = self.link
        if link is not None and ((target.ordered is not None and old.ordered != target.ordered)
                                 or (target.ext is not None and old.ext != target.ext)):
            link.conn.abort()

    def wake(self) -> None:
        """Retry now (the routes changed)."""
        self.failures = 0
        self._wake.set()

    async def stop(self) -> None:
        """Not wanted any more: stop reconnecting; an open connection is closed by the caller
        (``close`` drains it) or here (``removed`` targets)."""
        self.wanted = False
        self._wake.set()
        task = self._task
        if task is not None and not task.done():
            link = self.link
            if link is None:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        consumer = self.consumer
        while self.wanted and not consumer._closing:
            try:
                await self._once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not end the subscription for good
                log.exception("%s: subscription loop failed; retrying", self.name)
                self.failures += 1
                await self._pause()

    async def _once(self) -> None:
        """Subscribe, serve until the connection closes, pause before the next round."""
        consumer = self.consumer
        try:
            link = await self._subscribe()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.last_error = exc
            if isinstance(exc, InvalidArgument):
                consumer._fail(exc)  # the configuration cannot work: retrying would not help
                return
            if self._learn(exc):
                return
            self.failures += 1
            consumer._subscribe_failed(self, exc)
            await self._pause()
            return
        if not self.wanted or consumer._closing:
            # stopped mid-handshake: on 3.10/3.11 asyncio.wait_for can swallow the cancel, so
            # the subscription can finish after close() gave up on it; drop it, never serve it
            link.conn.abort()
            link.closed()
            return
        self.link = link
        self.failures = 0
        try:
            consumer._flow.add(link)
            reason = await link.conn.closed
        finally:
            self.link = None
            consumer._flow.remove(link)
            link.closed()
        if not self.wanted or consumer._closing:
            return
        self.last_error = reason
        self.failures += 1
        consumer._link_lost(self, reason)
        await self._pause()

    def _learn(self, exc: BaseException) -> bool:
        """A refusal that tells what the topic is: adopt it and resubscribe at once."""
        if not isinstance(exc, ServerError) or exc.code not in _SUB_ERRORS_LEARNT:
            return False
        explicit = self.consumer._extend_support is not None
        if exc.code == "E_SUB_EXTEND_NEED" and self._ext_guess is not True and not explicit:
            self._ext_guess = True
        elif exc.code == "E_SUB_EXTEND_FORBIDDON" and self._ext_guess is not False \
                and not explicit:
            self._ext_guess = False
        elif exc.code == "E_SUB_ORDER_IS_MUST" and self.consumer._ordered is None \
                and self._ordered_guess is not True:
            self._ordered_guess = True
        else:
            return False
        log.info("%s: %s; resubscribing accordingly", self.name, exc.code)
        return True

    async def _pause(self) -> None:
        delay = self.consumer._reconnect_delay(self.failures)
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _subscribe(self) -> _Link:
        consumer = self.consumer
        target = self.target
        host, port = target.address
        # precedence: the user's explicit flag, what the server's refusal taught (it is the
        # truth; lookup meta may lag), the topic's meta, then a guess (asking for tags or
        # filters suggests an ext topic)
        if consumer._extend_support is not None:
            ext = consumer._extend_support
        elif self._ext_guess is not None:
            ext = self._ext_guess
        elif target.ext is not None:
            ext = target.ext
        else:
            ext = consumer._ext_default
        if target.youzan is False:
            ext = False
        conn = await Connection.connect(
            host, port, consumer._conn_config, message_class=Message,
            on_error=self._on_error, extend_support=ext,
            desired_tag=consumer._desired_tag if ext else "",
            ext_filter=consumer._ext_filter if ext else None)
        try:
            youzan = conn.is_youzan
            ordered = False
            rdy_cap: int | None = None
            if youzan:  # the user's choice, else what the server taught, else the meta
                if consumer._ordered is not None:
                    ordered = consumer._ordered
                elif self._ordered_guess is not None:
                    ordered = self._ordered_guess
                else:
                    ordered = bool(target.ordered)
            else:
                # classic nsqd has no ordered or positioned subscription: the compat policy
                # refuses (InvalidArgument, fatal) or says how to degrade
                plan = consumer._classic_policy().classic_subscription(
                    consumer.topic, ordered=consumer._ordered, start=consumer._start,
                    node=conn.address_text)
                ordered = bool(getattr(plan, "best_effort_order", False))
                rdy_cap = getattr(plan, "rdy_cap", None)
            command, data, set_offset = self._sub_command(youzan, ordered)
            await conn.request(data, command)
            if set_offset:
                await self._set_offset()
            detail = command != "SUB"
            conn.layout = MessageLayout.for_subscription(
                youzan=youzan, extend_support=ext and youzan, command=command)
            link = _Link(self, conn, ordered=ordered, detail=detail, rdy_cap=rdy_cap)
            conn.on_message = link.on_message  # type: ignore[assignment]
            if command == "SUB_ADVANCED" and consumer._start is not None:
                consumer._start_done.add(consumer._start_key(target))
            log.info("%s: subscribed to %s/%s with %s%s", self.name, consumer.topic,
                     consumer.channel, command, " (ext)" if ext and youzan else "")
            return link
        except BaseException:
            await conn.close()
            raise

    def _sub_command(self, youzan: bool, ordered: bool) -> tuple[str, bytes, bool]:
        """(command name, bytes, whether the start must then be set over HTTP)."""
        consumer = self.consumer
        target = self.target
        topic, channel, partition = consumer.topic, consumer.channel, target.partition
        if not youzan:
            return "SUB", commands.sub(topic, channel), False
        start = consumer._start
        if start is not None and consumer._start_key(target) not in consumer._start_done:
            if ordered:
                log.warning("%s: ordered topics refuse SUB_ADVANCED; start=%s ignored, "
                            "subscribing with SUB_ORDERED", self.name, start.token().decode())
            elif target.inline_start or target.http is None or partition is None:
                return ("SUB_ADVANCED", commands.sub_advanced(topic, channel, partition, start),
                        False)
            else:
                return "SUB_ADVANCED", commands.sub_advanced(topic, channel, partition), True
        if ordered:
            if partition is None:
                raise InvalidArgument("partitions", "ordered consumption from nsqd= "
                                      "addresses needs partitions=[...] (SUB_ORDERED names "
                                      "its partition)")
            return "SUB_ORDERED", commands.sub_ordered(topic, channel, partition), False
        if start is not None:
            # keep the detail block (queue offsets) on resubscriptions, without rewinding
            return "SUB_ADVANCED", commands.sub_advanced(topic, channel, partition), False
        return "SUB", commands.sub(topic, channel, partition), False

    async def _set_offset(self) -> None:
        """``POST /channel/setoffset`` on the leader: the start position of a partition that
        is not the node's default one (the 5-token SUB_ADVANCED would ignore the partition).
        Sent after SUB (the channel exists) and before the first RDY (nothing delivered)."""
        import httpx

        consumer = self.consumer
        start = consumer._start
        assert start is not None and self.target.http is not None
        url = f"http://{self.target.http}/channel/setoffset"
        params = {"topic": consumer.topic, "partition": str(self.target.partition),
                  "channel": consumer.channel}
        timeout = consumer._conn_config.request_timeout or 10.0
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            try:
                answer = await client.post(url, params=params, content=start.token(),
                                           headers={"Accept": ACCEPT_V1})
            except httpx.HTTPError as exc:
                raise ConnectionError_(f"setting the start of {self.name} failed: {exc}") \
                    from exc
        if answer.status_code != 200:
            raise ServerError("E_SETOFFSET", f"{answer.status_code} {answer.text.strip()}",
                              "SUB_ADVANCED", fatal=False)

    def _on_error(self, error: ServerError) -> None:
        consumer = self.consumer
        consumer._server_errors += 1
        if error.refresh_lookup:
            consumer._refresh()
        level = logging.WARNING if error.fatal else logging.INFO
        log.log(level, "%s: %s", self.name, error)


class _Flow:
    """Drives ``RdyController`` from the event loop: passes events with the loop clock, sends
    the RDY commands it returns, and ticks it (every ``tick_interval`` and at the end of a
    backoff window)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_in_flight: int,
                 backoff: BackoffPolicy | None, tick_interval: float,
                 low_rdy_idle_timeout: float) -> None:
        self._loop = loop
        self.ctl = RdyController(max_in_flight, backoff=backoff,
                                 low_rdy_idle_timeout=low_rdy_idle_timeout)
        self._tick_interval = tick_interval
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.frozen = False  # draining: RDY stays 0

    def _apply(self, commands_: list[tuple[Any, int]]) -> None:
        for link, count in commands_:
            link.send_rdy(count)

    def add(self, link: _Link) -> None:
        max_rdy = 1 if link.ordered else max(1, link.conn.max_rdy_count or 2500)
        if link.rdy_cap is not None:
            max_rdy = max(1, min(max_rdy, link.rdy_cap))
        self._apply(self.ctl.add(link, max_rdy, self._loop.time()))
        self._arm()

    def remove(self, link: _Link) -> None:
        self._apply(self.ctl.remove(link, self._loop.time()))

    def on_message(self, link: _Link) -> None:
        cmds = self.ctl.on_message(link, self._loop.time())
        if cmds:
            self._apply(cmds)

    def on_answer(self, link: _Link, success: bool | None) -> None:
        cmds = self.ctl.on_finished(link, self._loop.time(), success=bool(success),
                                    backoff=success is not None)
        if cmds:
            self._apply(cmds)
        if success and not self.ctl.backoff.active:
            return  # the common case: nothing time-driven changed
        deadline = self.ctl.next_deadline()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            self._arm(deadline)

    def set_max_in_flight(self, n: int) -> None:
        if self.frozen:
            return
        self._apply(self.ctl.set_max_in_flight(n, self._loop.time()))

    def freeze(self) -> None:
        """RDY 0 everywhere, for good (draining)."""
        self.frozen = True
        self._apply(self.ctl.set_max_in_flight(0, self._loop.time()))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, when: float | None = None) -> None:
        if self.frozen:
            return
        now = self._loop.time()
        at = now + self._tick_interval if when is None else max(when, now)
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.frozen:
            return
        self._apply(self.ctl.tick(self._loop.time()))
        deadline = self.ctl.next_deadline()
        self._arm(deadline)
        if deadline is not None and self._timer_at > self._loop.time() + self._tick_interval:
            self._arm()

    def close(self) -> None:
        self.frozen = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Dispatch:
    """The queue between the connections and the handlers, built for bursts.

    ``asyncio.Queue`` wakes one waiting worker per ``put``: a read of 200 messages would cost
    200 task switches even when the handler never waits. Here at most one idle worker is being
    woken at a time; a worker that takes a message while more are waiting wakes the next one
    before running its handler. A handler that does not suspend lets one worker drain the whole
    burst in one step; handlers that do suspend still get every worker, one wake-up per handler
    start.
    """

    __slots__ = ("_idle", "_loop", "_waking", "pending", "stopped")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.pending: deque[Message] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        self.stopped = False

    def push(self, msg: Message) -> None:
        self.pending.append(msg)
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
        items = list(self.pending)
        self.pending.clear()
        return items

    def __len__(self) -> int:
        return len(self.pending)


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
    partition) or ``lookup=`` (a started or unstarted ``smartnsq.lookup.LookupManager`` to
    share). ``partitions`` restricts a lookupd consumer to some partitions.

    Handling: ``handler(message)`` (plain function or coroutine function): return -> FIN,
    raise -> REQ (delay from ``requeue_policy``, counted for backoff). ``auto_finish=False``
    leaves every answer to the handler. ``concurrency`` is how many messages are handled at
    once (default: ``max_in_flight`` for coroutine handlers, 1 for plain functions, which run
    on the event loop; use ``smartnsq.sync.Consumer`` for blocking handlers).

    Flow control: ``max_in_flight`` spread over the connections by
    :class:`smartnsq.rdy.RdyController`; ``backoff_policy`` (:class:`BackoffPolicy`,
    ``BackoffPolicy(enabled=False)`` to disable). Failures: ``max_attempts`` (0 = unlimited)
    and ``on_give_up(message)``. Subscription: ``ordered`` (None: as the topic's meta says),
    ``start`` (a :class:`StartPosition`: SUB_ADVANCED), ``desired_tag``, ``ext_filter``,
    ``extend_support`` (None: from the meta). Connections: ``config`` (a ``ConnectionConfig``)
    or its fields as keywords (``msg_timeout=30``...).
    """

    def __init__(self, topic: str, channel: str, lookupd: Sequence[str] | str | None = None,
                 nsqd: Sequence[str] | str | None = None, handler: Handler | None = None, *,
                 max_in_flight: int = 100, concurrency: int | None = None,
                 ordered: bool | None = None, start: StartPosition | None = None,
                 partitions: Iterable[int] | None = None, desired_tag: str | None = None,
                 ext_filter: Mapping[str, Any] | None = None,
                 extend_support: bool | None = None, max_attempts: int = 0,
                 on_give_up: GiveUpHook | None = None, auto_finish: bool = True,
                 requeue_policy: RequeuePolicy | None = None,
                 backoff_policy: BackoffPolicy | None = None,
                 on_order_error: OrderErrorHook | None = None,
                 trace: bool | None = None, drain_timeout: float = 30.0,
                 reconnect_delay: float = 1.0, reconnect_delay_max: float = 60.0,
                 low_rdy_idle_timeout: float = 10.0, rdy_tick_interval: float = 2.0,
                 lookup: Any = None, lookup_options: Mapping[str, Any] | None = None,
                 classic: ClassicDialect | None = None, config: ConnectionConfig | None = None,
                 **connection_options: Any) -> None:
        v.check_topic(topic)
        v.check_channel(channel)
        self.topic = topic
        self.channel = channel
        given = sum(x is not None and x != [] for x in (lookupd, nsqd, lookup))
        if given != 1:
            raise InvalidArgument("Consumer", "give exactly one of lookupd=, nsqd= or lookup=")
        self._nsqd: tuple[Address, ...] = ()
        if nsqd is not None:
            self._nsqd = tuple(dict.fromkeys(
                parse_address(a, "nsqd") for a in ([nsqd] if isinstance(nsqd, str) else nsqd)))
            if not self._nsqd:
                raise InvalidArgument("nsqd", "needs at least one address", nsqd)
        self._lookupd: list[str] = ([lookupd] if isinstance(lookupd, str)
                                    else list(lookupd or ()))
        self._lookup = lookup
        self._own_lookup = lookup is None and bool(self._lookupd)
        self._lookup_options = dict(lookup_options or {})
        self._classic = classic  # None: the default ClassicPolicy
        self._partitions: frozenset[int] | None = None
        if partitions is not None:
            self._partitions = frozenset(v.check_partition(p) for p in partitions)
            if not self._partitions:
                raise InvalidArgument("partitions", "must name at least one partition", [])
        if handler is not None and not callable(handler):
            raise InvalidArgument("handler", "must be callable", handler)
        self._handler = handler
        _check_int("max_in_flight", max_in_flight, 0)
        if concurrency is not None:
            _check_int("concurrency", concurrency, 1)
        elif handler is not None:
            concurrency = (max(1, min(max_in_flight, 10_000)) if _is_async(handler) else 1)
        self._concurrency = concurrency or 0
        if ordered not in (None, True, False):
            raise InvalidArgument("ordered", "must be True, False or None", ordered)
        self._ordered = ordered
        if start is not None and not isinstance(start, StartPosition):
            raise InvalidArgument("start", "must be a StartPosition", start)
        if start is not None and ordered:
            raise InvalidArgument("start", "ordered subscriptions cannot start elsewhere "
                                  "(the server refuses SUB_ADVANCED on ordered topics)", start)
        if ordered and self._nsqd and self._partitions is None:
            raise InvalidArgument("partitions", "ordered consumption from nsqd= addresses "
                                  "needs partitions=[...]")
        self._start = start
        # what already got its start position (a resubscription must not rewind): with
        # nsqd= each (node, partition) target, since nodes given without partitions= all
        # use partition None; with lookupd each partition, wherever its leader moves
        self._start_done: set[object] = set()
        if desired_tag is not None and (not isinstance(desired_tag, str)
                                        or len(desired_tag) > v.MAX_DESIRED_TAG_LENGTH):
            raise InvalidArgument("desired_tag", "must be a str of at most 100 characters",
                                  desired_tag)
        self._desired_tag = desired_tag or ""
        self._ext_filter = dict(ext_filter) if ext_filter is not None else None
        if extend_support not in (None, True, False):
            raise InvalidArgument("extend_support", "must be True, False or None",
                                  extend_support)
        self._extend_support = extend_support
        # desired_tag/ext_filter only exist on ext topics: asking for them suggests one
        self._ext_default = bool(self._desired_tag or self._ext_filter is not None)
        _check_int("max_attempts", max_attempts, 0)
        self._max_attempts = max_attempts
        self._on_give_up = on_give_up
        self._on_order_error = on_order_error
        self._auto_finish = bool(auto_finish)
        self._requeue = requeue_policy or RequeuePolicy()
        self._backoff_policy = backoff_policy
        if trace not in (None, True, False):
            raise InvalidArgument("trace", "must be True, False or None", trace)
        self._trace: bool | None = trace
        for name, value in (("drain_timeout", drain_timeout),
                            ("reconnect_delay", reconnect_delay),
                            ("reconnect_delay_max", reconnect_delay_max),
                            ("rdy_tick_interval", rdy_tick_interval),
                            ("low_rdy_idle_timeout", low_rdy_idle_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgument(name, "must be a positive number of seconds", value)
        self._drain_timeout = float(drain_timeout)
        self._reconnect_base = float(reconnect_delay)
        self._reconnect_max = float(max(reconnect_delay_max, reconnect_delay))
        self._rdy_tick = float(rdy_tick_interval)
        self._low_rdy_idle = float(low_rdy_idle_timeout)
        self._max_in_flight = max_in_flight
        if connection_options:
            from dataclasses import replace
            unknown = set(connection_options) - set(ConnectionConfig.__dataclass_fields__)
            if unknown:
                raise InvalidArgument("Consumer option", "unknown option", sorted(unknown))
            config = replace(config or ConnectionConfig(), **connection_options)
        self._conn_config = config or ConnectionConfig()
        # run-time state
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._loop_thread_id = -1
        self._queue: _Dispatch = None  # type: ignore[assignment]
        self._flow: _Flow = None  # type: ignore[assignment]
        self._subs: dict[tuple[Address, int | None], _Subscription] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._close_task: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._closed_event: asyncio.Event | None = None
        self._idle_waiter: asyncio.Future[None] | None = None
        self._refresh_handle: asyncio.TimerHandle | None = None
        self._leaderless_handle: asyncio.TimerHandle | None = None
        self._leaderless_rounds = 0
        self._view_task: asyncio.Task[None] | None = None
        self._started = False
        self._closing = False
        self._draining = False
        self._closed = False
        self._iterating = False
        self._last_view: Any = None
        # counters
        self._in_flight = 0
        self._received = 0
        self._finished = 0
        self._requeued = 0
        self._handled = 0
        self._handler_errors = 0
        self._give_ups = 0
        self._order_errors = 0
        self._server_errors = 0
        self._lost_answers = 0
        self._stale = 0
        self._sub_failures = 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> Consumer:
        """Start discovering and subscribing (``async with`` does it). Returns at once:
        subscriptions come up in the background and retry on their own."""
        if self._closed or self._closing:
            raise RuntimeError("a closed Consumer cannot start again")
        if self._started:
            return self
        self._started = True
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._queue = _Dispatch(loop)
        self._closed_event = asyncio.Event()
        self._flow = _Flow(loop, self._max_in_flight, self._backoff_policy, self._rdy_tick,
                           self._low_rdy_idle)
        handler = self._handler
        if handler is not None:
            for i in range(self._concurrency):
                self._workers.append(loop.create_task(
                    self._worker(handler), name=f"smartnsq-consumer {self.topic} worker {i}"))
        try:
            if self._nsqd:
                self._apply_targets(self._static_targets())
            else:
                await self._start_lookup()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def join(self) -> None:
        """Wait until the consumer is closed (by ``close()`` from elsewhere). Raises the
        configuration error (``InvalidArgument``) that closed it, if one did."""
        if not self._started:
            await self.start()
        assert self._closed_event is not None
        await self._closed_event.wait()
        if self._fatal is not None:
            raise self._fatal

    def _fail(self, error: BaseException) -> None:
        """A subscription found the configuration unworkable: close, report from join()."""
        if self._fatal is None:
            self._fatal = error
            log.error("%s/%s: %s; closing the consumer", self.topic, self.channel, error)
        if not self._closing and self._close_task is None:
            self._close_task = self._loop.create_task(self.close())

    @property
    def error(self) -> BaseException | None:
        """The configuration error that closed the consumer, if any."""
        return self._fatal

    def _classic_policy(self) -> ClassicDialect:
        return self._classic or DEFAULT_POLICY

    async def close(self, timeout: float | None = None) -> None:
        """Drain and close: RDY 0; requeue what was received but not started; wait up to
        ``timeout`` (default ``drain_timeout``) for running handlers and unanswered messages;
        CLS (waiting for CLOSE_WAIT) and close every connection. Idempotent. Called from a
        handler it returns at once and the drain proceeds when the handler returns."""
        current = asyncio.current_task()
        if current is not None and current in self._workers:
            # from a handler: the drain waits for this very handler, so it cannot be awaited
            # here; it goes on once the handler returns
            if not self._closing:
                self._close_task = self._loop.create_task(self.close(timeout))
            return
        if self._closing:
            if self._closed_event is not None:
                await self._closed_event.wait()
            return
        self._closing = True
        if not self._started:
            self._closed = True
            return
        timeout = self._drain_timeout if timeout is None else timeout
        if self._refresh_handle is not None:
            self._refresh_handle.cancel()
        if self._leaderless_handle is not None:
            self._leaderless_handle.cancel()
        if self._view_task is not None:
            self._view_task.cancel()
        self._draining = True
        self._flow.freeze()
        self._requeue_waiting()
        if self._in_flight > 0:
            waiter = self._idle_waiter = self._loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except asyncio.TimeoutError:
                log.warning("%s/%s: %d messages still unanswered after %gs; closing anyway "
                            "(the server redelivers them)", self.topic, self.channel,
                            self._in_flight, timeout)
        await asyncio.gather(*(self._close_sub(s) for s in list(self._subs.values())),
                             return_exceptions=True)
        self._subs.clear()
        self._queue.stop()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._flow.close()
        if self._lookup is not None:
            if self._lookup_callback_registered:
                self._unsubscribe_lookup()
            if self._own_lookup:
                with contextlib.suppress(Exception):
                    await self._lookup.close()
        self._closed = True
        assert self._closed_event is not None
        self._closed_event.set()

    def _requeue_waiting(self) -> None:
        """Messages received but not handed to anyone yet: give them back now."""
        for msg in self._queue.take_all():
            self._give_back(msg)
        for sub in self._subs.values():
            link = sub.link
            if link is not None:
                while link.lane:
                    self._give_back(link.lane.popleft())

    @staticmethod
    def _give_back(msg: Message) -> None:
        link = msg._responder
        if msg._state == 0:
            assert isinstance(link, _Link)
            link.respond_now(msg, False, 0.0, False, state=2)

    async def _close_sub(self, sub: _Subscription) -> None:
        sub.wanted = False
        link = sub.link
        if link is not None and not link.conn.is_closed:
            try:
                await link.conn.request(commands.CLS, "CLS",
                                        timeout=self._conn_config.close_timeout)
            except (NSQError, asyncio.TimeoutError) as exc:
                log.debug("%s: CLS: %s", sub.name, exc)
            await link.conn.close()
        await sub.stop()

    # -- messages -----------------------------------------------------------------------------

    async def _worker(self, handler: Handler) -> None:
        dispatch = self._queue
        pending = dispatch.pending
        is_async = _is_async(handler)
        while True:
            if pending:  # inline fast path of dispatch.get()
                msg = pending.popleft()
                if pending and dispatch._idle and not dispatch._waking:
                    dispatch.wake()
            else:
                got = await dispatch.get()
                if got is None:
                    return
                msg = got
            link: _Link = msg._responder  # type: ignore[assignment]
            if link.dead:
                self._stale += 1
                continue
            if self._max_attempts and msg.attempts > self._max_attempts \
                    and await self._give_up(msg, link):
                continue
            try:
                if is_async:
                    await handler(msg)
                else:
                    result = handler(msg)
                    if result is not None and inspect.isawaitable(result):
                        await result
            except asyncio.CancelledError:
                if msg._state == 0 and not link.dead:
                    link.respond_now(msg, False, 0.0, False, state=2)
                raise
            except Exception:
                self._handler_errors += 1
                log.exception("%s/%s: handler failed on %r (attempt %d); requeueing",
                              self.topic, self.channel, msg, msg.attempts)
                if msg._state == 0 and msg._auto:
                    link.respond_now(msg, False, None, True, state=2)
                continue
            self._handled += 1
            if msg._state == 0 and msg._auto:
                link.respond_now(msg, True, None, False, state=1)

    async def _give_up(self, msg: Message, link: _Link) -> bool:
        """``max_attempts`` exceeded: true when the message is settled and must not be
        handled. Ordered subscriptions never skip unless the hook answered the message."""
        self._give_ups += 1
        hook = self._on_give_up
        if hook is None:
            if link.ordered:
                log.error("%s/%s: ordered message %r delivered %d times (max_attempts %d); "
                          "not skipped, handling it again", self.topic, self.channel, msg,
                          msg.attempts, self._max_attempts)
                return False
            log.warning("%s/%s: giving up on %r after %d attempts: FIN", self.topic,
                        self.channel, msg, msg.attempts)
            link.respond_now(msg, True, None, False, state=1)
            return True
        try:
            result = hook(msg)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("%s/%s: on_give_up failed on %r", self.topic, self.channel, msg)
        if msg._state != 0:
            return True
        if link.ordered:
            return False  # the hook did not skip it: handle it again
        link.respond_now(msg, True, None, False, state=1)
        return True

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        if self._handler is not None:
            raise RuntimeError("a Consumer with a handler cannot be iterated")
        if not self._started:
            await self.start()
        queue = self._queue
        while True:
            msg = await queue.get()
            if msg is None:
                if self._fatal is not None:
                    raise self._fatal
                return
            link: _Link = msg._responder  # type: ignore[assignment]
            if link.dead:
                self._stale += 1
                continue
            self._handled += 1
            try:
                yield msg
            except BaseException:
                # the loop body raised, broke out or was cancelled (GeneratorExit or the
                # exception thrown in here): a message it never answered would hold up
                # close() for the whole drain_timeout, so give it back now
                if msg._state == 0 and not link.dead:
                    link.respond_now(msg, False, 0.0, False, state=2)
                raise

    def _start_key(self, target: _Target) -> object:
        return target.key if self._nsqd else target.partition

    def _requeue_delay(self, msg: Message) -> float:
        return float(self._requeue.delay(msg.attempts))

    def _order_error(self, msg: Message, what: str) -> None:
        self._order_errors += 1
        log.error("%s", what)
        hook = self._on_order_error
        if hook is not None:
            try:
                hook(msg, what)
            except Exception:
                log.exception("on_order_error failed")

    # -- flow control and switches ------------------------------------------------------------

    def set_max_in_flight(self, n: int) -> None:
        """Change ``max_in_flight`` at run time; 0 pauses, a positive value resumes."""
        _check_int("max_in_flight", n, 0)
        self._max_in_flight = n
        if self._flow is not None:
            self._flow.set_max_in_flight(n)

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def drain_timeout(self) -> float:
        """How long ``close()`` waits, by default, for handlers and unanswered messages."""
        return self._drain_timeout

    def is_starved(self) -> bool:
        """Some connection has (nearly) its whole RDY in flight: nothing more comes until
        messages are answered, so a batching handler should process what it holds."""
        return self._flow is not None and self._flow.ctl.is_starved()

    def set_trace(self, enabled: bool | None) -> None:
        """Consume-side trace lines on ``smartnsq.trace`` (INFO): ``None`` (default) for
        messages with a trace id, ``True`` for every message, ``False`` for none."""
        if enabled not in (True, False, None):
            raise InvalidArgument("trace", "must be True, False or None", enabled)
        self._trace = enabled

    def stats(self) -> dict[str, Any]:
        """Counters and the flow-control state, for metrics and tests."""
        subs = {}
        for sub in self._subs.values():
            link = sub.link
            subs[sub.name] = {
                "connected": link is not None and link.alive,
                "ordered": link.ordered if link is not None else None,
                "in_flight": link.in_flight if link is not None else 0,
                "rdy": link.rdy if link is not None else 0,
                "failures": sub.failures,
                "last_error": None if sub.last_error is None else str(sub.last_error),
            }
        return {
            "topic": self.topic,
            "channel": self.channel,
            "connections": sum(1 for s in self._subs.values()
                               if s.link is not None and s.link.alive),
            "subscriptions": subs,
            "in_flight": self._in_flight,
            "received": self._received,
            "finished": self._finished,
            "requeued": self._requeued,
            "handled": self._handled,
            "handler_errors": self._handler_errors,
            "give_ups": self._give_ups,
            "order_errors": self._order_errors,
            "server_errors": self._server_errors,
            "lost_answers": self._lost_answers,
            "stale_dropped": self._stale,
            "subscribe_failures": self._sub_failures,
            "queued": len(self._queue) if self._queue is not None else 0,
            "starved": self.is_starved(),
            "flow": self._flow.ctl.stats() if self._flow is not None else {},
        }

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connection_count(self) -> int:
        return sum(1 for s in self._subs.values() if s.link is not None and s.link.alive)

    def connections(self) -> list[Connection]:
        """The live subscribed connections (for diagnostics and tests)."""
        return [s.link.conn for s in self._subs.values()
                if s.link is not None and s.link.alive]

    # -- subscriptions ------------------------------------------------------------------------

    def _reconnect_delay(self, failures: int) -> float:
        return exponential_delay(self._reconnect_base, self._reconnect_max, failures, 0.5)

    def _subscribe_failed(self, sub: _Subscription, exc: BaseException) -> None:
        self._sub_failures += 1
        refresh = isinstance(exc, ServerError) and exc.action is Action.REFRESH_AND_RETRY
        if isinstance(exc, ServerError) and exc.action is Action.GIVE_UP:
            log.error("%s: subscribing to %s/%s refused: %s", sub.name, self.topic,
                      self.channel, exc)
        elif refresh and self._nsqd:
            log.debug("%s: %s", sub.name, exc)  # a node given directly that does not lead
        else:
            log.warning("%s: subscribing to %s/%s failed (%s); retrying", sub.name,
                        self.topic, self.channel, exc)
        if not self._nsqd:
            self._refresh()

    def _link_lost(self, sub: _Subscription, reason: BaseException | None) -> None:
        log.info("%s: connection lost (%s)", sub.name, reason)
        if not self._nsqd:
            self._refresh()

    def _apply_targets(self, targets: Iterable[_Target]) -> None:
        """Open subscriptions for new targets, retarget known ones, stop the others."""
        if self._closing:
            return
        wanted = {t.key: t for t in targets}
        for key, sub in list(self._subs.items()):
            if key not in wanted:
                del self._subs[key]
                log.info("%s: no longer a place to read %s from; closing", sub.name,
                         self.topic)
                self._loop.create_task(self._close_sub(sub))
        for key, target in wanted.items():
            existing = self._subs.get(key)
            if existing is None:
                sub = self._subs[key] = _Subscription(self, target)
                sub.start()
            elif existing.target != target:
                existing.retarget(target)
                existing.wake()

    def _static_targets(self) -> list[_Target]:
        parts: Iterable[int | None] = (sorted(self._partitions) if self._partitions is not None
                                       else [None])
        return [_Target(a, p) for a in self._nsqd for p in parts]

    # -- lookup -------------------------------------------------------------------------------

    _lookup_callback_registered = False

    async def _start_lookup(self) -> None:
        if self._lookup is None:
            from .lookup import LookupManager
            self._lookup = LookupManager(self._lookupd, **self._lookup_options)
        lookup = self._lookup
        if self._own_lookup:
            await lookup.start()
        lookup.subscribe(self._on_topic_change)
        self._lookup_callback_registered = True
        lookup.watch(self.topic, "r")
        self._view_task = self._loop.create_task(self._first_view())

    def _unsubscribe_lookup(self) -> None:
        with contextlib.suppress(Exception):
            self._lookup.unwatch(self.topic, "r")
        unsubscribe = getattr(self._lookup, "unsubscribe", None)
        if unsubscribe is not None:
            with contextlib.suppress(Exception):
                unsubscribe(self._on_topic_change)
        self._lookup_callback_registered = False

    async def _first_view(self) -> None:
        """Load the first view, retrying (never spinning) until the topic exists."""
        failures = 0
        while not self._closing:
            try:
                view = await self._lookup.view(self.topic, "r")
            except asyncio.CancelledError:
                raise
            except TopicNotFound:
                failures += 1
                log.warning("%s: topic not found in lookup; retrying", self.topic)
            except Exception as exc:
                failures += 1
                log.warning("%s: lookup failed (%s); retrying", self.topic, exc)
            else:
                self._on_view(view)
                return
            await asyncio.sleep(self._reconnect_delay(failures))

    def _on_topic_change(self, change: Any) -> None:
        if change.topic != self.topic or change.access != "r" or self._closing:
            return
        if change.new is not None:
            self._on_view(change.new)

    def _on_view(self, view: Any) -> None:
        self._last_view = view
        self._apply_targets(self._view_targets(view))
        self._watch_leaderless(view)

    def _watch_leaderless(self, view: Any) -> None:
        """A partition without a leader (a failover: tens of seconds on a real cluster) is
        looked up again on a doubling delay rather than at the next regular poll."""
        if not view.youzan:
            self._leaderless_rounds = 0
            return
        wanted = (self._partitions if self._partitions is not None
                  else range(view.partition_num) if view.partition_num else view.partitions)
        missing = [p for p in wanted
                   if p not in view.partitions or view.partitions[p].leader is None]
        if self._leaderless_handle is not None:
            self._leaderless_handle.cancel()
            self._leaderless_handle = None
        if not missing or self._closing:
            self._leaderless_rounds = 0
            return
        self._leaderless_rounds += 1
        delay = self._reconnect_delay(self._leaderless_rounds)
        log.info("%s: no leader for partitions %s now; looking again in %.1fs", self.topic,
                 missing, delay)
        self._leaderless_handle = self._loop.call_later(delay, self._leaderless_check)

    def _leaderless_check(self) -> None:
        self._leaderless_handle = None
        if self._closing or self._lookup is None:
            return
        refreshed = self._lookup.refresh(self.topic, "r")
        view = self._last_view

        def again(_: Any) -> None:
            # no change means no TopicChange callback: look at the (same) view again
            if self._last_view is view and not self._closing:
                self._watch_leaderless(view)

        refreshed.add_done_callback(again)

    def _view_targets(self, view: Any) -> list[_Target]:
        targets: list[_Target] = []
        meta = view.meta
        ordered = bool(meta.ordered) if meta is not None else None
        ext = bool(meta.extend_support) if meta is not None else None
        seen: set[Address] = set()
        if view.youzan:
            lowest: dict[Address, int] = {}  # each node's default partition: the lowest it leads
            for pid, part in view.partitions.items():
                if part.leader is not None:
                    address = part.leader.address
                    lowest[address] = min(pid, lowest.get(address, pid))
            for pid, part in sorted(view.partitions.items()):
                if self._partitions is not None and pid not in self._partitions:
                    continue
                leader = part.leader
                if leader is None:
                    continue  # normal for a while during a failover
                targets.append(_Target(leader.address, pid, True, ordered, ext,
                                       inline_start=lowest[leader.address] == pid,
                                       http=leader.http_address))
                seen.add(leader.address)
        for node in view.producers:
            # classic nodes (and a classic topic's only information): plain SUB
            if view.youzan and getattr(node, "youzan", True):
                continue
            if node.address in seen or (self._partitions is not None and view.youzan):
                continue
            targets.append(_Target(node.address, None, False, False, False))
        return targets

    def _refresh(self) -> None:
        """Ask lookup for a fresh view soon (coalesced)."""
        if self._nsqd or self._closing or self._lookup is None:
            return
        if self._refresh_handle is not None:
            return
        self._refresh_handle = self._loop.call_later(0.05, self._do_refresh)

    def _do_refresh(self) -> None:
        self._refresh_handle = None
        if self._closing or self._lookup is None:
            return
        try:
            self._lookup.refresh(self.topic, "r")
        except Exception as exc:
            log.debug("lookup refresh failed: %s", exc)

    def __repr__(self) -> str:
        state = ("closed" if self._closed else "closing" if self._closing
                 else "running" if self._started else "new")
        return (f"<Consumer {self.topic}/{self.channel} {state} "
                f"connections={self.connection_count} in_flight={self._in_flight}>")


def _is_async(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and inspect.iscoroutinefunction(call)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgument(name, f"must be an int >= {low}", value)
