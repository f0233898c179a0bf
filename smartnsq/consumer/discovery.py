"""Where a lookupd consumer reads: the lookup view of its topic, turned into targets.

The first view is loaded in the background, retrying (never spinning) until the topic exists;
then every change the lookup manager reports (a leader moved, a partition added or removed)
re-applies the targets. A partition without a leader (a failover: tens of seconds on a real
cluster) is looked up again on a doubling delay rather than at the next regular poll. A lost
connection or a refused SUB asks for a fresh view (:meth:`Discovery.refresh`, coalesced), and
keeps asking every ``CHASE_PERIOD`` for up to ``CHASE_FOR`` seconds until the view changes: a
graceful leave drops the consumers' connections at once but hands each partition over a
little later (0.07-4 s on the real cluster), so the first lookup after the loss usually still
names the old leader, and the new one should be learned as soon as lookup knows it, not at a
reconnect back-off. For the first ``CHASE_FAST`` seconds (when most handoffs happen) each of
those is a round of its own, one at a time, every ``CHASE_FAST_PERIOD``; later ones are
spaced by the lookup manager's ``refresh_min_interval``..``refresh_max_interval`` like any
refresh that finds nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidArgument, LookupFailed, TopicNotFound
from .targets import Target, missing_leaders, view_targets

__all__ = ["Discovery"]

CHASE_PERIOD = 0.1  # s between the refreshes asked for after a loss
CHASE_FAST_PERIOD = 0.05  # ... and between the rounds of the first CHASE_FAST seconds
CHASE_FOR = 10.0  # s after the last loss those refreshes go on (or until the view changes)
CHASE_FAST = 5.0  # s after a loss during which they are rounds of their own (not spaced):
# the real cluster's slowest graceful handoffs took 1.3-4.1 s (real-cluster.md)
ROUND_TIMEOUT = 1.0  # s one such round may take

log = logging.getLogger("smartnsq.consumer")


class Discovery:
    """Follows one topic's ``access=r`` lookup view for a consumer."""

    def __init__(self, topic: str, lookupd: Sequence[str], lookup: Any,
                 lookup_options: dict[str, Any], partitions: frozenset[int] | None, *,
                 apply: Callable[[list[Target]], None],
                 delay: Callable[[int], float],
                 fatal: Callable[[BaseException], None],
                 give_up_after: float | None = None) -> None:
        self.topic = topic
        self._lookupd = list(lookupd)
        self.lookup = lookup
        self._own = lookup is None
        self._options = lookup_options
        self._partitions = partitions
        self._apply = apply
        self._delay = delay
        self._fatal = fatal
        self._give_up_after = give_up_after  # ConsumerConfig.discovery_timeout
        self._closing = False
        self._registered = False
        self._task: asyncio.Task[None] | None = None
        self._refresh_handle: asyncio.TimerHandle | None = None
        self._leaderless_handle: asyncio.TimerHandle | None = None
        self._leaderless_rounds = 0
        self._last_view: Any = None
        self._chase_until = 0.0  # loop time until which a lost link keeps refreshing
        self._fast_until = 0.0  # ... and until which those refreshes are rounds of their own
        self._round: asyncio.Task[None] | None = None  # the one such round running

    def start(self) -> None:
        """Begin in the background and return at once: a slow or silent lookupd delays the
        first view, never the caller (``Consumer.start()`` is documented to return at once)."""
        if self.lookup is None:
            from ..lookup import LookupManager
            self.lookup = LookupManager(self._lookupd, **self._options)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"smartnsq-consumer {self.topic} lookup")

    async def _run(self) -> None:
        try:
            if self._give_up_after is None:
                await self._first_view()
                return
            failed: list[BaseException] = []  # the last failure, for the error's cause
            try:
                await asyncio.wait_for(self._first_view(failed), self._give_up_after)
            except asyncio.TimeoutError:
                error = self._gave_up(failed[-1] if failed else None)
                raise error from error.__cause__
        except asyncio.CancelledError:
            raise
        except LookupFailed as exc:  # discovery_timeout: the error says it all
            self._fatal(exc)
        except Exception as exc:  # a bug or a configuration that cannot work: say so
            log.exception("%s: following the lookup failed", self.topic)
            self._fatal(exc)

    def _gave_up(self, last: BaseException | None) -> LookupFailed:
        """The error ending a consumer whose discovery failed for ``discovery_timeout``."""
        after = f"{self._give_up_after:g}s"
        error: LookupFailed
        if isinstance(last, TopicNotFound):
            error = TopicNotFound(self.topic)
            error.args = (f"topic {self.topic!r} still not found in lookup after {after} "
                          "(discovery_timeout)",)
        else:
            why = f": {last}" if last is not None else " (no lookupd answered at all)"
            error = LookupFailed(f"{self.topic}: no lookup answer within {after} "
                                 f"(discovery_timeout){why}")
        error.__cause__ = last
        return error

    async def _first_view(self, failed: list[BaseException] | None = None) -> None:
        """Start the lookup (when ours; retried, never spinning), register for its changes,
        then load the first view, retrying until the topic exists (``failed`` collects each
        failure, the last one becoming the cause of a ``discovery_timeout``)."""
        if failed is None:
            failed = []
        lookup = self.lookup
        failures = 0
        while self._own and not self._closing:
            try:
                await lookup.start()
                break
            except InvalidArgument:
                raise  # retrying cannot fix it
            except Exception as exc:
                failures += 1
                failed.append(exc)
                del failed[:-1]
                log.warning("%s: starting the lookup failed (%s); retrying", self.topic, exc)
            await asyncio.sleep(self._delay(failures))
        lookup.subscribe(self._on_topic_change)
        self._registered = True
        lookup.watch(self.topic, "r")
        failures = 0
        while not self._closing:
            try:
                view = await lookup.view(self.topic, "r")
            except asyncio.CancelledError:
                raise
            except TopicNotFound as exc:
                failures += 1
                failed[:] = [exc]
                log.warning("%s: topic not found in lookup; retrying", self.topic)
            except Exception as exc:
                failures += 1
                failed[:] = [exc]
                log.warning("%s: lookup failed (%s); retrying", self.topic, exc)
            else:
                self._on_view(view)
                return
            await asyncio.sleep(self._delay(failures))

    def _on_topic_change(self, change: Any) -> None:
        if change.topic != self.topic or change.access != "r" or self._closing:
            return
        if change.new is not None:
            self._on_view(change.new)

    def _on_view(self, view: Any) -> None:
        self._chase_until = self._fast_until = 0.0  # news: the chase after a loss is over
        self._last_view = view
        self._apply(view_targets(view, self._partitions))
        self._watch_leaderless(view)

    def _watch_leaderless(self, view: Any) -> None:
        missing = missing_leaders(view, self._partitions)
        if self._leaderless_handle is not None:
            self._leaderless_handle.cancel()
            self._leaderless_handle = None
        if not missing or self._closing:
            self._leaderless_rounds = 0
            return
        self._leaderless_rounds += 1
        delay = self._delay(self._leaderless_rounds)
        log.info("%s: no leader for partitions %s now; looking again in %.1fs", self.topic,
                 missing, delay)
        self._leaderless_handle = asyncio.get_running_loop().call_later(
            delay, self._leaderless_check)

    def _leaderless_check(self) -> None:
        self._leaderless_handle = None
        if self._closing:
            return
        refreshed = self.lookup.refresh(self.topic, "r")
        view = self._last_view

        def again(_: Any) -> None:
            # no change means no TopicChange callback: look at the (same) view again
            if self._last_view is view and not self._closing:
                self._watch_leaderless(view)

        refreshed.add_done_callback(again)

    def refresh(self) -> None:
        """Ask lookup for a fresh view soon (coalesced), and again until the view changes:
        every ``CHASE_FAST_PERIOD`` in a chase's first ``CHASE_FAST`` s, then every
        ``CHASE_PERIOD``, for at most ``CHASE_FOR`` s after the last loss."""
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self._chase_until:  # a new chase: its first seconds are fast; losses
            self._fast_until = now + CHASE_FAST  # during one (a dead node retried) are not
        self._chase_until = now + CHASE_FOR
        if self._refresh_handle is None:
            self._refresh_handle = loop.call_later(0.05, self._do_refresh)

    def _do_refresh(self) -> None:
        self._refresh_handle = None
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        period = CHASE_PERIOD
        if loop.time() < self._fast_until:
            period = CHASE_FAST_PERIOD
            if self._round is None or self._round.done():
                self._round = loop.create_task(self._fresh_round())
        else:
            try:
                self.lookup.refresh(self.topic, "r")
            except Exception as exc:
                log.debug("lookup refresh failed: %s", exc)
        if loop.time() + period < self._chase_until:
            self._refresh_handle = loop.call_later(period, self._do_refresh)

    async def _fresh_round(self) -> None:
        """One lookup round now, past the spacing of idle refreshes (a change it finds comes
        back through the change subscription)."""
        try:
            await self.lookup.view(self.topic, "r", refresh=True, timeout=ROUND_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("lookup round failed: %s", exc)

    def stop(self) -> None:
        """Stop reacting (the consumer is closing); :meth:`close` releases the lookup."""
        self._closing = True
        if self._round is not None:
            self._round.cancel()
        for handle in (self._refresh_handle, self._leaderless_handle):
            if handle is not None:
                handle.cancel()
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        self.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.lookup is None:
            return
        if self._registered:
            with contextlib.suppress(Exception):
                self.lookup.unwatch(self.topic, "r")
            unsubscribe = getattr(self.lookup, "unsubscribe", None)
            if unsubscribe is not None:
                with contextlib.suppress(Exception):
                    unsubscribe(self._on_topic_change)
            self._registered = False
        if self._own:
            with contextlib.suppress(Exception):
                await self.lookup.close()
