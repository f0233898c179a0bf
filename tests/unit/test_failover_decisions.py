"""The pure parts of failover recovery: probe turns of a refused partition, which retries
probe, and held partitions in the routes."""

from __future__ import annotations

import itertools

import pytest

from smartnsq.errors import NoLeader, RefreshLookupError, Timeout
from smartnsq.model.failover import probe_turn
from smartnsq.model.routes import TopicRoutes
from smartnsq.producer.retry import Stage, decide, least_time

A, B = ("127.0.0.1", 4150), ("127.0.0.2", 4150)


def test_turns_are_one_period_apart_from_now_on() -> None:
    turn = probe_turn(0.0, 100.0, 0.05, 1.0)
    assert turn == pytest.approx(100.05)
    second = probe_turn(turn, 100.0, 0.05, 1.0)  # a second waiter at the same moment
    assert second == pytest.approx(100.10)
    # a turn handed out long ago does not make a later caller wait for it
    assert probe_turn(50.0, 100.0, 0.05, 1.0) == pytest.approx(100.05)


def test_no_turn_beyond_the_horizon() -> None:
    nxt = 0.0
    taken = []
    for _ in range(100):
        turn = probe_turn(nxt, 10.0, 0.05, 0.99)
        if turn is None:
            break
        taken.append(turn)
        nxt = turn
    # at most horizon / period waiters get a turn; the rest wait on their back-off
    assert len(taken) == 19
    assert probe_turn(nxt, 10.0, 0.05, 0.99) is None
    assert probe_turn(nxt, 10.0, 0.05, 0.01) is None  # horizon shorter than a period


def _decide(error: BaseException, stage: Stage, pinned: bool):  # type: ignore[no-untyped-def]
    return decide(error, stage, 3, 5.0, pinned=pinned, closing=False, topic="t", timeout=5.0,
                  retry_delay=0.05, retry_delay_max=1.0)


def test_only_a_pinned_refusal_for_not_writable_probes() -> None:
    not_writable = RefreshLookupError("E_FAILED_ON_NOT_WRITABLE", "", "PUB")
    not_leader = RefreshLookupError("E_FAILED_ON_NOT_LEADER", "", "PUB")
    for error, stage, pinned in itertools.product(
            (not_writable, not_leader, NoLeader("x"), Timeout("x")),
            (Stage.ROUTE, Stage.CONNECT, Stage.SEND), (True, False)):
        decision = _decide(error, stage, pinned)
        expected = error is not_writable and stage is Stage.SEND and pinned
        assert decision.probe is expected, (error, stage, pinned)


def test_held_partitions_are_leaders_but_not_round_robin_targets() -> None:
    routes = TopicRoutes("t", partition_num=3, youzan=True, leaders={0: A, 1: B, 2: A},
                         held=frozenset({1}))
    assert routes.leaders[1] == B
    assert [p for p, _ in routes.targets] == [0, 2]
    assert routes.addresses() == {A, B}
    plain = TopicRoutes("t", partition_num=3, youzan=True, leaders={0: A, 1: B, 2: A})
    assert not routes.same_routes(plain), "a hold is a route change (waiters wake on it)"
    assert routes.same_routes(TopicRoutes("t", partition_num=3, youzan=True,
                                          leaders={0: A, 1: B, 2: A}, held=frozenset({1})))


def test_no_retry_with_less_than_least_time_left() -> None:
    assert least_time(10.0) == pytest.approx(0.1)
    assert least_time(0.5) == pytest.approx(0.05)
    assert least_time(0.0) == 0.0
