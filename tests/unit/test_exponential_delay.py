"""``smartnsq.model.backoff.exponential_delay``: the one jittered doubling delay every retry
uses."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

import smartnsq
from smartnsq import Consumer
from smartnsq.model.backoff import exponential_delay


def test_doubles_per_attempt_up_to_the_cap() -> None:
    assert [exponential_delay(0.5, 5.0, a) for a in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]
    assert exponential_delay(0.5, 5.0, 0) == 0.5  # below 1 counts as the first attempt
    assert exponential_delay(0.0, 5.0, 9) == 0.0


def test_any_attempt_count_is_fine() -> None:
    assert exponential_delay(1.0, 60.0, 10**6) == 60.0


def test_jitter_cuts_off_or_spreads() -> None:
    rng = random.Random(7)
    below = [exponential_delay(2.0, 100.0, 3, 0.5, rng) for _ in range(500)]
    assert all(4.0 <= d <= 8.0 for d in below) and min(below) < 4.5 and max(below) > 7.5
    around = [exponential_delay(2.0, 100.0, 3, 0.2, rng, symmetric=True) for _ in range(500)]
    assert all(6.4 <= d <= 9.6 for d in around) and min(around) < 6.8 and max(around) > 9.2


def test_same_seed_same_delays() -> None:
    a = [exponential_delay(1, 30, n, 0.5, random.Random(1)) for n in range(1, 8)]
    b = [exponential_delay(1, 30, n, 0.5, random.Random(1)) for n in range(1, 8)]
    assert a == b


def test_consumer_reconnect_delay_survives_a_long_outage() -> None:
    consumer = Consumer("t", "c", nsqd=["127.0.0.1:4150"], reconnect_delay=1,
                        reconnect_delay_max=60)
    # a node down for days: thousands of failures in a row must not overflow
    assert 30.0 <= consumer._reconnect_delay(5000) <= 60.0


@pytest.mark.parametrize("module",
                         ["consumer", "producer", "discovery/nodes", "discovery/lookupds"])
def test_retry_delays_come_from_the_one_helper(module: str) -> None:
    path = Path(smartnsq.__file__).parent / module  # a package, or a module of that name
    files = sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    source = "".join(f.read_text() for f in files)
    assert "exponential_delay(" in source
    assert not re.search(r"\b2(\.0)? \*\* ", source), "a hand-written doubling"
