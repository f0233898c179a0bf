"""Backoff state machine and requeue-delay policy (sans-I/O, time passed in)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.config import describe
from smartnsq.errors import InvalidArgument
from smartnsq.model.backoff import Backoff, BackoffPolicy, RequeuePolicy

EXACT = BackoffPolicy(jitter=0.0)


def test_defaults_are_go_nsq_like() -> None:
    p = BackoffPolicy()
    assert (p.enabled, p.initial, p.multiplier, p.max) == (True, 1.0, 2.0, 120.0)
    assert [p.window(n) for n in range(0, 5)] == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert p.window(8) == 120.0  # 128 capped
    assert p.max_level == 8
    assert p.window(1000) == 120.0


def test_policy_fields_are_documented() -> None:
    for cls in (BackoffPolicy, RequeuePolicy):
        rows = describe(cls)
        assert rows and all(row.doc for row in rows)


@pytest.mark.parametrize("kwargs", [
    {"initial": 0}, {"initial": -1}, {"initial": math.nan}, {"multiplier": 0.5},
    {"max": 0.5}, {"jitter": 1.5}, {"jitter": -0.1}, {"enabled": 1}, {"initial": True},
    {"max": math.inf},
])
def test_policy_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        BackoffPolicy(**kwargs)  # type: ignore[arg-type]


def test_starts_normal() -> None:
    b = Backoff(EXACT)
    assert (b.state, b.level, b.until, b.active) == ("normal", 0, 0.0, False)
    b.success(5.0)
    assert b.state == "normal"


def test_failure_backs_off_then_probes() -> None:
    b = Backoff(EXACT)
    b.failure(10.0)
    assert (b.state, b.level, b.until) == ("backing_off", 1, 11.0)
    assert b.state_at(10.9) == "backing_off"
    assert b.state_at(11.0) == "probing"
    assert b.state_at(0.0) == "backing_off"  # state_at changes nothing
    assert not b.update(10.5)
    assert b.update(11.0)
    assert b.state_at(11.0) == b.state == "probing"
    assert b.until == 0.0


def test_one_result_per_window() -> None:
    b = Backoff(EXACT)
    b.failure(0.0)
    for _ in range(5):
        b.failure(0.5)
        b.success(0.5)
    assert (b.state, b.level, b.until) == ("backing_off", 1, 1.0)


def test_failed_probe_doubles_the_window() -> None:
    b = Backoff(EXACT)
    b.failure(0.0)
    b.failure(1.0)  # window expired: this is the probe's result
    assert (b.state, b.level, b.until) == ("backing_off", 2, 3.0)
    b.update(3.0)
    b.failure(3.0)
    assert (b.level, b.until) == (3, 7.0)


def test_success_streak_walks_back_to_normal() -> None:
    b = Backoff(EXACT)
    now = 0.0
    b.failure(now)
    for _ in range(2):
        now = b.until
        b.failure(now)
    assert b.level == 3
    levels = []
    while b.state != "normal":
        now = b.until
        b.success(now)
        levels.append(b.level)
    assert levels == [2, 1, 0]
    assert b.until == 0.0


def test_level_stops_at_the_ceiling() -> None:
    b = Backoff(BackoffPolicy(initial=1, multiplier=2, max=4, jitter=0))
    now = 0.0
    b.failure(now)
    for _ in range(10):
        now = b.until
        b.failure(now)
    assert b.level == 3
    assert b.until - now == 4.0
    # so three successes are enough to recover
    for _ in range(3):
        b.success(b.until)
    assert b.state == "normal"


def test_disabled_policy_ignores_everything() -> None:
    b = Backoff(BackoffPolicy(enabled=False))
    for t in range(5):
        b.failure(float(t))
    assert (b.state, b.level) == ("normal", 0)


def test_reset() -> None:
    b = Backoff(EXACT)
    b.failure(0.0)
    b.reset()
    assert (b.state, b.level, b.until) == ("normal", 0, 0.0)


def test_jitter_is_bounded_and_reproducible() -> None:
    policy = BackoffPolicy(initial=10, jitter=0.5)
    windows = []
    for seed in range(20):
        b = Backoff(policy, random.Random(seed))
        b.failure(100.0)
        windows.append(b.until - 100.0)
        again = Backoff(policy, random.Random(seed))
        again.failure(100.0)
        assert again.until == b.until
    assert all(5.0 <= w <= 10.0 for w in windows)
    assert len(set(windows)) > 1


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 300)), max_size=40))
def test_backoff_invariants(events: list[tuple[bool, float]]) -> None:
    b = Backoff(BackoffPolicy(), random.Random(0))
    now = 0.0
    for ok, dt in events:
        now += dt
        (b.success if ok else b.failure)(now)
        assert 0 <= b.level <= b.policy.max_level
        assert (b.state == "normal") == (b.level == 0)
        if b.state == "backing_off":
            assert now < b.until <= now + b.policy.max


# -- requeue delay ------------------------------------------------------------------------


def test_requeue_delay_is_exponential_and_capped() -> None:
    p = RequeuePolicy(initial=1, multiplier=2, cap=10)
    assert [p.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert p.delay(0) == 1.0
    assert p.delay(10**6) == 10.0  # no overflow


def test_requeue_defaults() -> None:
    p = RequeuePolicy()
    assert p.delay(1) == 1.0
    assert p.delay(100) == 900.0


def test_requeue_constant_and_zero() -> None:
    assert RequeuePolicy(initial=5, multiplier=1, cap=5).delay(50) == 5.0
    assert RequeuePolicy(initial=0, cap=0).delay(7) == 0.0


def test_requeue_jitter() -> None:
    p = RequeuePolicy(initial=8, cap=8, jitter=0.25)
    values = {p.delay(3, random.Random(s)) for s in range(20)}
    assert all(6.0 <= v <= 8.0 for v in values)
    assert len(values) > 1


@pytest.mark.parametrize("kwargs", [
    {"initial": -1}, {"multiplier": 0.9}, {"cap": 0.5}, {"jitter": 2},
])
def test_requeue_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        RequeuePolicy(**kwargs)


def test_requeue_rejects_bad_attempts() -> None:
    with pytest.raises(InvalidArgument):
        RequeuePolicy().delay(1.5)  # type: ignore[arg-type]


def test_flow_control_doc_tables_match_the_code() -> None:
    from pathlib import Path

    from reference import config_table

    doc = (Path(__file__).parents[2] / "docs" / "flow-control.md").read_text()
    for dotted in ("smartnsq.BackoffPolicy", "smartnsq.RequeuePolicy"):
        # the site's build hook renders the marker from the code (or a pasted table matches)
        assert f"<!-- reference: config {dotted} -->" in doc \
            or config_table(dotted).strip() in doc, f"regenerate the {dotted} table"
