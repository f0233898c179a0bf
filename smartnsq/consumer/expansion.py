"""An ordered consumer across a partition expansion: the shell over
:class:`smartnsq.model.expansion.ExpansionHold`.

When the targets of an ordered subscription name a larger partition count than earlier
targets did (not the first ones), the new partitions are held: they are subscribed (youzan's
writer view lists a partition only once it has a channel, so the SUB lets producers switch
to them) but get no RDY until the old partitions are consumed up to the expansion point.
The leaders' ``/stats`` are asked every :data:`STATS_EVERY` s (every
:data:`STATS_EVERY_IDLE` s once the new partitions stayed empty for :data:`QUIET_AFTER` s):
first whether a new partition was written to, then, once one was, each old partition's queue
end (``backend_depth``, bytes: its point) and whether its channel has a backlog left.
Progress is the old partitions' links' last answered message (``queue_offset +
raw_size``), looked at every :data:`LOOK_EVERY` s. The bound (``EXPANSION_HOLD_MAX`` after
the first write to a new partition was seen) releases whatever is left, with a WARNING:
order may not hold for the keys that moved. Unordered subscriptions, and consumers given
``partitions=``, are not held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from ..model.expansion import BY_BOUND, EXPANSION_HOLD_MAX, ExpansionHold, Release
from .runtime import Runtime
from .targets import Target

__all__ = ["LOOK_EVERY", "QUIET_AFTER", "STATS_EVERY", "STATS_EVERY_IDLE", "ExpansionWatch"]

log = logging.getLogger("smartnsq.consumer")

LOOK_EVERY: Final = 0.05  # how often a hold looks at the old partitions' progress (s)
STATS_EVERY: Final = 0.5  # how often it asks /stats (new partitions written? ends, backlogs)
STATS_EVERY_IDLE: Final = 2.0  # ... once nothing was written to them for QUIET_AFTER s
QUIET_AFTER: Final = 10.0


class ExpansionWatch:
    """Holds an ordered subscription's new partitions after its topic grew (module doc).

    ``links()``: the consumer's live links (each with ``partition`` and ``last``, the message
    it delivered last)."""

    def __init__(self, rt: Runtime, links: Callable[[], Iterable[Any]], *,
                 bound: float | None = None) -> None:
        self.rt = rt
        self._links = links
        self.hold = ExpansionHold(EXPANSION_HOLD_MAX if bound is None else bound)
        self._count = 0  # the partition count of the last targets (0: none seen yet)
        self._http: dict[int, str] = {}  # partition -> its leader's HTTP address
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.releases: list[Release] = []  # what was released, for stats and tests

    def seen(self, targets: Iterable[Target]) -> None:
        """The targets changed: note the leaders, and start a hold when an ordered topic's
        partition count grew since the last targets."""
        count = 0
        ordered = False
        for target in targets:
            if target.partition is None or not target.youzan:
                continue
            count = max(count, target.partition_num)
            ordered = ordered or self._ordered(target)
            if target.http is not None:
                self._http[target.partition] = target.http
        if count <= 0 or self._closing or self.rt.config.partitions is not None:
            return  # (partitions= chosen by hand: the user decides what is read when)
        before, self._count = self._count, count
        if not ordered or before <= 0 or count <= before:
            return
        now = self.rt.loop.time()
        new = self.hold.grow(before, count, now)
        log.info("%s/%s: partitions %d -> %d: holding new partitions %s until partitions "
                 "0..%d are consumed to the expansion point (at most %gs)", self.rt.topic,
                 self.rt.channel, before, count, sorted(new), before - 1, self.hold.bound)
        if self._task is None or self._task.done():
            self._task = self.rt.loop.create_task(
                self._run(), name=f"smartnsq-consumer {self.rt.topic} expansion")

    def _ordered(self, target: Target) -> bool:
        config = self.rt.config.ordered
        return bool(target.ordered) if config is None else config

    def held(self, partition: int | None) -> bool:
        return self.hold.held(partition)

    async def wait(self, partition: int | None,
                   closed: asyncio.Future[BaseException | None]) -> None:
        """Until ``partition`` is released (or the connection closes, or the watch stops)."""
        while self.hold.held(partition) and not closed.done() and not self._closing:
            changed = self._changed
            waiter: asyncio.Future[Any] = asyncio.ensure_future(changed.wait())
            either: set[asyncio.Future[Any]] = {waiter, closed}
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()

    async def _run(self) -> None:
        loop = self.rt.loop
        from ..admin import AsyncAdmin

        timeout = self.rt.config.connection.request_timeout or 10.0
        asked = started = loop.time()
        asked -= STATS_EVERY
        every = STATS_EVERY
        try:
            async with AsyncAdmin(timeout=min(timeout, 5.0)) as admin:
                while self.hold.active and not self._closing:
                    now = loop.time()
                    self._look()
                    if now - asked >= every:
                        asked = now
                        await self._ask(admin)
                        self._look()
                        # nothing written to the new partitions for a while: look less often
                        waiting = self.hold.wanted_ends() or self.hold.open_partitions()
                        every = STATS_EVERY if waiting or now - started < QUIET_AFTER \
                            else STATS_EVERY_IDLE
                    self._released(self.hold.decide(loop.time()))
                    if not self.hold.active:
                        break
                    if self.hold.wanted_ends() or self.hold.open_partitions():
                        await asyncio.sleep(LOOK_EVERY)
                    else:  # only waiting for a write to a new partition: the next ask
                        await asyncio.sleep(max(LOOK_EVERY, asked + every - loop.time()))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not hold the partitions for ever
            log.exception("%s: the expansion hold failed; releasing", self.rt.topic)
            self._released(self.hold.decide(loop.time() + self.hold.bound))

    def _look(self) -> None:
        """The old partitions' progress: each link's last delivery, once answered."""
        wanted = self.hold.open_partitions()
        for link in self._links():
            if link.partition not in wanted:
                continue
            last = link.last
            if last is None or not last.finished or last.queue_offset is None \
                    or last.raw_size is None:
                continue
            self.hold.progress(link.partition, last.queue_offset + last.raw_size)

    async def _stats(self, admin: Any, partitions: Iterable[int]) -> list[tuple[int, Any]]:
        """``/stats`` of each of ``partitions`` on its leader, asked at once: (partition,
        its topic entry, ``None`` when it has none, or the error)."""
        rt = self.rt
        asks = [(p, self._http[p]) for p in sorted(partitions) if p in self._http]
        answers = await asyncio.gather(
            *(admin.stats(http, rt.topic, rt.channel, partition=p, leader_only=True)
              for p, http in asks), return_exceptions=True)
        out: list[tuple[int, Any]] = []
        for (p, http), answer in zip(asks, answers, strict=True):
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            if isinstance(answer, BaseException):
                log.debug("%s/%d: /stats of %s failed: %s", rt.topic, p, http, answer)
                out.append((p, answer))
            else:
                out.append((p, answer.topic(rt.topic, p)))
        return out

    async def _ask(self, admin: Any) -> None:
        """``/stats`` of the held partitions not written to yet (any message there starts
        the reading of the old ends), then of each old partition still waited for: its end
        when not known yet, and whether its channel has any backlog left."""
        rt = self.rt
        for p, entry in await self._stats(admin, self.hold.unwritten()):
            # one that cannot be read counts as written: the bound then applies
            if isinstance(entry, BaseException) or (
                    entry is not None and entry.backend_depth is not None
                    and entry.backend_depth > (entry.backend_start or 0)):
                self.hold.written(p, rt.loop.time())
        ends = self.hold.wanted_ends()
        wanted = ends | self.hold.open_partitions()
        if not wanted:
            return
        asked_at = rt.loop.time()
        for p, entry in await self._stats(admin, wanted):
            if isinstance(entry, BaseException) or entry is None \
                    or entry.backend_depth is None:
                continue
            if p in ends:
                self.hold.end(p, entry.backend_depth, asked_at)
            channel = entry.channel(rt.channel)
            if channel is not None and channel.depth == 0 and channel.in_flight == 0:
                self.hold.drained(p, asked_at)

    def _released(self, releases: list[Release]) -> None:
        if not releases:
            return
        rt = self.rt
        for release in releases:
            self.releases.append(release)
            if release.why == BY_BOUND:
                log.warning("%s/%s: new partitions %s released after %.1fs although "
                            "partitions %s were not consumed to the expansion point (no "
                            "leader, or not consumed in time): order may not hold for the "
                            "keys that moved to them", rt.topic, rt.channel,
                            sorted(release.new), release.waited, sorted(release.late))
            else:
                log.info("%s/%s: partitions %s consumed to the expansion point: new "
                         "partitions %s released after %.2fs", rt.topic, rt.channel,
                         sorted(release.old), sorted(release.new), release.waited)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def stop(self) -> None:
        """The consumer is closing: nothing is held any more, the waits end."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        self._changed.set()

    async def close(self) -> None:
        self.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
