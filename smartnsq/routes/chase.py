"""The consumers' chase: after a lost link, ask lookup again until the view changes.

A graceful leave drops the consumers' connections at once but hands each partition over a
little later (0.07-4 s on the real cluster), so the first lookup after the loss usually still
names the old leader, and the new one should be learned as soon as lookup knows it, not at a
reconnect back-off. :class:`ViewChase` carries out :class:`~smartnsq.routes.policy.Chase` with
one timer: every ``CHASE_FAST_PERIOD`` a round of its own (one at a time, each within
``ROUND_TIMEOUT``) in the first ``CHASE_FAST`` s, then every ``CHASE_PERIOD`` a refresh the
lookup manager spaces, for at most ``CHASE_FOR`` s after the last loss or until the view
changes (:meth:`ViewChase.news`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from . import policy
from .policy import Chase

__all__ = ["ViewChase"]

log = logging.getLogger("smartnsq.consumer")


class ViewChase:
    """Chases one topic's lookup view (``access``) through ``lookup`` (a
    :class:`~smartnsq.lookup.LookupManager`, or anything with its ``refresh``/``view``)."""

    def __init__(self, topic: str, access: str, lookup: Any) -> None:
        self.topic = topic
        self.access = access
        self.lookup = lookup
        self._chase = Chase()
        self._handle: asyncio.TimerHandle | None = None
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

    def stop(self) -> None:
        self._stopped = True
        if self._round is not None:
            self._round.cancel()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
