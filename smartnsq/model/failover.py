"""When to ask again where a partition's leader is, and what to do meanwhile: pure decisions.

Every rule here takes the time as an argument and returns a value (like :mod:`smartnsq.model.rdy`
and :mod:`smartnsq.model.backoff`), so it can be checked with generated inputs; the asyncio shells
(:mod:`smartnsq.discovery.route_book` for publishers, :mod:`smartnsq.discovery.chase` for consumers,
the Spark driver's :class:`~smartnsq.spark.conditions.LeaderWait`) only keep the state and the
timers.

* **The chase.** After something says a route is wrong (a publish refused, a consumer's link
  lost), lookup is asked again and again until its answer changes. A graceful handoff ends
  0.07-4.1 s after a leave on the real cluster, so the first ``FAST_POLL_FOR`` s of a chase
  are *rounds of their own* every fast period (past the lookup manager's spacing of rounds that
  find nothing new): the new leader is then learned within about 50 ms of lookup knowing it.
  Later steps are ordinary refreshes the lookup manager spaces. One :class:`Chase` value holds
  both the publishers' rule (a chase lasts while anyone waits; a new fast start at most once
  per ``FAST_POLL_REARM`` s) and the consumers' (a chase lasts ``CHASE_FOR`` s after the last
  loss; losses during a chase do not restart its fast window).
* **Probe turns.** A partition whose leader refuses writes for now (``E_FAILED_ON_NOT_WRITABLE``)
  is asked by one publish at a time, ``period`` apart (:func:`probe_turn`), the period
  doubling per refused probe after the first ``PROBES_AT_BASE`` up to ``PROBE_PERIOD_MAX``
  (:class:`ProbePace`): a partition refusing for minutes costs its leader about one refused
  command per ``PROBE_PERIOD_MAX``.
* **Refused subscriptions.** A consumer's ``SUB`` refused because the partition is not
  writable (the leader's channels are disabled while it catches up) is asked again on the
  same bounded pace (:func:`sub_probe_delay`, at most ``SUB_PROBE_MAX`` apart), and at once
  when lookup lists the partition for writers again (:func:`listed_again`): the evidence that
  wakes the publishers.
* **Holds.** A partition lookup stops listing while its leader's connection still answers is
  held on that leader (:func:`holds`): youzan hides partitions that refuse writes, and the
  leader is the first to know when they work again.
* **Waiting for a leader with a deadline.** :func:`leader_wait` is the Spark driver's rule: a
  growing pause between tries, and an error once the partition had no leader for too long.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from .backoff import exponential_delay
from .routes import Address

__all__ = [
    "CHASE_FAST",
    "CHASE_FAST_PERIOD",
    "CHASE_FIRST",
    "CHASE_FOR",
    "CHASE_PERIOD",
    "FAST_POLL_FOR",
    "FAST_POLL_REARM",
    "LEADER_WAIT_FIRST",
    "PROBES_AT_BASE",
    "PROBE_PERIOD_MAX",
    "ROUND_TIMEOUT",
    "SUB_PROBE_MAX",
    "WRITERS_LOOK_EVERY",
    "WRITERS_WATCH_FOR",
    "Chase",
    "Hold",
    "LeaderWaitStep",
    "ProbePace",
    "Step",
    "holds",
    "leader_wait",
    "listed_again",
    "probe_turn",
    "still_refused",
    "sub_probe_delay",
    "wait_delay",
]

# publishers: while a publish waits on a topic's routes
FAST_POLL_FOR = 5.0  # s at the start of a wait: rounds of their own, twice as often
FAST_POLL_REARM = 30.0  # s before another wait of the topic gets a fast start again
ROUND_TIMEOUT = 1.0  # s one round of its own may take (publishers' and consumers')

# consumers: after a lost link or a refused SUB
CHASE_FIRST = 0.05  # s from the loss to the first refresh (losses close together make one)
CHASE_PERIOD = 0.1  # s between the refreshes asked for after a loss
CHASE_FAST_PERIOD = 0.05  # ... and between the rounds of the first CHASE_FAST seconds
CHASE_FOR = 10.0  # s after the last loss those refreshes go on (or until the view changes)
CHASE_FAST = 5.0  # s after a loss during which they are rounds of their own (not spaced):
# the real cluster's slowest graceful handoffs took 1.3-4.1 s (docs/devcluster.md)

# a partition whose leader refuses writes for now (E_FAILED_ON_NOT_WRITABLE): how often it is
# asked again. The real cluster keeps a partition unwritable for 22-49 s after a replica's
# loss and 93-139 s while a spare catches up (docs/reliability.md, "Recovery pace")
PROBE_PERIOD_MAX = 1.0  # s: the longest gap between two publishes probing one partition
PROBES_AT_BASE = 2  # refused probes of a partition at the producer's retry_delay, then doubling
SUB_PROBE_MAX = 2.0  # s: the longest gap between two SUBs of a partition refusing them
WRITERS_LOOK_EVERY = 1.0  # s: a consumer with a refused SUB asks lookup's writer view so often
WRITERS_WATCH_FOR = 10.0  # s after a partition's last refused SUB the writer view is watched

# the Spark driver and executors: waiting for a partition's leader, blocking
LEADER_WAIT_FIRST = 0.1  # s the first pause; it doubles per failure up to 2 s


class Step(NamedTuple):
    """One step of a chase: what to ask now, and when the next step is."""

    own_round: bool
    """A lookup round of its own now (past the lookup manager's spacing of idle rounds), or
    (False) an ordinary refresh the manager may coalesce and space."""
    next_in: float | None
    """Seconds to the next step; ``None``: the chase is over."""


class Chase(NamedTuple):
    """One topic's chase: ``since`` is when its fast window began, ``until`` when it ends
    (``math.inf``: as long as someone waits). The empty value is "no chase".

    (The values here are NamedTuples, not dataclasses: a frozen dataclass costs about 3M
    instructions to create at import, a NamedTuple 0.4M, and every client imports these.)"""

    since: float = -math.inf
    until: float = -math.inf

    def active(self, now: float) -> bool:
        return now < self.until

    def waited(self, now: float, rearm: float = FAST_POLL_REARM) -> Chase:
        """A publisher starts waiting on the topic: the chase lasts while anyone waits; its
        fast window restarts unless the last one began less than ``rearm`` s ago (waits that
        keep restarting, a dead partition's publishes, get one fast start, not one each)."""
        since = now if now - self.since >= rearm else self.since
        return Chase(since, math.inf)

    def lost(self, now: float, chase_for: float = CHASE_FOR) -> Chase:
        """A consumer lost a link (or had a SUB refused): chase for ``chase_for`` s from now;
        a loss during a chase (a dead node retried) extends it without a new fast window."""
        since = self.since if self.active(now) else now
        return Chase(since, now + chase_for)

    def step(self, now: float, *, fast_for: float, fast_period: float,
             period: float) -> Step:
        """The step due at ``now``: a round of its own every ``fast_period`` during the first
        ``fast_for`` s, then a spaced refresh every ``period``, until ``until``."""
        fast = now - self.since < fast_for
        gap = fast_period if fast else period
        return Step(fast, gap if now + gap < self.until else None)


def probe_turn(next_free: float, now: float, period: float, horizon: float) -> float | None:
    """When a publish refused by a partition's leader (not writable now) may try again.

    Retries of one partition take turns ``period`` apart, so a partition is asked about once
    per ``period`` however many publishes wait on it, and the first success wakes the rest
    (:meth:`~smartnsq.discovery.route_book.RouteBook.writable`). ``next_free`` is the last turn
    handed out (0 if none). Returns the time of this caller's turn, or None when the next free one
    is more than ``horizon`` away: that caller waits on its ordinary back-off for the wake-up.
    """
    turn = max(next_free, now) + period
    if turn - now > horizon:
        return None
    return turn


class ProbePace(NamedTuple):
    """One refusing partition's probe turns: how many probes it refused in a row and the last
    turn handed out (0: none). The empty value is "not refusing"."""

    refusals: int = 0
    next_free: float = 0.0

    def period(self, base: float, cap: float = PROBE_PERIOD_MAX) -> float:
        """The gap between turns now: ``base`` for the first ``PROBES_AT_BASE`` refusals (a
        short refusal, a fresh leader's 0.3 s, is over quickly), then doubled per refusal, at
        most ``cap`` (never below ``base``: a user's slower ``retry_delay`` stays)."""
        n = min(max(self.refusals - PROBES_AT_BASE, 0), 62)
        return max(base, min(cap, base * (1 << n)))

    def turn(self, now: float, base: float, horizon: float,
             cap: float = PROBE_PERIOD_MAX) -> tuple[ProbePace, float | None]:
        """A refused probe asks for the next turn: the pace after counting the refusal, and
        the time of the turn (:func:`probe_turn` at the grown period), or None when it is
        more than ``horizon`` away (the pace is unchanged then: nothing was handed out)."""
        grown = ProbePace(self.refusals + 1, self.next_free)
        at = probe_turn(self.next_free, now, grown.period(base, cap), horizon)
        if at is None:
            return grown, None
        return ProbePace(grown.refusals, at), at


def sub_probe_delay(refusals: int, base: float, most: float, rng: random.Random | None = None,
                    cap: float = SUB_PROBE_MAX) -> float:
    """The pause before the next ``SUB`` of a partition that refused ``refusals`` in a row as
    not writable: the consumer's reconnect back-off (``base`` doubling, jittered), but at most
    ``cap`` (or ``base``, when the user's first delay is longer) and never past ``most`` (the
    consumer's ``reconnect_delay_max``). The leader is alive and answers; only its channel is
    disabled while it catches up, so the reconnect back-off's minute-long ceiling would only
    make the consumer resume late."""
    return exponential_delay(base, min(most, max(cap, base)), refusals, 0.5, rng)


def listed_again(refused: Iterable[int], before: Iterable[int] | None,
                 after: Iterable[int]) -> set[int]:
    """The refused partitions lookup's writer view (``access=w``) lists now and did not list
    before (``before`` None: not known; every listed one counts): youzan lists a partition for
    writers only while it takes writes, so that is when a refused ``SUB`` is worth asking
    again at once."""
    now = set(after)
    was = set(before) if before is not None else set()
    return {p for p in refused if p in now and p not in was}


def still_refused(refused: Mapping[int, float], now: float,
                  keep: float = WRITERS_WATCH_FOR) -> dict[int, float]:
    """The partitions (with the time of their last refused ``SUB``) still worth watching the
    writer view for at ``now``: refused within ``keep`` s. A partition whose SUB went through
    is refused no more, so its watch lapses ``keep`` s after its last refusal (a refusing one
    is refused at least every ``SUB_PROBE_MAX`` s)."""
    return {p: at for p, at in refused.items() if now - at < keep}


def wait_delay(decided: float, *, reheld: bool, turn: float | None) -> float:
    """How long a failed publish waits before its next attempt: the delay the retry decision
    chose, none when its partition was just held again on a leader that answers again (ask
    it now), or the partition's probe turn when one comes sooner (``turn``, seconds)."""
    delay = 0.0 if reheld else decided
    return turn if turn is not None else delay


class Hold(NamedTuple):
    """What :func:`holds` decided for the partitions lookup stopped listing."""

    held: Mapping[int, Address]
    """Partitions to keep on their old leader (it answers)."""
    lost: Mapping[int, Address]
    """Partitions whose old leader is connected but stalled: held again once it answers."""


def holds(old: Mapping[int, Address], new: Mapping[int, Address], partition_num: int,
          answering: Callable[[Address], bool], connected: Callable[[Address], bool]) -> Hold:
    """Which partitions of ``old`` that ``new`` no longer names stay on their old leader.

    A partition is held when its leader's connection answers (``answering``); when the
    connection is open but owes answers (a stalled node: a publish there would only queue) it
    is remembered as lost instead; a partition past ``partition_num`` (the topic shrank) is
    neither. Partitions ``new`` names are never held: lookup's leader wins.
    """
    held: dict[int, Address] = {}
    lost: dict[int, Address] = {}
    for p, a in old.items():
        if p in new or (partition_num and p >= partition_num):
            continue
        if answering(a):
            held[p] = a
        elif connected(a):
            lost[p] = a
    return Hold(held, lost)


class LeaderWaitStep(NamedTuple):
    """The next move of a caller waiting for a partition's leader (:func:`leader_wait`)."""

    since: float
    """When the wait began (kept by the caller for the next failure)."""
    sleep: float | None
    """Seconds to pause before trying again; ``None``: the wait is over, give up."""
    next_delay: float
    """The pause after the next failure."""


def leader_wait(since: float | None, now: float, delay: float, timeout: float,
                *, delay_max: float = 2.0) -> tuple[LeaderWaitStep, float]:
    """One transient failure of a caller waiting up to ``timeout`` s for a leader.

    ``since``: when the current wait began (``None``: this failure begins it); ``delay``: the
    pause this failure earns (doubling per failure up to ``delay_max``). Returns the step and
    how long the wait has lasted: ``sleep`` is ``None`` once ``timeout`` has passed, else the
    pause, never past the deadline.
    """
    start = now if since is None else since
    waited = now - start
    if waited >= timeout:
        return LeaderWaitStep(start, None, delay), waited
    return LeaderWaitStep(start, min(delay, timeout - waited),
                          min(delay * 2, delay_max)), waited
