"""RdyController's per-message fast paths: an answered message in steady
flow returns the shared ``NOTHING`` (no RDY, no deadline moved, so the asyncio shell skips
``next_deadline()``), and the fast path decides exactly what the full path would."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.model.backoff import BackoffPolicy
from smartnsq.model.rdy import NOTHING, RdyController

POLICY = BackoffPolicy(initial=1.0, max=8.0, jitter=0.0)


def ordered(*conns: str, policy: BackoffPolicy = POLICY) -> RdyController:
    ctl = RdyController(100, rng=random.Random(3), backoff=policy)
    for c in conns:
        ctl.add(c, 1, 0.0, own_backoff=True)
        ctl.on_message(c, 0.5)
        ctl.on_finished(c, 0.5, success=True)
    return ctl


def test_an_ordered_success_in_steady_flow_returns_nothing() -> None:
    ctl = ordered("p0", "p1")
    assert ctl.on_message("p0", 1.0) is NOTHING
    assert ctl.in_flight("p0") == 1
    assert ctl.on_finished("p0", 1.0, success=True) is NOTHING
    assert ctl.in_flight("p0") == 0 and ctl.rdy("p0") == 1
    assert ctl.next_deadline() is None
    assert NOTHING == []  # nobody appended to the shared list


def test_an_ordered_success_while_backing_off_or_held_takes_the_full_path() -> None:
    ctl = ordered("p0", "p1")
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, hold=0.5) == [("p0", 0)]
    assert ctl.next_deadline() == 1.5  # the hold, before the 1 s window ends
    assert ctl.tick(2.0) == [("p0", 1)]  # the window is over: its probe
    ctl.on_message("p0", 2.1)
    result = ctl.on_finished("p0", 2.1, success=True)
    assert result is not NOTHING  # the probe's success ends the back-off: not the fast path
    assert ctl.stats()["connections"]["p0"]["backoff"] == "normal" and ctl.rdy("p0") == 1


def test_a_plain_success_in_steady_flow_returns_nothing() -> None:
    ctl = RdyController(10, rng=random.Random(1), backoff=POLICY)
    ctl.add("n0", 2500, 0.0)
    ctl.on_message("n0", 0.1)
    ctl.on_finished("n0", 0.1, success=True)
    assert ctl.on_message("n0", 0.2) is NOTHING
    assert ctl.on_finished("n0", 0.2, success=True) is NOTHING


EVENTS = st.lists(st.tuples(st.sampled_from(["msg", "fin", "req", "tick"]),
                            st.integers(0, 2), st.floats(0.0, 3.0)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(EVENTS)
def test_the_ordered_fast_path_decides_what_the_full_path_decides(events: list[
        tuple[str, int, float]]) -> None:
    """Two controllers, one answering through ``on_finished`` (fast path allowed), one
    through the full own-backoff path: the same commands and state after every event."""
    fast = ordered("p0", "p1", "p2")
    full = ordered("p0", "p1", "p2")
    now = 1.0
    for kind, index, step in events:
        now += step
        conn = f"p{index}"
        if kind == "msg":
            if fast.rdy(conn) > fast.in_flight(conn):
                assert fast.on_message(conn, now) == full.on_message(conn, now)
        elif kind in ("fin", "req"):
            if fast.in_flight(conn):
                success = kind == "fin"
                got = fast.on_finished(conn, now, success=success, hold=0.2)
                full._now = now
                want = full._finished_own(full._conns[conn], now, success, True, 0.2)
                assert got == want
        else:
            assert fast.tick(now) == full.tick(now)
        assert fast.stats() == full.stats()
        assert fast.next_deadline() == full.next_deadline()
