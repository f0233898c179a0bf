"""Property tests (hypothesis) of the consumer's pure flow decisions: the back-off state
machine and its delays (``smartnsq.model.backoff``), RDY distribution (``smartnsq.model.rdy``),
and lookup's ranking of lookupds (``LookupManager._targets``)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.model.backoff import (
    BACKING_OFF,
    NORMAL,
    PROBING,
    Backoff,
    BackoffPolicy,
    RequeuePolicy,
    exponential_delay,
)
from smartnsq.model.rdy import RdyController

seconds = st.floats(0.001, 1000, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(seconds, st.floats(0, 1000, allow_nan=False), st.integers(-5, 10**6),
       st.floats(0, 1, allow_nan=False), st.integers(0, 2**32 - 1), st.booleans())
def test_exponential_delay_stays_within_its_bounds(base: float, extra: float, attempt: int,
                                                   jitter: float, seed: int,
                                                   symmetric: bool) -> None:
    cap = base + extra
    delay = exponential_delay(base, cap, attempt, jitter, random.Random(seed),
                              symmetric=symmetric)
    plain = min(cap, base * 2 ** min(max(attempt - 1, 0), 60))
    low = plain * (1 - jitter)
    high = plain * (1 + jitter) if symmetric else plain
    assert low - 1e-9 <= delay <= high + 1e-9


@settings(max_examples=300, deadline=None)
@given(st.integers(-3, 10**6), seconds, st.floats(1, 10, allow_nan=False),
       st.floats(0, 1000, allow_nan=False))
def test_requeue_delay_grows_with_attempts_up_to_its_cap(attempts: int, initial: float,
                                                         multiplier: float,
                                                         extra: float) -> None:
    policy = RequeuePolicy(initial=initial, multiplier=multiplier, cap=initial + extra)
    here, later = policy.delay(attempts), policy.delay(max(attempts, 1) + 1)
    assert initial - 1e-9 <= here <= later + 1e-9 <= policy.cap + 2e-9


events = st.lists(st.tuples(st.sampled_from(["fail", "ok", "tick"]),
                            st.floats(0, 300, allow_nan=False)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events, st.floats(0.01, 10, allow_nan=False), st.floats(1, 4, allow_nan=False),
       st.floats(0, 1, allow_nan=False), st.integers(0, 2**32 - 1))
def test_backoff_state_machine_invariants(steps: list[tuple[str, float]], initial: float,
                                          multiplier: float, jitter: float,
                                          seed: int) -> None:
    policy = BackoffPolicy(initial=initial, multiplier=multiplier, max=initial * 30,
                           jitter=jitter)
    b = Backoff(policy, random.Random(seed))
    now = 0.0
    for kind, dt in steps:
        now += dt
        before = b.level
        if kind == "fail":
            b.failure(now)
            assert b.level in (before, before + 1, policy.max_level)
        elif kind == "ok":
            b.success(now)
            assert b.level in (before, before - 1, 0)
        else:
            b.update(now)
        assert 0 <= b.level <= policy.max_level
        assert (b.state == NORMAL) is (b.level == 0)
        assert b.state in (NORMAL, BACKING_OFF, PROBING)
        if b.state == BACKING_OFF:  # a window never longer than the policy's for the level
            assert now < b.until <= now + policy.window(b.level) + 1e-9
    b.reset()
    assert (b.state, b.level, b.until) == (NORMAL, 0, 0.0)


@settings(max_examples=100, deadline=None)
@given(events)
def test_a_disabled_backoff_never_leaves_normal(steps: list[tuple[str, float]]) -> None:
    b = Backoff(BackoffPolicy(enabled=False))
    now = 0.0
    for kind, dt in steps:
        now += dt
        b.failure(now) if kind == "fail" else b.success(now)
        assert b.state == NORMAL and b.level == 0


rdy_ops = st.lists(st.tuples(st.sampled_from(["add", "remove", "msg", "fin", "req", "quiet",
                                              "tick", "mif"]),
                             st.integers(0, 7), st.floats(0, 30, allow_nan=False),
                             st.integers(0, 50)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), rdy_ops, st.integers(0, 2**32 - 1))
def test_rdy_never_promises_more_than_max_in_flight(mif: int, ops: list[tuple[str, int,
                                                                                float, int]],
                                                    seed: int) -> None:
    rdy = RdyController(mif, low_rdy_idle_timeout=5.0, rng=random.Random(seed),
                        backoff=BackoffPolicy(initial=1.0, max=8.0))
    limits: dict[int, int] = {}
    now = 0.0
    for op, conn, dt, n in ops:
        now += dt
        if op == "add" and conn not in rdy:
            limits[conn] = 1 + n % 5
            commands = rdy.add(conn, limits[conn], now)
        elif op == "remove":
            commands = rdy.remove(conn, now)
        elif conn in rdy and op == "msg" and rdy.in_flight(conn) < rdy.rdy(conn):
            commands = rdy.on_message(conn, now)  # the server sends only within RDY
        elif conn in rdy and op in ("fin", "req") and rdy.in_flight(conn):
            commands = rdy.on_finished(conn, now, success=op == "fin")
        elif conn in rdy and op == "quiet" and rdy.in_flight(conn):
            # a requeue that says nothing about the handler's health (req(backoff=False), a
            # drain): the back-off's level stays where it was
            level = rdy.backoff.level
            commands = rdy.on_finished(conn, now, success=False, backoff=False)
            assert rdy.backoff.level == level
        elif op == "mif":
            mif = n
            commands = rdy.set_max_in_flight(n, now)
        else:
            commands = rdy.tick(now)
        assert len({c for c, _ in commands}) == len(commands)  # one command per connection
        assert rdy.total_rdy == sum(rdy.rdy(c) for c in rdy) <= rdy.max_in_flight == mif
        for c in rdy:
            assert 0 <= rdy.rdy(c) <= limits[c]
        if rdy.backoff.state == BACKING_OFF:
            assert rdy.total_rdy == 0
        elif rdy.backoff.state == PROBING:
            assert rdy.total_rdy <= 1
