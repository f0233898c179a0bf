"""Where a lookupd consumer reads: the lookup view of its topic, turned into targets.

The first view is loaded in the background, retrying (never spinning) until the topic exists;
then every change the lookup manager reports (a leader moved, a partition added or removed)
re-applies the targets. When to ask lookup again is :class:`smartnsq.discovery.chase.ViewChase`'s: a
partition without a leader (a failover: tens of seconds on a real cluster) is looked up again
on a doubling delay rather than at the next regular poll, and a lost connection or a refused
SUB (:meth:`Discovery.refresh`) starts a chase whose timing (``CHASE_*``) is
:mod:`smartnsq.model.failover`'s, the same rule as the producers' wait for a route change.
A SUB refused because the partition is not writable starts no chase (its leader is right):
the writer view (``access=w``) is watched instead, and the partition listed there again
re-applies the targets, which wakes the refused subscription at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..discovery.chase import ViewChase
from ..errors import InvalidArgument, LookupFailed, TopicNotFound
from ..model.failover import (
    CHASE_FAST,
    CHASE_FAST_PERIOD,
    CHASE_FOR,
    CHASE_PERIOD,
    ROUND_TIMEOUT,
    WRITERS_LOOK_EVERY,
    listed_again,
    still_refused,
)
from .targets import Target, missing_leaders, view_targets

__all__ = ["CHASE_FAST", "CHASE_FAST_PERIOD", "CHASE_FOR", "CHASE_PERIOD", "ROUND_TIMEOUT",
           "Discovery"]

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
        self._chase: ViewChase | None = None
        self._last_view: Any = None
        # partitions whose SUB was refused as not writable -> when last (loop time), the
        # partitions the writer view listed last (None: not seen), and the look's timer
        self._refused: dict[int, float] = {}
        self._writers: set[int] | None = None
        self._writers_watched = False
        self._writers_look: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Begin in the background and return at once: a slow or silent lookupd delays the
        first view, never the caller (``Consumer.start()`` is documented to return at once)."""
        if self.lookup is None:
            from ..discovery.lookup import LookupManager
            self.lookup = LookupManager(self._lookupd, **self._options)
        self._chase = ViewChase(self.topic, "r", self.lookup, self._delay)
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
                if isinstance(exc, LookupFailed) and not exc.retriable:
                    raise  # no lookupd given is one: a configuration error, never retried
                failures += 1
                failed[:] = [exc]
                log.warning("%s: lookup failed (%s); retrying", self.topic, exc)
            else:
                self._on_view(view)
                return
            await asyncio.sleep(self._delay(failures))

    def _on_topic_change(self, change: Any) -> None:
        if change.topic != self.topic or self._closing or change.new is None:
            return
        if change.access == "r":
            self._on_view(change.new)
        elif change.access == "w":
            self._on_writers(change.new)

    def _on_writers(self, view: Any) -> None:
        """Lookup's writer view changed (ours, or a producer's sharing the lookup manager):
        a refused partition listed again takes writes again, so the subscriptions are
        re-applied, which wakes the refused ones (:meth:`Subscriptions.apply`)."""
        listed = {p for p, part in view.partitions.items() if part.leader is not None}
        again = listed_again(self._refused, self._writers, listed)
        self._writers = listed
        if not again or self._last_view is None:
            return
        for p in again:
            del self._refused[p]
        log.info("%s: partitions %s listed for writers again; subscribing now", self.topic,
                 sorted(again))
        self._apply(view_targets(self._last_view, self._partitions))

    def _on_view(self, view: Any) -> None:
        if self._chase is not None:
            self._chase.news()  # news: the chase after a loss is over
        self._last_view = view
        self._apply(view_targets(view, self._partitions))
        self._watch_leaderless(view)

    def _watch_leaderless(self, view: Any) -> None:
        if self._chase is None:
            return

        def again() -> None:
            # no change means no TopicChange callback: look at the (same) view again
            if self._last_view is view and not self._closing:
                self._watch_leaderless(view)

        self._chase.leaderless(missing_leaders(view, self._partitions), again)

    def refresh(self, refused: int | None = None) -> None:
        """Ask lookup for a fresh view soon, and again until the view changes (the chase of
        :class:`smartnsq.discovery.chase.ViewChase`).

        ``refused``: that partition's leader refused a SUB as not writable. Its leader is
        right, so no chase; instead lookup's writer view (``access=w``, which lists a
        youzan partition only while it takes writes) is watched and asked every
        ``WRITERS_LOOK_EVERY`` s until ``WRITERS_WATCH_FOR`` s after the last refusal."""
        if self._closing or self._chase is None:
            return
        if refused is None:
            self._chase.lost()
            return
        loop = asyncio.get_running_loop()
        self._refused[refused] = loop.time()
        if not self._writers_watched:
            self._writers_watched = True
            self.lookup.watch(self.topic, "w")  # (looked up at once when not known)
        if self._writers_look is None:
            self._writers_look = loop.call_later(WRITERS_LOOK_EVERY, self._look_writers)

    def _look_writers(self) -> None:
        self._writers_look = None
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        self._refused = still_refused(self._refused, loop.time())
        if not self._refused:
            self._unwatch_writers()
            return
        try:
            self.lookup.refresh(self.topic, "w")
        except Exception as exc:
            log.debug("lookup refresh failed: %s", exc)
        self._writers_look = loop.call_later(WRITERS_LOOK_EVERY, self._look_writers)

    def _unwatch_writers(self) -> None:
        if self._writers_look is not None:
            self._writers_look.cancel()
            self._writers_look = None
        if self._writers_watched:
            self._writers_watched = False
            self._writers = None
            with contextlib.suppress(Exception):
                self.lookup.unwatch(self.topic, "w")

    def stop(self) -> None:
        """Stop reacting (the consumer is closing); :meth:`close` releases the lookup."""
        self._closing = True
        self._refused.clear()
        if self._writers_look is not None:
            self._writers_look.cancel()
            self._writers_look = None
        if self._chase is not None:
            self._chase.stop()
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        self.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.lookup is None:
            return
        if self._writers_watched:
            self._writers_watched = False
            with contextlib.suppress(Exception):
                self.lookup.unwatch(self.topic, "w")
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
