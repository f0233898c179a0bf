"""RdyController with ordered partitions (own back-off, requeue holds) and where the back-off
probe goes (issue 12, item 4): the pure model's side of the ordered-consumption fixes."""

from __future__ import annotations

import random

from smartnsq.backoff import BackoffPolicy
from smartnsq.rdy import MIN_HOLD, RdyController

POLICY = BackoffPolicy(initial=10.0, max=40.0, jitter=0.0)


def ordered(*conns: str, policy: BackoffPolicy = POLICY) -> RdyController:
    ctl = RdyController(100, rng=random.Random(3), backoff=policy)
    for c in conns:
        ctl.add(c, 1, 0.0, own_backoff=True)
        ctl.on_message(c, 0.5)
        ctl.on_finished(c, 0.5, success=True)
    return ctl


def test_a_failure_pauses_only_its_own_partition() -> None:
    ctl = ordered("p0", "p1", "p2")
    assert {c: ctl.rdy(c) for c in ctl} == {"p0": 1, "p1": 1, "p2": 1}
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, hold=0.0) == [("p0", 0)]
    assert ctl.backoff.state == "normal"  # the consumer-wide back-off did not count it
    ctl.on_message("p1", 2.0)
    assert ctl.on_finished("p1", 2.0, success=True) == []
    assert ctl.rdy("p1") == 1 and ctl.rdy("p2") == 1
    assert ctl.next_deadline() == 11.0  # p0's own window
    assert ctl.tick(11.0) == [("p0", 1)]  # its probe
    ctl.on_message("p0", 11.5)
    ctl.on_finished("p0", 11.5, success=True)
    assert ctl.rdy("p0") == 1 and ctl.stats()["connections"]["p0"]["backoff"] == "normal"


def test_a_requeue_holds_the_partition_for_its_delay_even_without_back_off() -> None:
    ctl = ordered("p0", policy=BackoffPolicy(enabled=False))
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, hold=2.5) == [("p0", 0)]
    assert ctl.next_deadline() == 3.5
    assert ctl.tick(3.0) == []
    assert ctl.tick(3.5) == [("p0", 1)]


def test_a_zero_delay_requeue_still_holds_for_the_floor() -> None:
    ctl = ordered("p0", policy=BackoffPolicy(enabled=False))
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, backoff=False, hold=0.0) == [("p0", 0)]
    assert ctl.next_deadline() == 1.0 + MIN_HOLD
    assert ctl.tick(1.0 + MIN_HOLD) == [("p0", 1)]


def test_the_probe_goes_to_the_connection_whose_failure_started_the_back_off() -> None:
    for seed in range(20):
        ctl = RdyController(100, rng=random.Random(seed),
                            backoff=BackoffPolicy(initial=1.0, jitter=0.0))
        for c in ("a", "b", "c", "d"):
            ctl.add(c, 2500, 0.0)
        ctl.on_message("c", 0.5)
        ctl.on_finished("c", 0.5, success=False)
        assert all(ctl.rdy(c) == 0 for c in ctl)
        assert ctl.tick(1.5) == [("c", 1)], seed


def test_a_gone_failed_connection_leaves_the_probe_to_another() -> None:
    ctl = RdyController(100, rng=random.Random(1), backoff=BackoffPolicy(initial=1.0,
                                                                          jitter=0.0))
    for c in ("a", "b"):
        ctl.add(c, 2500, 0.0)
    ctl.on_message("a", 0.5)
    ctl.on_finished("a", 0.5, success=False)
    ctl.remove("a", 0.6)
    assert ctl.tick(1.5) == [("b", 1)]
