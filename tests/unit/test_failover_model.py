"""The failover model (smartnsq.model.failover, smartnsq.model.lookupd_health) with generated
inputs: the chase never spins and always ends, probe turns never collide, holds never keep what
lookup names or a partition past the topic's count, an expired leader wait gives up, and lookupd
health always leaves someone to ask."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.model.failover import (
    CHASE_FAST,
    CHASE_FAST_PERIOD,
    CHASE_FOR,
    CHASE_PERIOD,
    FAST_POLL_FOR,
    FAST_POLL_REARM,
    Chase,
    holds,
    leader_wait,
    probe_turn,
    wait_delay,
)
from smartnsq.model.lookupd_health import LookupdHealth, targets
from smartnsq.model.routes import TopicRoutes

times = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
gaps = st.floats(0, 100, allow_nan=False, allow_infinity=False)
periods = st.floats(0.001, 10, allow_nan=False, allow_infinity=False)
nodes = st.tuples(st.just("127.0.0.1"), st.integers(4150, 4155))
leaders = st.dictionaries(st.integers(0, 15), nodes, max_size=16)


def _consumer_steps(chase: Chase, now: float) -> list[tuple[float, bool]]:
    """Walk a consumer's chase from ``now``: (time, own round) of every step until it ends."""
    steps = []
    for _ in range(10_000):
        step = chase.step(now, fast_for=CHASE_FAST, fast_period=CHASE_FAST_PERIOD,
                          period=CHASE_PERIOD)
        steps.append((now, step.own_round))
        if step.next_in is None:
            return steps
        assert step.next_in > 0  # never spins
        now += step.next_in
    raise AssertionError("the chase never ended")


@settings(max_examples=200, deadline=None)
@given(times, st.lists(gaps, max_size=5))
def test_a_consumer_chase_is_fast_first_then_spaced_and_ends(start: float,
                                                            later: list[float]) -> None:
    chase = Chase().lost(start)
    now = start
    for gap in later:  # more losses: each extends the chase, none restarts its fast window
        now += gap
        again = chase.lost(now)
        if chase.active(now):
            assert again.since == chase.since
        else:
            assert again.since == now
        assert again.until == now + CHASE_FOR
        chase = again
    steps = _consumer_steps(chase, now)
    rounds = [own for _, own in steps]
    assert rounds == sorted(rounds, reverse=True)  # own rounds first, never back
    assert all(t < chase.until or i == 0 for i, (t, _) in enumerate(steps))
    for t, own in steps:
        assert own == (t - chase.since < CHASE_FAST)


@given(times)
def test_news_ends_a_chase_at_its_next_step(now: float) -> None:
    chase = Chase().lost(now)
    over = Chase()  # what a view change leaves
    assert chase.active(now) and not over.active(now)
    step = over.step(now, fast_for=CHASE_FAST, fast_period=CHASE_FAST_PERIOD,
                     period=CHASE_PERIOD)
    assert step.next_in is None and not step.own_round


@settings(max_examples=200, deadline=None)
@given(st.lists(gaps, min_size=1, max_size=8), times, periods)
def test_publishers_get_one_fast_start_per_rearm(waits: list[float], start: float,
                                                  wait_refresh: float) -> None:
    chase = Chase()
    now = start
    for gap in waits:
        now += gap
        before = chase
        chase = chase.waited(now)
        assert chase.until == math.inf  # a wait's chase lasts while anyone waits
        if now - before.since >= FAST_POLL_REARM:
            assert chase.since == now
        else:
            assert chase.since == before.since
        step = chase.step(now, fast_for=FAST_POLL_FOR, fast_period=wait_refresh / 2,
                          period=wait_refresh)
        assert step.next_in == (wait_refresh / 2 if step.own_round else wait_refresh)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(gaps, st.booleans()), min_size=1, max_size=20), times, periods,
       st.floats(0, 50, allow_nan=False))
def test_probe_turns_are_a_period_apart_and_within_the_horizon(
        calls: list[tuple[float, bool]], start: float, period: float, horizon: float) -> None:
    next_free = 0.0
    now = start
    handed: list[float] = []
    for gap, _ in calls:
        now += gap / 10
        turn = probe_turn(next_free, now, period, horizon)
        if turn is None:
            assert max(next_free, now) + period - now > horizon
            continue
        assert now < turn <= now + horizon + 1e-9
        handed.append(turn)
        next_free = turn
    for a, b in itertools.pairwise(handed):
        assert b - a >= period - 1e-6


@given(gaps, st.booleans(), st.one_of(st.none(), gaps))
def test_the_wait_after_a_failure(decided: float, reheld: bool, turn: float | None) -> None:
    delay = wait_delay(decided, reheld=reheld, turn=turn)
    if turn is not None:
        assert delay == turn
    elif reheld:
        assert delay == 0.0  # a leader that answers again is asked at once
    else:
        assert delay == decided


@settings(max_examples=300, deadline=None)
@given(leaders, leaders, st.integers(0, 16), st.sets(nodes), st.sets(nodes))
def test_holds_keep_only_dropped_partitions_on_live_leaders(
        old: dict[int, tuple[str, int]], new: dict[int, tuple[str, int]], count: int,
        answering: set[tuple[str, int]], connected: set[tuple[str, int]]) -> None:
    connected |= answering  # an answering connection is an open one
    decided = holds(old, new, count, answering.__contains__, connected.__contains__)
    assert not set(decided.held) & set(decided.lost)
    for p, a in {**decided.held, **decided.lost}.items():
        assert p not in new  # lookup's leader wins
        assert old[p] == a  # held on the leader it had, nowhere else
        assert not count or p < count  # not past the topic's partitions
    for a in decided.held.values():
        assert a in answering
    for a in decided.lost.values():
        assert a in connected and a not in answering  # stalled: held again once it answers
    for p, a in old.items():  # every dropped partition on a live node is kept one way
        if p not in new and (not count or p < count) and a in connected:
            assert p in decided.held or p in decided.lost


@settings(max_examples=200, deadline=None)
@given(leaders, st.integers(0, 16), st.sets(st.integers(0, 15)))
def test_routes_without_a_leader_are_never_round_robin_targets(
        found: dict[int, tuple[str, int]], count: int, held: set[int]) -> None:
    held &= set(found)
    routes = TopicRoutes("t", partition_num=count, youzan=True, leaders=found,
                         held=frozenset(held))
    targets_now = {p for p, _ in routes.targets}
    assert targets_now == set(found) - held  # missing routes and held ones are skipped
    assert routes.partitioned == (count > 0 or bool(found))
    empty = TopicRoutes("t", partition_num=count, youzan=True)
    assert empty.targets == ()  # no leader at all: nothing to write to, not a crash


@settings(max_examples=300, deadline=None)
@given(st.lists(gaps, min_size=1, max_size=30), times, st.floats(0.001, 100))
def test_a_leader_wait_gives_up_past_its_deadline_and_not_before(
        gaps_between: list[float], start: float, timeout: float) -> None:
    since = None
    delay = 0.1
    now = start
    for gap in gaps_between:
        step, waited = leader_wait(since, now, delay, timeout)
        if since is None:
            assert step.since == now and waited == 0
        assert waited == now - step.since
        if step.sleep is None:
            assert waited >= timeout  # expired: give up
            return
        assert waited < timeout
        assert 0 <= step.sleep <= timeout - waited  # never sleeps past the deadline
        assert step.next_delay == min(delay * 2, 2.0)
        since, delay = step.since, step.next_delay
        now += step.sleep + gap


def test_a_leader_wait_with_no_time_left_gives_up_at_once() -> None:
    step, waited = leader_wait(10.0, 15.0, 0.1, 5.0)
    assert step.sleep is None and waited == 5.0


health = st.lists(st.tuples(st.integers(0, 5), st.floats(-10, 10, allow_nan=False),
                            st.integers(0, 3), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(health, st.floats(-5, 5, allow_nan=False))
def test_someone_is_always_asked_healthiest_first(states: list[tuple[int, float, int, bool]],
                                                  now: float) -> None:
    known = []
    for i, (failures, retry_at, slow, seed) in enumerate(states):
        d = LookupdHealth(f"127.0.0.1:{4161 + i}", seed)
        d.failures, d.retry_at, d.slow_streak = failures, retry_at, slow
        known.append(d)
    ranked = targets(known, now)
    assert ranked  # never nobody
    keys = [(d.failures, d.slow_streak, not d.seed) for d in ranked]
    assert keys == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30), times, st.integers(0, 2**32))
def test_a_failing_lookupd_backs_off_and_one_answer_restores_it(
        outcomes: list[bool], now: float, seed: int) -> None:
    d = LookupdHealth("127.0.0.1:4161", seed=False)
    rng = random.Random(seed)
    streak = 0
    for ok in outcomes:
        if ok:
            assert d.succeeded() == streak
            streak = 0
            assert d.failures == 0 and d.retry_at == 0.0 and d.state == "ok"
        else:
            streak += 1
            delay = d.failed(now, "refused", "refused", 1.0, 60.0, rng)
            assert d.failures == streak and d.state == "refused"
            assert 0.8 * min(60.0, 2.0 ** (streak - 1)) <= delay <= 60.0
            assert d.retry_at == pytest.approx(now + delay)
            assert targets([d], now) == [d]  # the only one is asked anyway
        assert d.forgettable(5) == (streak >= 5)
    assert d.status(now).retry_in >= 0
