"""RdyController rules, one at a time (sans-I/O: time is passed in, RDY commands returned)."""

from __future__ import annotations

import random

import pytest

from smartnsq.errors import InvalidArgument
from smartnsq.model.backoff import Backoff, BackoffPolicy
from smartnsq.model.rdy import RdyController

NO_JITTER = BackoffPolicy(jitter=0.0)


def make(mif: int, *conns: str, max_rdy: int = 2500, idle: float = 10.0,
         backoff: BackoffPolicy = NO_JITTER) -> RdyController:
    ctl = RdyController(mif, low_rdy_idle_timeout=idle, rng=random.Random(7), backoff=backoff)
    for c in conns:
        ctl.add(c, max_rdy, 0.0)
    return ctl


def rdys(ctl: RdyController) -> dict[object, int]:
    return {c: ctl.rdy(c) for c in ctl}


def prime(ctl: RdyController, now: float = 1.0) -> None:
    """One message on every connection, finished successfully."""
    for c in list(ctl):
        ctl.on_message(c, now)
        ctl.on_finished(c, now, success=True)


# -- initial RDY and the even share --------------------------------------------------------


def test_new_connection_starts_at_rdy_1_then_gets_its_share() -> None:
    ctl = make(100)
    assert ctl.add("a", 2500, 0.0) == [("a", 1)]
    assert ctl.on_message("a", 1.0) == [("a", 100)]
    assert ctl.in_flight("a") == 1
    assert ctl.on_finished("a", 1.0, success=True) == []
    assert ctl.in_flight("a") == 0


def test_share_spreads_the_remainder() -> None:
    ctl = make(10, "a", "b", "c")
    assert rdys(ctl) == {"a": 1, "b": 1, "c": 1}
    prime(ctl)
    assert sorted(rdys(ctl).values()) == [3, 3, 4]
    assert ctl.total_rdy == 10


def test_remainder_goes_to_delivering_connections() -> None:
    ctl = make(11, "a", "b", "c", "d")
    ctl.on_message("c", 1.0)
    ctl.on_message("d", 2.0)
    ctl.on_message("a", 3.0)
    ctl.remove("b", 4.0)  # rebalance: 11 over 3, the extra 2 to the most recently active
    assert rdys(ctl) == {"a": 4, "c": 3, "d": 4}


def test_unprimed_connections_keep_rdy_1_while_others_get_their_share() -> None:
    ctl = make(9, "a", "b", "c")
    ctl.on_message("a", 1.0)
    assert rdys(ctl) == {"a": 3, "b": 1, "c": 1}


def test_adding_a_connection_shrinks_the_others_first() -> None:
    ctl = make(10, "a")
    prime(ctl)
    assert ctl.rdy("a") == 10
    out = ctl.add("b", 2500, 2.0)
    assert out == [("a", 5), ("b", 1)]  # decrease first, then the new connection
    assert ctl.total_rdy == 6


def test_removing_a_connection_grows_the_others() -> None:
    ctl = make(10, "a", "b")
    prime(ctl)
    assert ctl.remove("b", 2.0) == [("a", 10)]
    assert "b" not in ctl
    assert ctl.rdy("b") == 0
    assert ctl.remove("b", 2.0) == []


def test_max_rdy_count_caps_and_gives_the_rest_away() -> None:
    ctl = make(10)
    ctl.add("ordered", 1, 0.0)
    ctl.add("x", 2500, 0.0)
    ctl.add("y", 3, 0.0)
    prime(ctl)
    assert rdys(ctl) == {"ordered": 1, "x": 6, "y": 3}


def test_never_above_max_rdy_count() -> None:
    ctl = make(5000, "a", max_rdy=2500)
    prime(ctl)
    assert ctl.rdy("a") == 2500


# -- the 25 % rule and committed capacity --------------------------------------------------


def test_busy_connection_keeps_capacity_until_its_messages_finish() -> None:
    ctl = make(10, "a")
    prime(ctl)
    for _ in range(10):
        ctl.on_message("a", 2.0)
    # b joins: a shrinks to 5 but still has 10 in flight; b must wait
    assert ctl.add("b", 2500, 3.0) == [("a", 5)]
    assert ctl.rdy("b") == 0
    out = []
    for _ in range(5):
        out += ctl.on_finished("a", 4.0, success=True)
    assert out == [("b", 1)]  # only once a is back within its share
    assert ctl.total_rdy == 6


def test_raises_wait_for_a_worthwhile_step() -> None:
    ctl = make(40, "a")
    prime(ctl)
    for _ in range(40):
        ctl.on_message("a", 2.0)
    ctl.add("b", 2500, 3.0)  # a: RDY 20 with 40 in flight, b: nothing free yet
    assert ctl.on_finished("a", 3.0, success=True) == [("b", 1)]
    assert ctl.on_message("b", 4.0) == []  # b primed: wants 20, a's surplus still committed
    sent = []
    for _ in range(19):
        sent += [n for c, n in ctl.on_finished("a", 5.0, success=True) if c == "b"]
    # raised in steps of at least a quarter of its share, not one RDY per finished message
    assert sent == [6, 11, 16, 20]
    assert ctl.total_rdy == 40


def test_unprimed_raise_follows_the_window() -> None:
    ctl = make(8, "a")
    assert ctl.rdy("a") == 1
    # the first message leaves 0 of the RDY 1 window: raise to the share at once
    assert ctl.on_message("a", 1.0) == [("a", 8)]
    # windows that are less than 75 % used are not touched
    assert ctl.on_message("a", 1.0) == []


# -- starvation ----------------------------------------------------------------------------


def test_is_starved_at_85_percent() -> None:
    ctl = make(20, "a", "b")
    prime(ctl)
    assert not ctl.is_starved()
    for _ in range(8):
        ctl.on_message("a", 2.0)
    assert not ctl.is_starved()  # 8 < 8.5
    ctl.on_message("a", 2.0)
    assert ctl.is_starved()


def test_is_starved_during_backoff_with_messages_in_flight() -> None:
    ctl = make(20, "a")
    prime(ctl)
    ctl.on_message("a", 2.0)
    ctl.on_message("a", 2.0)
    assert not ctl.is_starved()
    ctl.on_finished("a", 2.0, success=False)
    assert ctl.rdy("a") == 0
    assert ctl.is_starved()  # nothing more will come: process the batch


# -- max_in_flight at run time -------------------------------------------------------------


def test_set_max_in_flight_zero_pauses_and_resumes() -> None:
    ctl = make(10, "a", "b")
    prime(ctl)
    assert sorted(ctl.set_max_in_flight(0, 2.0)) == [("a", 0), ("b", 0)]
    assert ctl.total_rdy == 0
    assert ctl.tick(100.0) == []
    assert sorted(ctl.set_max_in_flight(4, 101.0)) == [("a", 2), ("b", 2)]


def test_lowering_max_in_flight_with_messages_in_flight_clamps_idle_windows() -> None:
    ctl = make(100, "a", "b")
    prime(ctl)
    for _ in range(50):
        ctl.on_message("a", 2.0)
    out = ctl.set_max_in_flight(10, 3.0)
    # a keeps its 50 messages (RDY 5 stops new ones); b's window would let 5 more in
    assert dict(out) == {"a": 5, "b": 0}
    for _ in range(45):
        ctl.on_finished("a", 4.0, success=True)
    assert rdys(ctl) == {"a": 5, "b": 5}


def test_raising_max_in_flight_raises_at_once() -> None:
    ctl = make(2, "a", "b")
    prime(ctl)
    assert sorted(ctl.set_max_in_flight(10, 2.0)) == [("a", 5), ("b", 5)]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_max_in_flight(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        RdyController(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        make(1).set_max_in_flight(bad, 0.0)  # type: ignore[arg-type]


def test_bad_arguments() -> None:
    ctl = make(1, "a")
    with pytest.raises(InvalidArgument):
        ctl.add("a", 2500, 0.0)
    with pytest.raises(InvalidArgument):
        ctl.add("b", 0, 0.0)
    with pytest.raises(InvalidArgument):
        RdyController(1, low_rdy_idle_timeout=0)


def test_unknown_connections_are_ignored() -> None:
    ctl = make(10, "a")
    assert ctl.on_message("zz", 1.0) == []
    assert ctl.on_finished("zz", 1.0, success=True) == []
    assert ctl.in_flight("zz") == 0


# -- fewer max_in_flight than connections --------------------------------------------------


def test_low_rdy_mode_gives_rdy_1_to_a_subset() -> None:
    ctl = make(2, "a", "b", "c")
    assert ctl.low_rdy_mode
    assert sorted(rdys(ctl).values()) == [0, 1, 1]
    assert ctl.total_rdy == 2


def test_low_rdy_mode_rotates_idle_connections() -> None:
    # a turn longer than the idle timeout: idleness alone moves the slot
    ctl = RdyController(1, low_rdy_idle_timeout=10.0, low_rdy_turn=30.0, rng=random.Random(7))
    for c in "abc":
        ctl.add(c, 2500, 0.0)
    holder = next(c for c in ctl if ctl.rdy(c))
    assert ctl.tick(9.0) == []  # not idle long enough
    out = ctl.tick(10.0)
    assert out[0] == (holder, 0)
    assert len(out) == 2 and out[1][1] == 1 and out[1][0] != holder
    assert ctl.total_rdy == 1


def test_low_rdy_mode_reaches_every_connection() -> None:
    ctl = make(2, *"abcdefg", idle=5.0)
    served = {c for c in ctl if ctl.rdy(c)}
    now = 0.0
    for _ in range(10):
        now += 5.0
        ctl.tick(now)
        served |= {c for c in ctl if ctl.rdy(c)}
        assert ctl.total_rdy == 2
    assert served == set("abcdefg")


def test_low_rdy_mode_keeps_a_busy_holder_for_its_turn() -> None:
    ctl = RdyController(1, low_rdy_idle_timeout=5.0, low_rdy_turn=20.0, rng=random.Random(7))
    ctl.add("a", 2500, 0.0)
    ctl.add("b", 2500, 0.0)
    holder = next(c for c in ctl if ctl.rdy(c))
    ctl.on_message(holder, 1.0)
    assert ctl.tick(19.0) == []  # a message in flight: not idle; its turn is not over
    ctl.on_finished(holder, 19.0, success=True)
    # idle counts from the last message or finish: a full window is not idleness
    assert ctl.tick(19.9) == []
    out = ctl.tick(20.0)  # its turn is over: busy or not, it gives way
    assert out[0] == (holder, 0) and out[1][1] == 1


def test_low_rdy_mode_prefers_active_connections_when_entered() -> None:
    ctl = make(3, "a", "b", "c")
    ctl.on_message("c", 1.0)
    ctl.on_finished("c", 1.0, success=True)
    ctl.on_message("b", 2.0)
    ctl.on_finished("b", 2.0, success=True)
    ctl.set_max_in_flight(2, 3.0)
    assert rdys(ctl) == {"a": 0, "b": 1, "c": 1}


def test_leaving_low_rdy_mode() -> None:
    ctl = make(2, "a", "b", "c")
    ctl.remove(next(c for c in ctl if ctl.rdy(c) == 0), 1.0)
    assert not ctl.low_rdy_mode
    assert ctl.total_rdy == 2


def test_removing_a_holder_hands_its_slot_over() -> None:
    ctl = make(1, "a", "b", "c")
    holder = next(c for c in ctl if ctl.rdy(c))
    out = ctl.remove(holder, 1.0)
    assert len(out) == 1 and out[0][1] == 1
    assert ctl.total_rdy == 1


# -- backoff -------------------------------------------------------------------------------


def test_failure_backs_off_everywhere() -> None:
    ctl = make(10, "a", "b")
    prime(ctl)
    ctl.on_message("a", 2.0)
    out = ctl.on_finished("a", 2.0, success=False)
    assert sorted(out) == [("a", 0), ("b", 0)]
    assert ctl.backoff.state == "backing_off"
    assert ctl.next_deadline() == 3.0


def test_probe_then_recover() -> None:
    ctl = make(10, "a", "b")
    prime(ctl)
    ctl.on_message("a", 2.0)
    ctl.on_finished("a", 2.0, success=False)
    assert ctl.tick(2.5) == []
    out = ctl.tick(3.0)
    assert len(out) == 1 and out[0][1] == 1  # RDY 1 to one connection
    probe = out[0][0]
    assert ctl.backoff.state == "probing"
    assert ctl.next_deadline() is None
    ctl.on_message(probe, 3.5)
    assert sorted(ctl.on_finished(probe, 3.6, success=True)) == [("a", 5), ("b", 5)]
    assert ctl.stats()["backoff"] == "normal"


def test_failed_probe_backs_off_longer() -> None:
    ctl = make(10, "a")
    prime(ctl)
    ctl.on_message("a", 2.0)
    ctl.on_finished("a", 2.0, success=False)
    assert ctl.tick(3.0) == [("a", 1)]
    ctl.on_message("a", 3.0)
    assert ctl.on_finished("a", 3.0, success=False) == [("a", 0)]
    assert (ctl.backoff.level, ctl.next_deadline()) == (2, 5.0)


def test_results_during_the_window_are_ignored() -> None:
    ctl = make(10, "a")
    prime(ctl)
    for _ in range(5):
        ctl.on_message("a", 2.0)
    ctl.on_finished("a", 2.0, success=False)
    for _ in range(4):
        assert ctl.on_finished("a", 2.5, success=False) == []
    assert ctl.backoff.level == 1


def test_success_streak_from_deep_backoff() -> None:
    ctl = make(6, "a", "b", "c")
    prime(ctl)
    now = 2.0
    ctl.on_message("a", now)
    ctl.on_finished("a", now, success=False)
    for _ in range(3):  # three failed probes: level 4
        now = ctl.backoff.until
        (probe, _n), = ctl.tick(now)
        ctl.on_message(probe, now)
        ctl.on_finished(probe, now, success=False)
    assert ctl.backoff.level == 4
    while ctl.backoff.state != "normal":
        now = ctl.backoff.until
        (probe, _n), = ctl.tick(now)
        assert ctl.total_rdy == 1
        ctl.on_message(probe, now)
        ctl.on_finished(probe, now, success=True)
    assert rdys(ctl) == {"a": 2, "b": 2, "c": 2}


def test_requeue_without_backoff_does_not_slow_down() -> None:
    ctl = make(10, "a")
    prime(ctl)
    ctl.on_message("a", 2.0)
    assert ctl.on_finished("a", 2.0, success=False, backoff=False) == []
    assert ctl.backoff.state == "normal"


def test_backoff_disabled() -> None:
    ctl = make(10, "a", backoff=BackoffPolicy(enabled=False))
    prime(ctl)
    ctl.on_message("a", 2.0)
    assert ctl.on_finished("a", 2.0, success=False) == []
    assert ctl.rdy("a") == 10


def test_probe_moves_when_its_connection_goes() -> None:
    ctl = make(10, "a", "b")
    prime(ctl)
    ctl.on_message("a", 2.0)
    ctl.on_finished("a", 2.0, success=False)
    (probe, _n), = ctl.tick(3.0)
    other = "b" if probe == "a" else "a"
    assert ctl.remove(probe, 3.1) == [(other, 1)]


def test_no_probe_while_paused() -> None:
    ctl = make(10, "a")
    prime(ctl)
    ctl.on_message("a", 2.0)
    ctl.on_finished("a", 2.0, success=False)
    ctl.set_max_in_flight(0, 2.1)
    assert ctl.tick(5.0) == []
    assert ctl.set_max_in_flight(3, 6.0) == [("a", 1)]  # resumes with the probe


def test_shared_backoff_object() -> None:
    backoff = Backoff(NO_JITTER)
    ctl = RdyController(4, backoff=backoff)
    assert ctl.backoff is backoff


def test_stats_snapshot() -> None:
    ctl = make(4, "a")
    s = ctl.stats()
    assert s["total_rdy"] == 1 and s["backoff"] == "normal"
    assert "a" in s["connections"]  # type: ignore[operator]


def test_probe_on_an_idle_connection_moves_on() -> None:
    ctl = make(10, "a", "b", "c", idle=5.0)
    prime(ctl)
    ctl.on_message("a", 2.0)
    ctl.on_finished("a", 2.0, success=False)
    (probe, _n), = ctl.tick(3.0)
    assert ctl.tick(7.9) == []  # not idle for 5 s yet
    out = ctl.tick(8.0)
    assert out[0] == (probe, 0) and out[1][1] == 1 and out[1][0] != probe
    assert ctl.total_rdy == 1
    assert ctl.backoff.state == "probing"
