"""RDY flow control across one consumer's connections, sans-I/O.

NSQ pushes messages; a connection's ``RDY n`` is the number of messages the server may have
in flight to it at once (the server sends while ``in_flight < RDY``; a new ``RDY`` replaces the
old window, it does not add to it). :class:`RdyController` decides which ``RDY`` each
connection should have, following the client guide (seed "Building Client Libraries", *RDY
State*) with a few fixes:

* A new connection starts at ``RDY 1`` and gets its full share once it has delivered a
  message, so the first connections to come up are not favoured while the others connect.
* The share is ``max_in_flight // n`` with the remainder handed out (one extra each, to the
  most recently active connections first) instead of being lost to integer division; a
  connection whose ``max_rdy_count`` is below its share gives the difference to the others.
* A connection's RDY is raised when its window is at most 25 % unused (``RDY - in_flight <=
  RDY / 4``) or it is 0 -- this batches RDY commands instead of sending one per message.
* The total is bounded by *committed* capacity, ``max(RDY, in_flight)`` per connection, not
  only by the sum of RDY: after RDY is lowered on a busy connection its surplus messages are
  still in flight, so their capacity is handed to another connection only once they finish.
  Hence both ``total_rdy <= max_in_flight`` and, whenever RDY is raised, the number of
  messages that can be in flight stays within ``max_in_flight``.
* With fewer ``max_in_flight`` than connections, ``RDY 1`` goes to a subset and :meth:`tick`
  hands it on to the longest waiting (random among equals): from a holder idle (nothing in
  flight, no message nor finish) for ``low_rdy_idle_timeout``, and from any holder whose turn
  (``low_rdy_turn``) is over, since a steady trickle never lets a holder go idle.
* :meth:`is_starved` compares in-flight with the RDY *currently* set, so it is also true while
  backing off with messages still in flight (RDY 0: nothing more is coming, process the
  batch).
* Backoff (:class:`~smartnsq.model.backoff.Backoff`): RDY 0 everywhere while backing off; when the
  window expires, RDY 1 on one connection (the probe): the one whose failure started the
  back-off, since its requeued message is there (a random one only when that connection is
  gone); full distribution again once successes bring the level back to 0. A probe that gets
  no message for ``low_rdy_idle_timeout`` (its partition may be empty) moves to another
  connection, so the consumer cannot stay stuck probing an idle nsqd.

Ordered subscriptions get at most one message in flight per partition whatever RDY says, and
a real server was seen to duplicate the first message with RDY > 1 (docs/protocol.md §10.1,
"RDY on ordered channels"): add such connections with ``max_rdy_count=1``. Add them with
``own_backoff=True`` too: each partition then backs off on its own (a poison message stops
only its partition; the consumer-wide back-off neither counts its failures nor pauses it),
and a requeue holds the connection at RDY 0 for the requeue delay (``hold``, at least
:data:`MIN_HOLD`), since the server ignores a delayed REQ on ordered channels and would
otherwise redeliver at once, in a tight loop when back-off is disabled.

Every method that can change something returns the ``RDY`` commands to send now, as
``(conn, count)`` pairs; only real changes are listed, at most one per connection, in the
order they should be sent (decreases before increases). The caller must send them (or, if a
connection is gone, :meth:`remove` it). Time is the caller's ``now`` (seconds, any monotonic
clock); nothing here blocks, sleeps or reads a clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..protocol.numbers import check_int, check_number
from .backoff import BACKING_OFF, NORMAL, PROBING, Backoff, BackoffPolicy

__all__ = ["MIN_HOLD", "NOTHING", "STARVED_RATIO", "ConnKey", "RdyController"]

log = logging.getLogger("smartnsq.rdy")

ConnKey = Hashable
RdyCommands = list[tuple[ConnKey, int]]

#: in-flight / RDY ratio from which a connection counts as starved (the guide's 0.85: it
#: anticipates starvation rather than waiting for it).
STARVED_RATIO = 0.85

#: shortest hold after a requeue on an own-backoff (ordered) connection: the floor that keeps a
#: failing handler with a 0 s requeue delay from spinning redeliveries.
MIN_HOLD = 0.1

#: what the per-message fast paths return (shared: never modify it): no RDY to send and no
#: deadline moved, so a caller that re-arms timers after a result can skip that when
#: ``commands is NOTHING``.
NOTHING: RdyCommands = []


@dataclass
class _Conn:
    key: ConnKey
    max_rdy: int
    added_at: float
    rdy: int = 0            # last RDY sent (what the server enforces)
    in_flight: int = 0
    share: int = 0          # allotment in the current distribution (0 or 1 in low-RDY mode)
    primed: bool = False    # has delivered a message since it was added
    last_message: float = -1.0   # -1: never
    last_finished: float = -1.0
    granted_at: float = -1.0     # when RDY last went from 0 to >= 1; -1: never
    turn_from: float = -1.0      # low-RDY mode: when its turn began (RDY up); -1: not yet
    waiting_since: float = 0.0   # low-RDY mode: when it last lost its slot (or was added)
    backoff: Backoff | None = None   # own back-off (ordered partitions); None: the shared one
    hold_until: float = 0.0      # own-backoff connections: RDY 0 until then (a requeue)

    @property
    def committed(self) -> int:
        return max(self.rdy, self.in_flight)

    def idle_since(self) -> float:
        return max(self.last_message, self.last_finished, self.granted_at, self.added_at)

    def lose_slot(self, now: float) -> None:
        self.share, self.turn_from, self.waiting_since = 0, -1.0, now


class _Changes:
    """Collects RDY changes of one call; a connection changed twice is reported once."""

    __slots__ = ("_order", "_orig")

    def __init__(self) -> None:
        self._orig: dict[ConnKey, tuple[_Conn, int]] = {}
        self._order: list[ConnKey] = []

    def record(self, conn: _Conn) -> None:
        if conn.key not in self._orig:
            self._orig[conn.key] = (conn, conn.rdy)
            self._order.append(conn.key)

    def result(self, live: dict[ConnKey, _Conn]) -> RdyCommands:
        decreases: RdyCommands = []
        increases: RdyCommands = []
        for key in self._order:
            conn, before = self._orig[key]
            if live.get(key) is not conn or conn.rdy == before:
                continue
            (decreases if conn.rdy < before else increases).append((key, conn.rdy))
        return decreases + increases


def _check_count(name: str, value: object, low: int) -> int:
    return check_int(name, value, low)


class RdyController:
    """RDY distribution across one consumer's connections (see the module docstring)."""

    def __init__(self, max_in_flight: int, *, low_rdy_idle_timeout: float = 10.0,
                 low_rdy_turn: float | None = None, rng: random.Random | None = None,
                 backoff: Backoff | BackoffPolicy | None = None) -> None:
        self._mif = _check_count("max_in_flight", max_in_flight, 0)
        self.low_rdy_idle_timeout = check_number("low_rdy_idle_timeout", low_rdy_idle_timeout,
                                                 low_open=True, finite=False)
        # half the idle timeout by default (why: docs/flow-control.md, rule 6)
        self.low_rdy_turn = (self.low_rdy_idle_timeout / 2 if low_rdy_turn is None else
                             check_number("low_rdy_turn", low_rdy_turn, low_open=True,
                                          finite=False))
        self._rng = rng if rng is not None else random.Random()
        if isinstance(backoff, Backoff):
            self.backoff = backoff
        else:
            self.backoff = Backoff(backoff, self._rng)
        self._conns: dict[ConnKey, _Conn] = {}
        self._total = 0
        self._blocked: set[ConnKey] = set()   # want more RDY but capacity is committed
        self._probe: ConnKey | None = None
        self._last_failed: ConnKey | None = None  # where the last counted failure happened
        self._now = 0.0   # ``now`` of the call in progress

    # -- read-only view ---------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"<RdyController max_in_flight={self._mif} conns={len(self._conns)} "
                f"total_rdy={self._total} backoff={self.backoff.state}>")

    def __contains__(self, conn: object) -> bool:
        return conn in self._conns

    def __len__(self) -> int:
        return len(self._conns)

    def __iter__(self) -> Iterator[ConnKey]:
        return iter(self._conns)

    @property
    def max_in_flight(self) -> int:
        return self._mif

    @property
    def total_rdy(self) -> int:
        """Sum of the RDY counts last sent on live connections."""
        return self._total

    @property
    def total_in_flight(self) -> int:
        return sum(c.in_flight for c in self._conns.values())

    @property
    def low_rdy_mode(self) -> bool:
        """Fewer ``max_in_flight`` than connections: RDY 1 rotates over a subset."""
        return 0 < self._mif < len(self._conns)

    def rdy(self, conn: ConnKey) -> int:
        """RDY last sent on ``conn`` (0 for an unknown connection)."""
        c = self._conns.get(conn)
        return c.rdy if c is not None else 0

    def in_flight(self, conn: ConnKey) -> int:
        """Messages delivered on ``conn`` and not finished yet (0 for an unknown one)."""
        c = self._conns.get(conn)
        return c.in_flight if c is not None else 0

    def backoff_state(self, conn: ConnKey, now: float) -> str | None:
        """The back-off state of a connection that backs off on its own (an ordered
        partition) at ``now``; ``None`` for one that follows the consumer's."""
        c = self._conns.get(conn)
        if c is None or c.backoff is None:
            return None
        return str(c.backoff.state_at(now))

    def share(self, conn: ConnKey) -> int:
        """The allotment of ``conn`` in the current distribution (its RDY in steady flow)."""
        c = self._conns.get(conn)
        return c.share if c is not None else 0

    def is_starved(self) -> bool:
        """Some connection has in-flight >= 85 % of its RDY: no (or few) more messages will
        come until some are finished, so a batching handler should process what it has."""
        return any(c.in_flight > 0 and c.in_flight >= c.rdy * STARVED_RATIO
                   for c in self._conns.values())

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has time-driven work that cannot wait for the periodic tick:
        the end of a backoff window or of a hold (``None`` when there is none)."""
        ends = [self.backoff.until] if self.backoff.state == BACKING_OFF else []
        for c in self._conns.values():
            if c.backoff is not None:
                if c.backoff.state == BACKING_OFF:
                    ends.append(c.backoff.until)
                if c.hold_until > self._now:
                    ends.append(c.hold_until)
        return min(ends) if ends else None

    def stats(self) -> dict[str, object]:
        """A snapshot for ``consumer.stats()``."""
        return {
            "max_in_flight": self._mif,
            "total_rdy": self._total,
            "in_flight": self.total_in_flight,
            "low_rdy_mode": self.low_rdy_mode,
            "backoff": self.backoff.state,
            "backoff_level": self.backoff.level,
            "backoff_until": self.backoff.until,
            "connections": {str(k): {"rdy": c.rdy, "in_flight": c.in_flight, "share": c.share,
                                     **({"backoff": c.backoff.state_at(self._now),
                                         "backoff_level": c.backoff.level}
                                        if c.backoff is not None else {})}
                            for k, c in self._conns.items()},
        }

    # -- events -----------------------------------------------------------------------------

    def add(self, conn: ConnKey, max_rdy_count: int, now: float, *,
            own_backoff: bool = False) -> RdyCommands:
        """A subscribed connection joins; it gets RDY 1 (capacity permitting) and the other
        connections' shares shrink to make room. ``max_rdy_count`` is the server's limit from
        IDENTIFY (2500 when it did not say; 1 for an ordered subscription). ``own_backoff``:
        the connection backs off on its own (an ordered partition, see the module doc)."""
        self._now = now
        if conn in self._conns:
            raise InvalidArgument("conn", "is already added", conn)
        _check_count("max_rdy_count", max_rdy_count, 1)
        c = self._conns[conn] = _Conn(conn, max_rdy_count, now, waiting_since=now)
        if own_backoff:
            c.backoff = Backoff(self.backoff.policy, self._rng)
        return self._rebalance(now)

    def remove(self, conn: ConnKey, now: float) -> RdyCommands:
        """A connection is gone (closed, unsubscribed): forget it, give its share to the
        others. Its in-flight messages are dropped from the count (the server requeues them
        when the connection closes). Unknown connections are ignored."""
        self._now = now
        c = self._conns.pop(conn, None)
        if c is None:
            return []
        self._total -= c.rdy
        self._blocked.discard(conn)
        if self._probe == conn:
            self._probe = None
        if self._last_failed == conn:
            self._last_failed = None
        return self._rebalance(now)

    def on_message(self, conn: ConnKey, now: float) -> RdyCommands:
        """A message arrived on ``conn``."""
        self._now = now
        c = self._conns.get(conn)
        if c is None:
            return []
        c.in_flight += 1
        c.last_message = now
        if c.primed and c.rdy == c.share and self._mif and self.backoff._state == NORMAL:
            return NOTHING  # the per-message fast path: steady flow, nothing to change
        out = _Changes()
        if self.backoff.update(now):
            self._rebalance_into(out, now)
        if not c.primed:
            c.primed = True
        self._update(c, out, force=False)
        return out.result(self._conns)

    def on_finished(self, conn: ConnKey, now: float, *, success: bool,
                    backoff: bool = True, hold: float = 0.0) -> RdyCommands:
        """A message of ``conn`` was answered: FIN (``success``) or REQ (failure).

        A failure counts towards backoff unless ``backoff`` is false (a deliberate requeue,
        e.g. "not now", that says nothing about the downstream system's health). Results on
        a connection removed meanwhile still count towards backoff. On an own-backoff
        connection a requeue also holds it at RDY 0 for ``hold`` seconds (at least
        :data:`MIN_HOLD`): send the returned RDY before the REQ.
        """
        self._now = now
        c = self._conns.get(conn)
        if c is not None:
            own = c.backoff
            if own is not None:
                if success and own._state == NORMAL and c.primed and c.in_flight > 0 \
                        and c.rdy == c.share and self._mif and now >= c.hold_until \
                        and not (self._blocked and c.in_flight > c.rdy):
                    # the ordered per-message fast path: a success with the partition's own
                    # back-off at rest changes nothing (Backoff.success ignores it; RDY is
                    # already what _want says)
                    c.in_flight -= 1
                    c.last_finished = now
                    return NOTHING
                return self._finished_own(c, now, success, backoff, hold)
            if success and c.primed and c.in_flight > 0 and c.rdy == c.share and self._mif \
                    and self.backoff._state == NORMAL \
                    and not (self._blocked and c.in_flight > c.rdy):
                # the per-message fast path: a success in steady flow changes nothing
                c.in_flight -= 1
                c.last_finished = now
                return NOTHING
        out = _Changes()
        before = (self.backoff.state, self.backoff.level)
        if success:
            self.backoff.success(now)
        elif backoff:
            self.backoff.failure(now)
            if c is not None:
                self._last_failed = conn
        else:
            self.backoff.update(now)
        freed = False
        if c is not None and c.in_flight > 0:
            freed = c.in_flight > c.rdy
            c.in_flight -= 1
            c.last_finished = now
        if (self.backoff.state, self.backoff.level) != before:
            self._log_backoff(before[0])
            self._rebalance_into(out, now)
        else:
            if c is not None:
                self._update(c, out, force=False)
            if freed and self._blocked:
                self._retry_blocked(out)
        return out.result(self._conns)

    def _finished_own(self, c: _Conn, now: float, success: bool, backoff: bool,
                      hold: float) -> RdyCommands:
        """A result on an own-backoff connection: it alone slows down (or is held)."""
        b = c.backoff
        assert b is not None
        freed = False
        if c.in_flight > 0:
            freed = c.in_flight > c.rdy  # in flight beyond its window: capacity comes back
            c.in_flight -= 1
            c.last_finished = now
        before = (b.state, b.level)
        if success:
            b.success(now)
        elif backoff:
            b.failure(now)
        else:
            b.update(now)
        if not success:
            c.hold_until = max(c.hold_until, now + max(hold, MIN_HOLD))
        if (b.state, b.level) != before:
            log.debug("%s: own back-off %s, level %d", c.key, b.state, b.level)
        out = _Changes()
        self._update(c, out, force=True)
        if freed and self._blocked:
            self._retry_blocked(out)
        return out.result(self._conns)

    def set_max_in_flight(self, n: int, now: float) -> RdyCommands:
        """Change ``max_in_flight`` at run time; 0 pauses (RDY 0 everywhere), a later
        positive value resumes."""
        self._now = now
        self._mif = _check_count("max_in_flight", n, 0)
        return self._rebalance(now)

    def tick(self, now: float) -> RdyCommands:
        """Time-driven work; call every 1-5 s (and at :meth:`next_deadline`): backoff window
        expiry (probe), low-RDY rotation, retry of raises that waited for capacity."""
        self._now = now
        out = _Changes()
        if self.backoff.update(now):
            self._rebalance_into(out, now)
        if self.low_rdy_mode and self.backoff.state == NORMAL:
            self._rotate(out, now)
        elif self.backoff.state == PROBING:
            self._rotate_probe(out, now)
        if self._blocked:
            self._retry_blocked(out)
        for c in self._conns.values():
            if c.backoff is not None:
                c.backoff.update(now)
                self._update(c, out, force=True)  # a window or a hold may have ended
        return out.result(self._conns)

    # -- internals --------------------------------------------------------------------------

    def _log_backoff(self, before: str) -> None:
        b = self.backoff
        if b.state == BACKING_OFF:
            level = logging.INFO if before == NORMAL else logging.DEBUG
            log.log(level, "backing off: level %d, RDY 0 for %.1f s", b.level,
                    b.until - self._now)
        elif b.state == NORMAL:
            log.info("backoff over: back to max_in_flight %d", self._mif)

    def _rebalance(self, now: float) -> RdyCommands:
        out = _Changes()
        self.backoff.update(now)
        self._rebalance_into(out, now)
        return out.result(self._conns)

    def _rebalance_into(self, out: _Changes, now: float) -> None:
        """Recompute every share and the probe, lower first, then raise what capacity allows."""
        self._distribute(now)
        self._choose_probe()
        conns = list(self._conns.values())
        for c in conns:
            if self._want(c) < c.rdy:
                self._send(c, self._want(c), out)
        self._clamp(conns, out)
        # Raises: busiest connections first, so capacity goes where messages are.
        conns.sort(key=lambda c: -c.last_message)
        for c in conns:
            self._update(c, out, force=True)

    def _clamp(self, conns: list[_Conn], out: _Changes) -> None:
        """Over budget (max_in_flight was lowered while messages are in flight): shrink unused
        windows, idlest connections first, until no new message can push the in-flight total
        over ``max_in_flight``. The shrunk connections are raised again as messages finish."""
        excess = sum(c.committed for c in conns) - self._mif
        if excess <= 0:
            return
        for c in sorted(conns, key=lambda c: c.last_message):
            slack = c.rdy - c.in_flight
            if slack <= 0:
                continue
            cut = min(slack, excess)
            self._send(c, c.rdy - cut, out)
            self._blocked.add(c.key)
            excess -= cut
            if excess <= 0:
                return

    def _distribute(self, now: float) -> None:
        conns = list(self._conns.values())
        n = len(conns)
        if n == 0:
            return
        if self._mif == 0:
            for c in conns:
                if c.share:
                    c.lose_slot(now)
            return
        if self._mif < n:
            self._distribute_low(conns, now)
            return
        # Water-filling: connections capped below the even share keep their cap and the
        # rest is split again among the others.
        remaining = self._mif
        open_ = conns
        while open_:
            even = remaining // len(open_)
            capped = [c for c in open_ if c.max_rdy <= even]
            if not capped:
                break
            for c in capped:
                c.share = c.max_rdy
                remaining -= c.max_rdy
            open_ = [c for c in open_ if c.max_rdy > even]
        if open_:
            base, extra = divmod(remaining, len(open_))
            # The remainder goes to the connections that are actually delivering.
            ranked = sorted(open_, key=lambda c: (not c.primed, -c.last_message))
            for i, c in enumerate(ranked):
                c.share = base + (1 if i < extra else 0)

    def _distribute_low(self, conns: list[_Conn], now: float) -> None:
        """Fewer slots than connections: keep the current holders (most recently active
        first) up to ``max_in_flight``, fill free slots with the longest-waiting others."""
        holders = [c for c in conns if c.share > 0]
        if len(holders) > self._mif:
            holders.sort(key=lambda c: (-c.last_message, -c.in_flight))
            holders = holders[:self._mif]
        chosen = {id(c) for c in holders}
        waiting = [c for c in conns if id(c) not in chosen]
        holders += self._longest_waiting(waiting, self._mif - len(holders), slot=True)
        chosen = {id(c) for c in holders}
        for c in conns:
            if id(c) in chosen:  # a new holder's turn starts when its RDY goes up
                c.share, c.turn_from = 1, (c.turn_from if c.share else -1.0)
            elif c.share:
                c.lose_slot(now)

    def _longest_waiting(self, conns: list[_Conn], k: int, *,
                         slot: bool = False) -> list[_Conn]:
        if k <= 0:
            return []
        # Random order first, then a stable sort: ties are broken at random. A slot goes by
        # how long it was waited for; the probe by how long ago RDY was last raised.
        conns = conns[:]
        self._rng.shuffle(conns)
        conns.sort(key=(lambda c: c.waiting_since) if slot else (lambda c: c.granted_at))
        return conns[:k]

    def _rotate(self, out: _Changes, now: float) -> None:
        """Low-RDY mode: an idle holder gives way to anyone waiting; one whose turn is over,
        busy or not, to a connection that waited a turn (a slot just given up is not taken
        straight back: the turn bounds the churn). The successor's RDY goes up at once if the
        capacity is free, else on the FIN of the message still in flight."""
        conns = list(self._conns.values())
        waiting = [c for c in conns if c.share == 0 and not (c.backoff is not None and (
            now < c.hold_until or c.backoff.state_at(now) == BACKING_OFF))]  # would not use it
        if not waiting:
            return
        holders = [c for c in conns if c.share > 0]
        turn = self.low_rdy_turn
        idle = [c for c in holders if c.in_flight == 0 and c.key not in self._blocked
                and now - c.idle_since() >= self.low_rdy_idle_timeout]
        done = [c for c in holders if 0 <= c.turn_from <= now - turn
                and all(c is not i for i in idle)]
        givers = sorted(idle, key=_Conn.idle_since) + sorted(done, key=lambda c: c.turn_from)
        taken: list[_Conn] = []
        for c in self._longest_waiting(waiting, len(givers), slot=True):
            if len(taken) >= len(idle) and now - c.waiting_since < turn:
                break  # the rest waited less: the list is longest-waiting first
            taken.append(c)
        for c in givers[:len(taken)]:
            c.lose_slot(now)
            self._send(c, 0, out)
        for c in taken:
            c.share, c.turn_from = 1, -1.0
            self._update(c, out, force=True)

    def _rotate_probe(self, out: _Changes, now: float) -> None:
        """A probe on a connection with nothing to deliver would keep the consumer probing
        for ever (the result never comes): after ``low_rdy_idle_timeout`` move it on."""
        probe = self._conns.get(self._probe) if self._probe is not None else None
        if probe is None or len(self._conns) < 2 or probe.rdy == 0 or probe.in_flight \
                or now - probe.idle_since() < self.low_rdy_idle_timeout:
            return
        others = [c for c in self._conns.values() if c is not probe and c.backoff is None]
        if not others:
            return
        preferred = [c for c in others if c.share > 0] or others
        (successor,) = self._longest_waiting(preferred, 1)
        self._probe = successor.key
        self._send(probe, 0, out)
        self._update(successor, out, force=True)

    def _choose_probe(self) -> None:
        if self.backoff.state != PROBING:
            self._probe = None
            return
        if self._probe is not None and self._probe in self._conns:
            return
        conns = [c for c in self._conns.values() if c.backoff is None]
        if not conns or self._mif == 0:
            self._probe = None
            return
        failed = self._conns.get(self._last_failed) if self._last_failed is not None else None
        if failed is not None and failed.backoff is None:
            self._probe = failed.key  # its requeued message is there
            return
        preferred = [c for c in conns if c.share > 0] or conns
        self._probe = self._rng.choice(preferred).key

    def _want(self, c: _Conn) -> int:
        if self._mif == 0:
            return 0
        if c.backoff is not None:
            if self._now < c.hold_until:
                return 0
            own = c.backoff.state_at(self._now)
            if own == BACKING_OFF:
                return 0
            if own == PROBING:
                return min(c.share, 1)
            return c.share if c.primed else min(c.share, 1)
        state = self.backoff.state
        if state == BACKING_OFF:
            return 0
        if state == PROBING:
            return 1 if c.key == self._probe else 0
        if not c.primed:
            return min(c.share, 1)
        return c.share

    def _update(self, c: _Conn, out: _Changes, *, force: bool) -> None:
        """Move ``c`` towards what it should have; raises respect the 25 % rule (unless
        ``force``) and the committed capacity."""
        want = self._want(c)
        if want <= c.rdy:
            self._blocked.discard(c.key)
            if want < c.rdy:
                self._send(c, want, out)
            return
        if not force and c.rdy > 0 and 4 * (c.rdy - c.in_flight) > c.rdy:
            return  # more than a quarter of the window left: raise later, in one command
        others = sum(o.committed for o in self._conns.values()) - c.committed
        value = min(want, self._mif - others)
        if 0 < c.rdy < value < want and 4 * (value - c.rdy) < want:
            # Capacity trickles back one finished message at a time; wait until the raise is
            # worth a command (a quarter of the share) rather than send RDY n+1, n+2, ...
            value = c.rdy
        if value > c.rdy:
            self._send(c, value, out)
        if value < want:
            self._blocked.add(c.key)
        else:
            self._blocked.discard(c.key)

    def _retry_blocked(self, out: _Changes) -> None:
        for key in list(self._blocked):
            c = self._conns.get(key)
            if c is None:
                self._blocked.discard(key)
            else:
                self._update(c, out, force=True)

    def _send(self, c: _Conn, value: int, out: _Changes) -> None:
        out.record(c)
        if c.rdy == 0 and value > 0:
            c.granted_at = self._now
            if c.turn_from < 0:
                c.turn_from = self._now
        self._total += value - c.rdy
        c.rdy = value
