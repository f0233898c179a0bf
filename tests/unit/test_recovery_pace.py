"""Recovery at the server's pace (issue 33 item 9): probes of a partition that refuses writes
back off and are bounded per partition; a refused SUB is asked again on a bounded pace and at
once on the writers' evidence. The pure rules (smartnsq.model.failover) with the time passed
in, and the publishers' route book carrying them out."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.model.failover import (
    PROBE_PERIOD_MAX,
    PROBES_AT_BASE,
    SUB_PROBE_MAX,
    WRITERS_WATCH_FOR,
    ProbePace,
    listed_again,
    still_refused,
    sub_probe_delay,
)


def test_probe_turns_of_a_refusing_partition_spread_out_to_the_cap() -> None:
    pace, now, base = ProbePace(), 100.0, 0.05
    turns = []
    for _ in range(12):  # every probe refused, each asking for the next turn
        pace, at = pace.turn(now, base, horizon=60.0)
        assert at is not None
        turns.append(at)
    gaps = [b - a for a, b in zip([now, *turns], turns, strict=False)]
    assert gaps[:PROBES_AT_BASE] == pytest.approx([base] * PROBES_AT_BASE)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(gaps))  # never faster
    assert gaps[-1] == pytest.approx(PROBE_PERIOD_MAX)


@given(st.lists(st.floats(0.0, 0.5), min_size=1, max_size=200),
       st.sampled_from([0.01, 0.05, 0.2]))
def test_refused_probes_per_minute_are_bounded(arrivals: list[float], base: float) -> None:
    """However many publishes wait and whenever they ask, the turns handed out over a span
    are at most the ramp plus one per ``PROBE_PERIOD_MAX``."""
    pace, now = ProbePace(), 0.0
    turns: list[float] = []
    for step in arrivals:
        now += step
        pace, at = pace.turn(now, base, horizon=PROBE_PERIOD_MAX)
        if at is not None:
            assert at > now
            turns.append(at)
    assert turns == sorted(turns)
    span = (turns[-1] - turns[0]) if turns else 0.0
    ramp = PROBES_AT_BASE + 8  # turns before the period reaches the cap (base 0.01: 7)
    assert len(turns) <= ramp + span / PROBE_PERIOD_MAX + 1


def test_a_user_slower_retry_delay_is_kept() -> None:
    assert ProbePace(refusals=1).period(3.0) == 3.0
    assert ProbePace(refusals=50).period(3.0) == 3.0


def test_a_refused_sub_is_asked_again_within_the_probe_cap() -> None:
    rng = random.Random(1)
    delays = [sub_probe_delay(n, 1.0, 60.0, rng) for n in range(1, 40)]
    assert max(delays) <= SUB_PROBE_MAX
    assert min(delays) >= 0.5  # jittered, never below half the first delay
    assert sub_probe_delay(30, 5.0, 60.0, rng) <= 5.0  # a longer first delay stays the cap
    assert sub_probe_delay(30, 1.0, 1.5, rng) <= 1.5  # never past reconnect_delay_max


def test_a_partition_listed_for_writers_again_is_news_once() -> None:
    assert listed_again({0, 2}, {1}, {0, 1}) == {0}
    assert listed_again({0}, {0, 1}, {0, 1}) == set()  # listed all along: no news
    assert listed_again({0}, None, {0}) == {0}  # first look: listed counts
    assert listed_again(set(), None, {0, 1}) == set()  # nothing refused


def test_refused_partitions_are_watched_for_a_while_after_their_last_refusal() -> None:
    refused = {0: 10.0, 1: 15.0}
    assert still_refused(refused, 10.0 + WRITERS_WATCH_FOR - 0.1) == refused
    assert still_refused(refused, 10.0 + WRITERS_WATCH_FOR + 0.1) == {1: 15.0}
    assert still_refused(refused, 15.0 + WRITERS_WATCH_FOR) == {}
