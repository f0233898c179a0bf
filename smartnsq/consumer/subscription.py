"""Keeping targets subscribed: connect, IDENTIFY, SUB, hand RDY to the flow control, retry.

A :class:`Subscription` owns one connection at a time to its target and reconnects with a
jittered, doubling delay until the target is no longer wanted. What goes on the wire:
``SUB`` (with the partition on youzan nodes), ``SUB_ORDERED`` for ordered topics or
``ordered=True``, ``SUB_ADVANCED`` for ``start=`` (:func:`~.targets.sub_command` decides), and
IDENTIFY ``extend_support`` from the topic's meta (with ``desired_tag``/``ext_filter``). When
the meta is unknown (``nsqd=``) the server's refusal teaches it: ``E_SUB_EXTEND_NEED``,
``E_SUB_EXTEND_FORBIDDON`` and ``E_SUB_ORDER_IS_MUST`` flip the guess and resubscribe.

:class:`Subscriptions` is the set of them, opened and closed as the targets change; it tells
its owner (through the callables it was given) when to look up again and when the
configuration cannot work. The partitions an ordered topic grew by are subscribed but get no
RDY until :class:`~.expansion.ExpansionWatch` releases them (per-key order across the
expansion).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Final

from ..errors import Action, InvalidArgument, NSQError, ProtocolError, ServerError
from ..message import Message
from ..model.backoff import exponential_delay
from ..model.dialect import DEFAULT_POLICY
from ..model.failover import sub_probe_delay
from ..model.partitions import NEVER_WRITTEN
from ..model.routes import Address
from ..protocol import commands
from ..protocol.frames import MessageLayout
from ..transport.connection import Connection
from .config import ConsumerConfig
from .expansion import ExpansionWatch
from .link import Link
from .runtime import Runtime
from .setoffset import set_offset
from .targets import Starts, Target, sub_command

__all__ = ["ABORT_GRACE", "Subscription", "Subscriptions", "not_writable", "reconnect_delay"]

log = logging.getLogger("smartnsq.consumer")

# past a close's deadline: how long aborted connections and cancelled tasks get to unwind
ABORT_GRACE: Final = 0.2
_RECANCEL_EVERY: Final = 0.1  # how often stop() cancels again a task that outlived a cancel
NOT_WRITABLE: Final = "E_FAILED_ON_NOT_WRITABLE"
_SUB_ERRORS_LEARNT: Final = frozenset({"E_SUB_EXTEND_NEED", "E_SUB_EXTEND_FORBIDDON",
                                       "E_SUB_ORDER_IS_MUST"})


class Subscription:
    """Keeps one target subscribed (see the module docstring)."""

    def __init__(self, owner: Subscriptions, target: Target) -> None:
        self.owner = owner
        self.rt = owner.rt
        self.target = target
        self.link: Link | None = None
        # the connection between its creation and the end of the handshake (IDENTIFY, SUB,
        # setoffset): stop() aborts it, as a cancel alone can be lost (see stop)
        self.handshake: Connection | None = None
        self.wanted = True
        self.failures = 0
        self.refused = 0  # SUBs refused in a row as not writable (E_FAILED_ON_NOT_WRITABLE)
        self.last_error: BaseException | None = None
        self._ext_guess: bool | None = None
        self._tag_told = False  # desired_tag on a topic without ext: said once
        self._ordered_guess: bool | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        host, port = target.address
        self.name = f"{host}:{port}" + ("" if target.partition is None
                                        else f"/{target.partition}")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"smartnsq-consumer {self.rt.topic} {self.name}")

    def retarget(self, target: Target) -> None:
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

    async def stop(self, timeout: float) -> None:
        """Not wanted any more: stop reconnecting, within ``timeout``.

        A live link was closed by the caller (``close_one`` drains it), so its task ends by
        itself. Mid-handshake the task is cancelled and the connection under handshake
        aborted, so a pending IDENTIFY, SUB or setoffset fails at once: on 3.10/3.11
        ``asyncio.wait_for`` returns the inner result when a cancel lands just as the inner
        call finishes, and the task would go on to its next request. The task is then
        awaited with a bound, cancelled and aborted again while it lingers, and left behind
        (logged) past ``timeout``: a close never hangs on a subscription.
        """
        self.wanted = False
        self._wake.set()
        task = self._task
        if task is None or task.done():
            return
        if self.link is None:
            self._interrupt(task)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not task.done():
            left = deadline - loop.time()
            if left <= 0:
                log.warning("%s: the subscription did not stop within %gs; left behind",
                            self.name, timeout)
                return
            await asyncio.wait({task}, timeout=min(left, _RECANCEL_EVERY))
            if not task.done():
                self._interrupt(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("%s: subscription ended with %r", self.name, task.exception())

    def abort(self) -> None:
        """Out of time: drop the connection without a word (its unanswered messages are the
        server's to redeliver; no answer can go out on it any more) and end the task."""
        self.wanted = False
        self._wake.set()
        link = self.link
        task = self._task
        if task is not None and not task.done():
            self._interrupt(task)
        elif link is not None:
            link.conn.abort()
        if link is not None:
            link.closed()

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def _interrupt(self, task: asyncio.Task[None]) -> None:
        task.cancel()
        for conn in (self.handshake, self.link.conn if self.link is not None else None):
            if conn is not None:
                conn.abort()

    @property
    def _stopping(self) -> bool:
        return not self.wanted or self.owner.closing

    async def _run(self) -> None:
        while not self._stopping:
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
        try:
            link = await self._subscribe()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._stopping:
                return  # stop() aborted the handshake: nothing to report or retry
            self.last_error = exc
            if self._learn(exc):
                return
            if isinstance(exc, ProtocolError) and self.owner.no_nsqd_given(self, exc):
                return
            if unworkable(exc):
                # the configuration cannot work (a refused certificate, a SUB the server will
                # never take): retrying would not help, so the consumer stops and says why
                self.owner.fatal(exc)
                return
            self.failures += 1
            if not_writable(exc):
                # the leader is up but its channel disabled (catching up): probe it on a
                # bounded pace, woken at once by lookup listing the partition for writers
                self.refused += 1
                self.owner.refused(self, exc)
                await self._pause(self.owner.refused_delay(self.refused))
                return
            self.refused = 0
            self.owner.subscribe_failed(self, exc)
            await self._pause()
            return
        if self._stopping:
            # stopped mid-handshake: on 3.10/3.11 asyncio.wait_for can swallow the cancel, so
            # the subscription can finish after close() gave up on it; drop it, never serve it
            link.conn.abort()
            link.closed()
            return
        self.link = link
        self.failures = 0
        self.owner.served = True
        if self.refused:
            log.info("%s: %s/%s writable again: subscribed after %d refused SUBs", self.name,
                     self.rt.topic, self.rt.channel, self.refused)
            self.refused = 0
        flow = self.rt.flow
        expansion = self.owner.expansion
        try:
            if expansion.held(self.target.partition):
                # a partition the topic grew by: subscribed (its channel lets producers
                # switch to it) but no RDY until the old ones reach the expansion point
                await expansion.wait(self.target.partition, link.conn.closed)
            if not self._stopping and not flow.frozen:
                flow.add(link)
            reason = await link.conn.closed
        finally:
            self.link = None
            flow.remove(link)
            link.closed()
        if self._stopping:
            return
        self.last_error = reason
        self.failures += 1
        self.owner.link_lost(self, reason)
        await self._pause()

    def _learn(self, exc: BaseException) -> bool:
        """A refusal that tells what the topic is: adopt it and resubscribe at once."""
        if not isinstance(exc, ServerError) or exc.code not in _SUB_ERRORS_LEARNT:
            return False
        config = self.rt.config
        explicit = config.extend_support is not None
        if exc.code == "E_SUB_EXTEND_NEED" and self._ext_guess is not True and not explicit:
            self._ext_guess = True
        elif exc.code == "E_SUB_EXTEND_FORBIDDON" and self._ext_guess is not False \
                and not explicit:
            self._ext_guess = False
        elif exc.code == "E_SUB_ORDER_IS_MUST" and config.ordered is None \
                and self._ordered_guess is not True:
            self._ordered_guess = True
        else:
            return False
        log.info("%s: %s; resubscribing accordingly", self.name, exc.code)
        return True

    async def _pause(self, delay: float | None = None) -> None:
        if delay is None:
            delay = self.owner.reconnect_delay(self.failures)
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    def _extend_support(self) -> bool:
        # precedence: the user's explicit flag, what the server's refusal taught (it is the
        # truth; lookup meta may lag), the topic's meta, then a guess (asking for tags or
        # filters suggests an ext topic)
        config, target = self.rt.config, self.target
        if target.youzan is False:
            return False
        if config.extend_support is not None:
            return config.extend_support
        if self._ext_guess is not None:
            return self._ext_guess
        if target.ext is not None:
            return target.ext
        return bool(config.desired_tag or config.ext_filter is not None)

    def _plan(self, conn: Connection) -> tuple[bool, int | None]:
        """(ordered, RDY cap) for this connection: on youzan the user's choice, else what the
        server taught, else the meta; classic nsqd has no ordered or positioned subscription,
        so the classic dialect refuses (InvalidArgument, fatal) or says how to degrade."""
        config = self.rt.config
        if conn.is_youzan:
            if config.ordered is not None:
                return config.ordered, None
            if self._ordered_guess is not None:
                return self._ordered_guess, None
            return bool(self.target.ordered), None
        plan = (config.classic or DEFAULT_POLICY).classic_subscription(
            self.rt.topic, ordered=config.ordered, start=config.start, node=conn.address_text)
        return bool(getattr(plan, "best_effort_order", False)), getattr(plan, "rdy_cap", None)

    async def _subscribe(self) -> Link:
        rt, target, config = self.rt, self.target, self.rt.config
        host, port = target.address
        ext = self._extend_support()
        if config.desired_tag and not ext and not self._tag_told:
            self._tag_told = True
            log.warning("%s: desired_tag=%r does nothing on %s, which is not an ext topic "
                        "(tags travel in ext headers): every message is delivered", self.name,
                        config.desired_tag, rt.topic)
        conn = self.handshake = Connection(
            host, port, config.connection, message_class=Message,
            on_error=self._on_error, extend_support=ext,
            desired_tag=(config.desired_tag or "") if ext else "",
            ext_filter=config.ext_filter if ext else None)  # type: ignore[arg-type]
        try:
            await conn.open()
            youzan = conn.is_youzan
            ordered, rdy_cap = self._plan(conn)
            starts = self.owner.starts
            sub = sub_command(rt.topic, rt.channel, target, youzan=youzan, ordered=ordered,
                              start=config.start, start_pending=starts.pending(target),
                              name=self.name)
            try:
                await conn.request(sub.data, sub.name)
            except ServerError as exc:
                if sub.name != "SUB_ADVANCED" or NEVER_WRITTEN not in exc.text:
                    raise
                # a partition never written to: nothing to skip, so subscribe plainly (the
                # server closed this connection after E_INVALID)
                log.info("%s: %s/%s partition %s was never written to: start=%s is moot, "
                         "reading it from its start", self.name, rt.topic, rt.channel,
                         target.partition, config.start)
                starts.applied(target)
                await conn.close()
                return await self._subscribe()
            if sub.set_offset:
                assert config.start is not None and target.http is not None \
                    and target.partition is not None
                await set_offset(target.http, rt.topic, rt.channel, target.partition,
                                 config.start, config.connection.request_timeout or 10.0)
            conn.layout = MessageLayout.for_subscription(
                youzan=youzan, extend_support=ext and youzan, command=sub.name)
            link = Link(rt, conn, target.partition, ordered=ordered, detail=sub.detail,
                        rdy_cap=rdy_cap, report=self._report)
            conn.on_message = link.on_message  # type: ignore[assignment]
            if sub.name == "SUB_ADVANCED":
                starts.applied(target)
            log.info("%s: subscribed to %s/%s with %s%s", self.name, rt.topic, rt.channel,
                     sub.name, " (ext)" if ext and youzan else "")
            return link
        except BaseException:
            await conn.close()
            raise
        finally:
            self.handshake = None

    def _on_error(self, error: ServerError) -> None:
        link = self.link
        if link is not None and link.expected_error(error):
            log.debug("%s: %s: the FIN of a duplicate delivery the server had not counted in "
                      "flight (expected, or judged by the next delivery)", self.name, error)
            return
        self._report(error)

    def _report(self, error: ServerError) -> None:
        """Count and log a server error that is nobody's expected refusal."""
        self.rt.meter.server_error(self.target.partition, error.code)  # (observability.stats)
        if error.refresh_lookup:
            self.owner.refresh()
        level = logging.WARNING if error.fatal else logging.INFO
        log.log(level, "%s: %s", self.name, error)


def unworkable(exc: BaseException) -> bool:
    """Whether a failed subscription says the consumer's configuration cannot work anywhere
    (stop the consumer) rather than that one node failed (retry it, with back-off).

    Bad arguments, a refused certificate, a refused secret and the server's refusal of one of
    our commands are the configuration's; a node that sent bytes that are no NSQ stream
    (``ProtocolError``: an HTTP server on the port, a garbled handshake) or an error frame
    answering no command of ours is that node's: its neighbours keep serving.
    """
    if isinstance(exc, InvalidArgument):
        return True
    if isinstance(exc, ProtocolError):
        return False
    if isinstance(exc, ServerError) and exc.command is None:
        return False
    return getattr(exc, "retriable", True) is False


def not_writable(exc: BaseException) -> bool:
    """A SUB refused because the partition takes no writes now: youzan's leader disables its
    channels while it is below its write quorum or catching up, and says so for a SUB with
    ``E_FAILED_ON_NOT_WRITABLE``. Not a failed node: it is asked again on the partition's
    probe pace (:func:`smartnsq.model.failover.sub_probe_delay`)."""
    return isinstance(exc, ServerError) and exc.code == NOT_WRITABLE


def reconnect_delay(config: ConsumerConfig, failures: int) -> float:
    """The wait before the next attempt after ``failures`` consecutive ones (jittered)."""
    return exponential_delay(config.reconnect_delay, config.reconnect_max, failures, 0.5)


class Subscriptions:
    """The consumer's subscriptions, one per target; opened and closed as targets change.

    ``refresh()`` asks for a fresh lookup (``None`` with ``nsqd=`` addresses: nothing to
    look up), ``refresh(partition)`` says that partition refused a SUB as not writable (watch
    lookup's writer view for it, and re-apply the targets when it is listed again: every
    :meth:`apply` wakes the refused subscriptions); ``fatal(error)`` closes the consumer
    with an error retrying cannot fix.
    """

    def __init__(self, rt: Runtime, *, static: bool, refresh: Callable[..., None] | None,
                 fatal: Callable[[BaseException], None]) -> None:
        self.rt = rt
        self.static = static
        self._refresh = refresh
        self.fatal = fatal
        self.starts = Starts(rt.config.start, by_node=static)
        self.subs: dict[tuple[Address, int | None], Subscription] = {}
        # subscriptions no longer wanted, still being closed (in the background)
        self._retiring: dict[asyncio.Task[None], Subscription] = {}
        self.closing = False
        self.served = False  # some subscription was ever made
        self._not_nsq: dict[tuple[Address, int | None], BaseException] = {}
        # ordered topics: the partitions the topic grew by wait for the old ones
        self.expansion = ExpansionWatch(rt, self.links)

    def no_nsqd_given(self, sub: Subscription, exc: ProtocolError) -> bool:
        """Whether every address given with ``nsqd=`` answered as no nsqd (an HTTP port, bytes
        that are no NSQ stream) before any subscription was made: a wrong configuration, as
        the same mistake with ``lookupd=`` is, so the consumer closes with the error at once
        (the first address's, in the order given) instead of retrying for ever. One nsqd
        among them, or one that answered before, and the others are retried with back-off.
        """
        if not self.static or self.served:
            return False
        self._not_nsq[sub.target.key] = exc
        if not all(key in self._not_nsq for key in self.subs):
            return False
        first = next(key for key in self.subs if key in self._not_nsq)
        self.fatal(self._not_nsq[first])
        return True

    def reconnect_delay(self, failures: int) -> float:
        return reconnect_delay(self.rt.config, failures)

    def refresh(self) -> None:
        if self._refresh is not None and not self.closing:
            self._refresh()

    def refused_delay(self, refusals: int) -> float:
        config = self.rt.config
        return sub_probe_delay(refusals, config.reconnect_delay, config.reconnect_max)

    def refused(self, sub: Subscription, exc: BaseException) -> None:
        """``sub``'s SUB was refused as not writable: count it, say it once per outage, and
        have discovery watch lookup's writer view for the partition's return."""
        rt = self.rt
        rt.meter.partition(sub.target.partition).subscribe_failures += 1
        level = logging.WARNING if sub.refused == 1 else logging.DEBUG
        log.log(level, "%s: %s/%s partition %s not writable now (%s): subscribing again when "
                "lookup lists it for writers, or within %gs", sub.name, rt.topic, rt.channel,
                sub.target.partition, getattr(exc, "code", exc),
                self.refused_delay(sub.refused))
        if self._refresh is not None and not self.closing:
            self._refresh(sub.target.partition)

    def subscribe_failed(self, sub: Subscription, exc: BaseException) -> None:
        rt = self.rt
        rt.meter.partition(sub.target.partition).subscribe_failures += 1
        refresh = isinstance(exc, ServerError) and exc.action is Action.REFRESH_AND_RETRY
        if isinstance(exc, ServerError) and exc.action is Action.GIVE_UP:
            log.error("%s: subscribing to %s/%s refused: %s", sub.name, rt.topic,
                      rt.channel, exc)
        elif refresh and self.static:
            log.debug("%s: %s", sub.name, exc)  # a node given directly that does not lead
        else:
            log.warning("%s: subscribing to %s/%s failed (%s); retrying", sub.name,
                        rt.topic, rt.channel, exc)
        self.refresh()

    def link_lost(self, sub: Subscription, reason: BaseException | None) -> None:
        log.info("%s: connection lost (%s)", sub.name, reason)
        self.refresh()

    def apply(self, targets: Iterable[Target]) -> None:
        """Open subscriptions for new targets, retarget known ones, stop the others."""
        if self.closing:
            return
        targets = list(targets)
        self.expansion.seen(targets)
        wanted = {t.key: t for t in targets}
        for key, sub in list(self.subs.items()):
            if key not in wanted:
                del self.subs[key]
                log.info("%s: no longer a place to read %s from; closing", sub.name,
                         self.rt.topic)
                deadline = self.rt.loop.time() + self.rt.config.connection.close_timeout
                task = self.rt.loop.create_task(self.close_one(sub, deadline))
                self._retiring[task] = sub
                task.add_done_callback(self._retired)
        for key, target in wanted.items():
            existing = self.subs.get(key)
            if existing is None:
                sub = self.subs[key] = Subscription(self, target)
                sub.start()
            elif existing.target != target:
                existing.retarget(target)
                existing.wake()
            elif existing.refused:
                existing.wake()  # a lookup change: the evidence a refused SUB waits for

    def links(self) -> list[Link]:
        """The live links."""
        return [s.link for s in self.subs.values() if s.link is not None and s.link.alive]

    def waiting(self) -> list[Message]:
        """Messages held in ordered lanes (received, not handed to anyone yet), removed."""
        out: list[Message] = []
        for sub in self.subs.values():
            link = sub.link
            if link is not None:
                out.extend(link.lane)
                link.lane.clear()
        return out

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.pop(task, None)

    async def close_one(self, sub: Subscription, deadline: float) -> None:
        """CLS (waiting for CLOSE_WAIT), close and stop ``sub``, all by ``deadline`` (loop
        time). Out of time, the subscription is aborted (what is queued to send has had its
        chance to leave with the close's first step); cancelled, too."""
        sub.wanted = False
        loop = self.rt.loop
        link = sub.link
        try:
            if link is not None and not link.conn.is_closed:
                left = deadline - loop.time()
                if left > 0:
                    try:
                        await link.conn.request(
                            commands.CLS, "CLS",
                            timeout=min(self.rt.config.connection.close_timeout, left))
                    except (NSQError, asyncio.TimeoutError) as exc:
                        log.debug("%s: CLS: %s", sub.name, exc)
                closing = asyncio.ensure_future(link.conn.close())
                await asyncio.sleep(0)  # its first step writes what is queued, begins closing
                await asyncio.wait({closing}, timeout=max(0.0, deadline - loop.time()))
                if not closing.done():
                    closing.cancel()
                    raise asyncio.TimeoutError
            left = deadline - loop.time()
            if left > 0:
                await sub.stop(left)
            if sub.task is not None and not sub.task.done():
                raise asyncio.TimeoutError
        except asyncio.TimeoutError:
            log.debug("%s: not closed in time; aborted", sub.name)
            sub.abort()
            if sub.task is not None and not sub.task.done():
                await asyncio.wait({sub.task}, timeout=ABORT_GRACE)  # let it unwind
        except BaseException:
            sub.abort()
            raise

    async def close(self, deadline: float) -> None:
        """Close every subscription at once, all by ``deadline`` (loop time); each aborts
        itself when out of time (then gets a moment to unwind), so the wait here is only a
        backstop."""
        self.closing = True
        self.expansion.stop()
        loop = self.rt.loop
        subs = list(self.subs.values()) + list(self._retiring.values())
        tasks = {loop.create_task(self.close_one(s, deadline))
                 for s in self.subs.values()} | set(self._retiring)
        self.subs.clear()
        if not tasks:
            return
        _, pending = await asyncio.wait(
            tasks, timeout=max(0.0, deadline - loop.time()) + 2 * ABORT_GRACE)
        if pending:
            log.warning("%s/%s: %d subscriptions not closed in time; aborted and left behind",
                        self.rt.topic, self.rt.channel, len(pending))
            self.abort(subs)
            for task in pending:
                task.cancel()

    def abort(self, subs: Iterable[Subscription] | None = None) -> None:
        """Abort every subscription (or ``subs``) now: no CLS, no flush, tasks cancelled."""
        self.closing = True
        self.expansion.stop()
        targets = list(self.subs.values()) + list(self._retiring.values()) \
            if subs is None else subs
        for sub in targets:
            sub.abort()
