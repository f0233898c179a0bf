"""Consumer backoff and requeue-delay policies, sans-I/O.

Two separate knobs, as the client guide asks (seed "Building Client Libraries", *Backoff*):

* :class:`Backoff` decides whether a consumer should *slow down* after handler failures.
  A failing downstream system gets breathing room: the consumer stops taking messages (RDY 0
  everywhere) for an exponentially growing window, then tests the waters with a single RDY 1
  (the probe). Only one result per window is counted, so a burst of failures from messages
  that were already in flight does not push the backoff to its ceiling in one go.
* :class:`RequeuePolicy` decides how long a *single failed message* waits before the server
  delivers it again (the ``REQ`` delay), from its attempt count.

Nothing here sleeps, reads a clock or touches a socket: the caller passes ``now`` (any
monotonic clock, in seconds) and reacts to the state. Randomness (jitter, so consumers that
failed together do not resume together) comes from an injectable :class:`random.Random`, which
makes every transition reproducible in tests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from ..config import check_fields, doc, flag, number, seconds
from ..protocol.numbers import check_int

__all__ = [
    "BACKING_OFF",
    "NORMAL",
    "PROBING",
    "Backoff",
    "BackoffPolicy",
    "BackoffState",
    "RequeuePolicy",
    "exponential_delay",
]

BackoffState = Literal["normal", "backing_off", "probing"]
NORMAL: BackoffState = "normal"
BACKING_OFF: BackoffState = "backing_off"
PROBING: BackoffState = "probing"


_MAX_DOUBLINGS = 62  # 2**62 times any sane base is past any cap; larger would overflow floats


def exponential_delay(base: float, cap: float, attempt: int, jitter: float = 0.0,
                      rng: random.Random | None = None, *, symmetric: bool = False) -> float:
    """The library's one retry delay: ``base`` doubled per further ``attempt`` (1: ``base``),
    at most ``cap``, then jittered so clients that failed together do not retry together.

    ``jitter`` is the fraction randomly cut off the delay (``0.5``: between half and all of
    it); ``symmetric=True`` spreads it both ways instead (``0.2``: 80% to 120%). Random
    numbers come from ``rng`` (tests pass a seeded one) or the ``random`` module. Attempt
    counts of any size are fine: the doubling stops once past ``cap``.
    """
    n = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
    delay = min(cap, base * (1 << n))
    if jitter:
        r = (rng if rng is not None else random).random()
        delay *= 1.0 + jitter * (2.0 * r - 1.0) if symmetric else 1.0 - jitter * r
    return float(delay)


@dataclass(frozen=True)
class BackoffPolicy:
    """How a consumer slows down after handler failures (go-nsq-like defaults)."""

    enabled: bool = field(default=True, metadata=doc(
        "Slow the consumer down after handler failures (RDY 0, then RDY 1 probes; per "
        "partition on ordered subscriptions); off favours latency over protecting a failing "
        "downstream system.", check=flag()))
    initial: float = field(default=1.0, metadata=doc(
        "Length of the first backoff window, after one failure.", unit="s",
        check=seconds(0)))
    multiplier: float = field(default=2.0, metadata=doc(
        "Growth of the window per further failed probe.", check=number(1)))
    max: float = field(default=120.0, metadata=doc(
        "Longest backoff window; the failure level stops growing once it is reached, so "
        "recovery takes a bounded number of successful probes.", unit="s",
        check=seconds("initial", low_open=False)))
    jitter: float = field(default=0.2, metadata=doc(
        "Fraction of each window randomly cut off, so consumers that failed together do "
        "not probe together.", check=number(0, high=1)))

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_level(self) -> int:
        """The level whose window first reaches ``max`` (levels above it add nothing)."""
        if self.multiplier == 1 or self.initial >= self.max:
            return 1
        return 1 + math.ceil(math.log(self.max / self.initial, self.multiplier) - 1e-9)

    def window(self, level: int) -> float:
        """Window length (before jitter) at failure ``level`` (1 = first failure)."""
        if level <= 0:
            return 0.0
        level = min(level, self.max_level)
        return float(min(self.max, self.initial * self.multiplier ** (level - 1)))


class Backoff:
    """Failure-driven backoff state machine shared by all of one consumer's connections.

    States:

    ``normal``
        Full flow. A counted failure enters ``backing_off`` at level 1.
    ``backing_off``
        No flow until ``until``; results reported meanwhile are ignored (one result per
        window). :meth:`update` (or any result reported at or after ``until``) moves on to
        ``probing``.
    ``probing``
        The consumer lets exactly one message through (RDY 1 on one connection). The next
        result decides: a failure raises the level and backs off longer; a success lowers it
        and backs off shorter, or returns to ``normal`` when the level reaches 0. So a
        streak of successes walks back to full flow, one window at a time, as go-nsq does.

    With ``policy.enabled`` false every report is ignored and the state stays ``normal``.
    """

    def __init__(self, policy: BackoffPolicy | None = None,
                 rng: random.Random | None = None) -> None:
        self.policy = policy if policy is not None else BackoffPolicy()
        self._rng = rng if rng is not None else random.Random()
        self._state: BackoffState = NORMAL
        self._level = 0
        self._until = 0.0

    def __repr__(self) -> str:
        return f"<Backoff {self._state} level={self._level} until={self._until:g}>"

    @property
    def state(self) -> BackoffState:
        """The state as of the last call that passed ``now`` (see :meth:`state_at`)."""
        return self._state

    @property
    def level(self) -> int:
        """Number of net failures being paid for (0 in ``normal``)."""
        return self._level

    @property
    def until(self) -> float:
        """End of the current window while ``backing_off`` (0.0 otherwise)."""
        return self._until if self._state == BACKING_OFF else 0.0

    @property
    def active(self) -> bool:
        """Flow is restricted (backing off or probing)."""
        return self._state != NORMAL

    def state_at(self, now: float) -> BackoffState:
        """The state ``now`` would see, without changing anything."""
        if self._state == BACKING_OFF and now >= self._until:
            return PROBING
        return self._state

    def update(self, now: float) -> bool:
        """Let time pass: an expired window becomes ``probing``. True when the state changed."""
        if self._state == BACKING_OFF and now >= self._until:
            self._state = PROBING
            return True
        return False

    def failure(self, now: float) -> None:
        """A handler failed (a REQ that should slow the consumer down)."""
        if not self.policy.enabled:
            return
        self.update(now)
        if self._state == BACKING_OFF:
            return  # one result per window
        self._level = min(self._level + 1, self.policy.max_level)
        self._start_window(now)

    def success(self, now: float) -> None:
        """A handler succeeded (FIN)."""
        if not self.policy.enabled:
            return
        self.update(now)
        if self._state != PROBING:
            return  # normal: nothing to undo; backing off: one result per window
        self._level -= 1
        if self._level <= 0:
            self.reset()
        else:
            self._start_window(now)

    def reset(self) -> None:
        """Back to full flow at once (e.g. the operator knows the downstream recovered)."""
        self._state = NORMAL
        self._level = 0
        self._until = 0.0

    def _start_window(self, now: float) -> None:
        length = self.policy.window(self._level)
        if self.policy.jitter:
            length *= 1.0 - self.policy.jitter * self._rng.random()
        self._until = now + length
        self._state = BACKING_OFF


@dataclass(frozen=True)
class RequeuePolicy:
    """REQ delay for a failed message from how often it was delivered already.

    Exponential in the attempt count so a poison message stops hammering the handler, capped
    so it is still retried in reasonable time. The server clamps the delay to its own
    ``max_req_timeout`` anyway; ordered channels ignore a delay > 0 (docs/protocol.md §3.6),
    so the consumer sends 0 there whatever this says.
    """

    initial: float = field(default=1.0, metadata=doc(
        "Delay before the first redelivery (attempts = 1); on ordered subscriptions the "
        "consumer holds the partition for it (at least 0.1 s).", unit="s",
        check=seconds(0, low_open=False)))
    multiplier: float = field(default=2.0, metadata=doc(
        "Growth of the delay per further attempt.", check=number(1)))
    cap: float = field(default=900.0, metadata=doc(
        "Longest delay (go-nsq's max_requeue_delay is 15 min).", unit="s",
        check=seconds("initial", low_open=False)))
    jitter: float = field(default=0.0, metadata=doc(
        "Fraction of the delay randomly cut off, to spread retries of a failed batch.",
        check=number(0, high=1)))

    def __post_init__(self) -> None:
        check_fields(self)

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds to requeue a message with for its ``attempts``-th delivery failure.

        ``attempts`` is the message's attempt counter (1 on first delivery); values below 1
        are treated as 1. Jitter (when configured) draws from ``rng`` or a shared generator.
        """
        check_int("attempts", attempts)
        n = max(attempts, 1) - 1
        if self.multiplier == 1 or self.initial == 0:
            value = self.initial
        else:
            # Stop multiplying once past the cap: large attempt counts must not overflow.
            limit = math.log(self.cap / self.initial, self.multiplier) if self.cap else 0.0
            value = self.cap if n > limit else min(self.cap,
                                                   self.initial * self.multiplier ** n)
        if self.jitter and value:
            value *= 1.0 - self.jitter * (rng if rng is not None else random).random()
        return float(value)
