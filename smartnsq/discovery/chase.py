"""The consumers' chase: after a lost link, ask lookup again until the view changes.

A graceful leave drops the consumers' connections at once but hands each partition over a
little later (0.07-4 s on the real cluster), so the first lookup after the loss usually still
names the old leader, and the new one should be learned as soon as lookup knows it, not at a
reconnect back-off. :class:`ViewChase` carries out :class:`~smartnsq.model.failover.Chase` with
one timer: every ``CHASE_FAST_PERIOD`` a round of its own (one at a time, each within
``ROUND_TIMEOUT``) in the first ``CHASE_FAST`` s, then every ``CHASE_PERIOD`` a refresh the
lookup manager spaces, for at most ``CHASE_FOR`` s after the last loss or until the view
changes (:meth:`ViewChase.news`).

A partition the view names no leader for (a failover: tens of seconds on a real cluster) is
looked up again on the consumer's doubling delay (:meth:`ViewChase.leaderless`) rather than at
the next regular poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..model import failover as policy
from ..model.failover import Chase

__all__ = ["ViewChase"]

log = logging.getLogger("smartnsq.consumer")


class ViewChase:
    """Chases one topic's lookup view (``access``) through ``lookup`` (a
    :class:`~smartnsq.discovery.lookup.LookupManager`, or anything with its
    ``refresh``/``view``)."""

    def __init__(self, topic: str, access: str, lookup: Any,
                 delay: Callable[[int], float]) -> None:
        self.topic = topic
        self.access = access
        self.lookup = lookup
        self._delay = delay  # the pause before leaderless look number n (1, 2, ...)
        self._chase = Chase()
        self._handle: asyncio.TimerHandle | None = None
        self._leaderless_handle: asyncio.TimerHandle | None = None
        self._leaderless_rounds = 0
        self._round: asyncio.Task[None] | None = None  # the one round of its own running
        self._stopped = False

    def lost(self) -> None:
        """A link was lost (or a SUB refused): chase the view, starting ``CHASE_FIRST`` s from
        now (losses close together make one chase)."""
        if self._stopped:
            return
        loop = asyncio.get_running_loop()
        self._chase = self._chase.lost(loop.time(), policy.CHASE_FOR)
        if self._handle is None:
            self._handle = loop.call_later(policy.CHASE_FIRST, self._step)

    def news(self) -> None:
        """The view changed: the chase is over (its timer stops at its next step)."""
        self._chase = Chase()

    def _step(self) -> None:
        self._handle = None
        if self._stopped:
            return
        loop = asyncio.get_running_loop()
        step = self._chase.step(loop.time(), fast_for=policy.CHASE_FAST,
                                fast_period=policy.CHASE_FAST_PERIOD,
                                period=policy.CHASE_PERIOD)
        if step.own_round:
            if self._round is None or self._round.done():
                self._round = loop.create_task(self._fresh_round())
        else:
            try:
                self.lookup.refresh(self.topic, self.access)
            except Exception as exc:
                log.debug("lookup refresh failed: %s", exc)
        if step.next_in is not None:
            self._handle = loop.call_later(step.next_in, self._step)

    async def _fresh_round(self) -> None:
        """One lookup round now, past the spacing of idle refreshes (a change it finds comes
        back through the lookup manager's change subscription)."""
        try:
            await self.lookup.view(self.topic, self.access, refresh=True,
                                   timeout=policy.ROUND_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("lookup round failed: %s", exc)

    def leaderless(self, missing: Sequence[int], again: Callable[[], None]) -> None:
        """The view names no leader for ``missing`` (empty: every partition has one): look
        again after the next doubling delay, then call ``again()`` (a look that changes the
        view reports it through the lookup manager's subscription instead)."""
        if self._leaderless_handle is not None:
            self._leaderless_handle.cancel()
            self._leaderless_handle = None
        if not missing or self._stopped:
            self._leaderless_rounds = 0
            return
        self._leaderless_rounds += 1
        delay = self._delay(self._leaderless_rounds)
        log.info("%s: no leader for partitions %s now; looking again in %.1fs", self.topic,
                 list(missing), delay)
        self._leaderless_handle = asyncio.get_running_loop().call_later(
            delay, self._leaderless_look, again)

    def _leaderless_look(self, again: Callable[[], None]) -> None:
        self._leaderless_handle = None
        if self._stopped:
            return
        self.lookup.refresh(self.topic, self.access).add_done_callback(lambda _: again())

    def stop(self) -> None:
        self._stopped = True
        if self._round is not None:
            self._round.cancel()
        for handle in (self._handle, self._leaderless_handle):
            if handle is not None:
                handle.cancel()
        self._handle = self._leaderless_handle = None
