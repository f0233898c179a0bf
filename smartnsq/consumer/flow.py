"""The asyncio shell over :class:`smartnsq.model.rdy.RdyController`: events in, RDY commands out.

The controller is the pure model (time passed in, commands returned); this passes it each
event with the loop clock, sends the RDY commands it returns on the links, and ticks it every
``tick_interval`` and at its next deadline (the end of a back-off window).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from ..model.backoff import BackoffPolicy
from ..model.partitions import rdy_ceiling
from ..model.rdy import NOTHING, RdyController
from ..transport.connection import Connection, loop_clock

__all__ = ["Flow"]


class Link(Protocol):
    """What flow control needs of a subscribed connection
    (:class:`smartnsq.consumer.link.Link`): named here, so that this module does not import
    the link module (the imports go one way: link -> dispatch -> flow)."""

    ordered: bool
    rdy_cap: int | None
    conn: Connection

    def send_rdy(self, count: int) -> None: ...

    def __hash__(self) -> int: ...  # the controller's key


class Flow:
    """Drives ``RdyController`` from the event loop for one consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_in_flight: int,
                 backoff: BackoffPolicy | None, tick_interval: float,
                 low_rdy_idle_timeout: float) -> None:
        self._loop = loop
        # the loop's clock, called once per message (the C function where it can be)
        self.now: Callable[[], float] = loop_clock(loop)
        self.ctl = RdyController(max_in_flight, backoff=backoff,
                                 low_rdy_idle_timeout=low_rdy_idle_timeout)
        self._tick_interval = tick_interval
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.frozen = False  # draining: RDY stays 0

    @staticmethod
    def _apply(commands_: list[tuple[Any, int]]) -> None:
        for link, count in commands_:
            link.send_rdy(count)

    apply = _apply  # (the links call the controller directly on the per-message path)

    def add(self, link: Link) -> None:
        max_rdy = rdy_ceiling(link.ordered, link.conn.max_rdy_count)
        if link.rdy_cap is not None:
            max_rdy = max(1, min(max_rdy, link.rdy_cap))
        # an ordered partition backs off on its own: a poison message stops only its partition
        self._apply(self.ctl.add(link, max_rdy, self._loop.time(), own_backoff=link.ordered))
        self._arm()

    def remove(self, link: Link) -> None:
        self._apply(self.ctl.remove(link, self._loop.time()))

    def on_message(self, link: Link, now: float) -> None:
        """A message arrived on ``link`` at ``now`` (loop time: the read that brought it)."""
        cmds = self.ctl.on_message(link, now)
        if cmds:
            self._apply(cmds)

    def on_answer(self, link: Link, success: bool | None) -> None:
        """FIN (True), REQ counted for back-off (False) or a deliberate REQ (None)."""
        cmds = self.ctl.on_finished(link, self.now(), success=bool(success),
                                    backoff=success is not None)
        if cmds is not NOTHING:
            self.answered(cmds)

    def answered(self, cmds: list[tuple[Any, int]]) -> None:
        """What ``ctl.on_finished`` returned when it was not ``NOTHING``: send the RDYs and
        arm the next deadline (a back-off window, an ordered partition's own, may have
        started)."""
        if cmds:
            self._apply(cmds)
        self._arm_deadline()

    def on_ordered_requeue(self, link: Link, hold: float, backoff: bool) -> None:
        """A REQ on an ordered link, about to be sent: the server ignores its delay, so the
        partition is held at RDY 0 for ``hold`` seconds instead. Call it before sending the
        REQ, so the RDY 0 leaves first and the server cannot redeliver at once."""
        self._apply(self.ctl.on_finished(link, self._loop.time(), success=False,
                                         backoff=backoff, hold=hold))
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        deadline = self.ctl.next_deadline()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            self._arm(deadline)

    def set_max_in_flight(self, n: int) -> None:
        if self.frozen:
            return
        self._apply(self.ctl.set_max_in_flight(n, self._loop.time()))

    def is_starved(self) -> bool:
        return self.ctl.is_starved()

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
