"""The asyncio shell over :class:`smartnsq.model.rdy.RdyController`: events in, RDY commands out.

The controller is the pure model (time passed in, commands returned); this passes it each
event with the loop clock, sends the RDY commands it returns on the links, and ticks it every
``tick_interval`` and at its next deadline (the end of a back-off window). The tick is also
when RDY 1 takes turns among more connections than ``max_in_flight``, so a turn lasts
``low_rdy_turn`` plus up to one tick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from ..model.backoff import BackoffPolicy
from ..model.partitions import rdy_ceiling
from ..model.rdy import RdyController
from ..transport.connection import Connection, loop_clock

__all__ = ["Flow", "RdyTarget"]


class RdyTarget(Protocol):
    """What flow control needs of a subscribed connection (the consumer's link): named here,
    so that this module imports none of the consumer's other modules."""

    ordered: bool
    rdy_cap: int | None
    conn: Connection

    def send_rdy(self, count: int) -> None: ...

    def __hash__(self) -> int: ...  # the controller's key


class Flow:
    """Drives ``RdyController`` from the event loop for one consumer.

    The per-message events (a delivery, a FIN or REQ) have no method here: the link calls
    ``ctl.on_message`` and ``ctl.on_finished`` itself and hands what they return to
    :meth:`apply` or :meth:`answered` only when there is something to do, so a message that
    changes no RDY costs no call of this class."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_in_flight: int,
                 backoff: BackoffPolicy | None, tick_interval: float,
                 low_rdy_idle_timeout: float, low_rdy_turn: float | None = None) -> None:
        self._loop = loop
        # the loop's clock, called once per message (the C function where it can be)
        self.now: Callable[[], float] = loop_clock(loop)
        # low_rdy_turn None: the controller's default (half the idle timeout), which keeps a
        # busy partition's wait for its turn below the idle timeout at the 2 s default tick
        self.ctl = RdyController(max_in_flight, backoff=backoff,
                                 low_rdy_idle_timeout=low_rdy_idle_timeout,
                                 low_rdy_turn=low_rdy_turn)
        self._tick_interval = tick_interval
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.frozen = False  # draining: RDY stays 0

    @staticmethod
    def apply(commands_: list[tuple[Any, int]]) -> None:
        """Send the RDY commands the controller returned."""
        for link, count in commands_:
            link.send_rdy(count)

    def add(self, link: RdyTarget) -> None:
        max_rdy = rdy_ceiling(link.ordered, link.conn.max_rdy_count)
        if link.rdy_cap is not None:
            max_rdy = max(1, min(max_rdy, link.rdy_cap))
        # an ordered partition backs off on its own: a poison message stops only its partition
        self.apply(self.ctl.add(link, max_rdy, self._loop.time(), own_backoff=link.ordered))
        self._arm()

    def remove(self, link: RdyTarget) -> None:
        self.apply(self.ctl.remove(link, self._loop.time()))

    def answered(self, cmds: list[tuple[Any, int]]) -> None:
        """What ``ctl.on_finished`` returned when it was not ``NOTHING``: send the RDYs and
        arm the next deadline (a back-off window, an ordered partition's own, may have
        started)."""
        if cmds:
            self.apply(cmds)
        self._arm_deadline()

    def on_ordered_requeue(self, link: RdyTarget, hold: float, backoff: bool) -> None:
        """A REQ on an ordered link, about to be sent: the server ignores its delay, so the
        partition is held at RDY 0 for ``hold`` seconds instead. Call it before sending the
        REQ, so the RDY 0 leaves first and the server cannot redeliver at once."""
        self.apply(self.ctl.on_finished(link, self._loop.time(), success=False,
                                        backoff=backoff, hold=hold))
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        deadline = self.ctl.next_deadline()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            self._arm(deadline)

    def set_max_in_flight(self, n: int) -> None:
        if self.frozen:
            return
        self.apply(self.ctl.set_max_in_flight(n, self._loop.time()))

    def is_starved(self) -> bool:
        return self.ctl.is_starved()

    def freeze(self) -> None:
        """RDY 0 everywhere, for good (draining)."""
        self.frozen = True
        self.apply(self.ctl.set_max_in_flight(0, self._loop.time()))
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
        self.apply(self.ctl.tick(self._loop.time()))
        deadline = self.ctl.next_deadline()
        self._arm(deadline)
        if deadline is not None and self._timer_at > self._loop.time() + self._tick_interval:
            self._arm()

    def close(self) -> None:
        self.frozen = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
