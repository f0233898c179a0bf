"""The expansion hold (smartnsq.model.expansion): an ordered consumer holds the partitions a
topic grew by until the old ones are consumed to the expansion point, or until the bound.
Examples, then generated schedules: a release by consumption never comes before every old
partition reached its point, nothing is held past its bound, and a held partition is always
one the topic grew by."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import InvalidArgument
from smartnsq.model.expansion import (
    BY_BOUND,
    BY_CONSUMED,
    EXPANSION_HOLD_MAX,
    ExpansionHold,
)


def test_the_first_view_and_a_shrink_hold_nothing() -> None:
    hold = ExpansionHold()
    assert hold.grow(0, 4, 0.0) == frozenset()  # the first view: no expansion point
    assert hold.grow(4, 4, 1.0) == frozenset()
    assert hold.grow(4, 2, 2.0) == frozenset()
    assert not hold.active and not hold.held(3) and not hold.held(None)
    assert hold.decide(100.0) == []


def test_new_partitions_wait_for_every_old_one_to_reach_its_end() -> None:
    hold = ExpansionHold()
    assert hold.grow(2, 4, 10.0) == {2, 3}
    assert hold.held(2) and hold.held(3) and not hold.held(0) and not hold.held(1)
    assert hold.unwritten() == {2, 3} and hold.wanted_ends() == frozenset()
    hold.end(0, 1, 10.05)  # before any write to a new partition: no point yet
    hold.written(3, 10.1)
    assert hold.unwritten() == frozenset() and hold.wanted_ends() == {0, 1}
    hold.end(0, 1000, 10.1)
    hold.end(1, 500, 10.1)
    assert hold.wanted_ends() == frozenset()
    hold.progress(0, 1000)  # partition 0 is at its end
    hold.progress(1, 400)  # ... 1 is not
    assert hold.decide(11.0) == [] and hold.held(2)
    assert hold.open_partitions() == {1}
    hold.progress(1, 500)
    (release,) = hold.decide(11.5)
    assert release.new == {2, 3} and release.why == BY_CONSUMED
    assert release.waited == pytest.approx(1.5)
    assert not hold.active and not hold.held(2)


def test_progress_before_the_end_is_read_counts() -> None:
    hold = ExpansionHold()
    hold.grow(1, 2, 0.0)
    hold.written(1, 0.1)
    hold.progress(0, 700)
    hold.end(0, 700, 0.2)  # already there when its end arrives
    assert [r.why for r in hold.decide(0.3)] == [BY_CONSUMED]


def test_an_empty_old_partition_has_nothing_to_wait_for() -> None:
    hold = ExpansionHold()
    hold.grow(2, 3, 0.0)
    hold.written(2, 0.1)
    hold.end(0, 0, 0.1)
    hold.end(1, 0, 0.1)
    assert [r.why for r in hold.decide(0.1)] == [BY_CONSUMED]


def test_a_drained_channel_counts_only_when_asked_after_the_end_was_read() -> None:
    hold = ExpansionHold()
    hold.grow(1, 2, 0.0)
    hold.written(1, 0.0)
    hold.drained(0, 0.05)  # before any end: tells nothing
    hold.end(0, 300, 0.1)
    hold.drained(0, 0.09)  # asked before the end was read
    assert hold.decide(1.0) == []
    hold.drained(0, 0.1)  # the same answer as the end's
    assert [r.why for r in hold.decide(1.0)] == [BY_CONSUMED]


def test_the_bound_releases_a_dead_old_partition_and_names_it() -> None:
    hold = ExpansionHold(bound=5.0)
    hold.grow(2, 4, 90.0)
    hold.written(2, 100.0)  # the bound runs from the first write to a new partition
    hold.end(0, 10, 100.1)
    hold.progress(0, 10)  # partition 1 has no leader: its end is never read
    assert hold.decide(104.9) == []
    assert hold.next_deadline() == pytest.approx(105.0)
    (release,) = hold.decide(105.0)
    assert release.why == BY_BOUND and release.late == {1} and release.new == {2, 3}
    assert release.waited == pytest.approx(15.0)
    assert hold.next_deadline() is None


def test_a_growth_during_a_hold_waits_for_the_held_partitions_too() -> None:
    hold = ExpansionHold(bound=60.0)
    hold.grow(2, 4, 0.0)
    assert hold.grow(4, 8, 1.0) == {4, 5, 6, 7}
    hold.written(2, 1.05)
    hold.written(7, 1.05)
    assert hold.wanted_ends() == {0, 1, 2, 3}
    for p, end in enumerate((10, 20, 30, 40)):
        hold.end(p, end, 1.1)
    hold.progress(0, 10)
    hold.progress(1, 20)
    (first,) = hold.decide(2.0)  # 0 and 1 are done: 2 and 3 go
    assert first.new == {2, 3} and hold.held(4) and not hold.held(2)
    hold.progress(2, 30)
    hold.progress(3, 40)
    (second,) = hold.decide(3.0)
    assert second.new == {4, 5, 6, 7} and second.why == BY_CONSUMED
    assert second.waited == pytest.approx(2.0)


def test_each_stage_has_its_own_bound() -> None:
    hold = ExpansionHold(bound=10.0)
    hold.grow(1, 2, 0.0)
    hold.grow(2, 3, 5.0)  # partition 0 is never consumed (a poison message)
    hold.written(1, 0.0)
    hold.written(2, 5.0)
    hold.end(0, 5, 5.1)
    hold.end(1, 0, 5.1)
    assert hold.decide(9.9) == []
    (first,) = hold.decide(10.0)
    assert first.new == {1} and first.why == BY_BOUND and first.late == {0}
    assert hold.held(2) and not hold.held(1)
    (second,) = hold.decide(15.0)
    assert second.new == {2} and second.why == BY_BOUND and second.late == {0}


def test_new_partitions_never_written_to_stay_held_without_a_bound() -> None:
    hold = ExpansionHold(bound=1.0)
    hold.grow(2, 4, 0.0)
    hold.progress(0, 10)
    assert hold.decide(1e6) == [] and hold.held(2)  # empty: holding them costs nothing
    assert hold.next_deadline() is None and hold.open_partitions() == frozenset()
    hold.written(2, 1e6)
    assert hold.next_deadline() == pytest.approx(1e6 + 1.0)
    hold.end(0, 10, 1e6)
    hold.end(1, 0, 1e6)
    assert [r.why for r in hold.decide(1e6)] == [BY_CONSUMED]


def test_the_bound_is_checked() -> None:
    assert EXPANSION_HOLD_MAX == 60.0
    with pytest.raises(InvalidArgument):
        ExpansionHold(bound=0)


steps = st.lists(st.tuples(st.sampled_from(["written", "end", "progress", "drained", "tick"]),
                           st.integers(0, 3), st.integers(0, 2000),
                           st.floats(0, 5, allow_nan=False)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), steps, st.floats(1, 30, allow_nan=False))
def test_no_release_before_the_point_nor_a_hold_past_the_bound(
        before: int, grown: int, schedule: list[tuple[str, int, int, float]],
        bound: float) -> None:
    after = before + grown
    hold = ExpansionHold(bound=bound)
    now = 0.0
    assert hold.grow(before, after, now) == frozenset(range(before, after))
    ends: dict[int, tuple[int, float]] = {}
    furthest: dict[int, int] = {}
    drained_at: dict[int, float] = {}
    written: float | None = None
    for what, partition, position, gap in schedule:
        now += gap
        p = partition % before
        if what == "written":
            written = now if written is None else written
            hold.written(before + partition % grown, now)
        elif what == "end":
            if p not in ends and written is not None:
                ends[p] = (position, now)  # only ends read after a write count
            hold.end(p, position, now)
        elif what == "progress":
            furthest[p] = max(furthest.get(p, -1), position)
            hold.progress(p, position)
        elif what == "drained":
            drained_at[p] = max(drained_at.get(p, -1.0), now)
            hold.drained(p, now)
        for release in hold.decide(now):
            assert release.new == frozenset(range(before, after))
            assert written is not None and release.waited <= now
            if release.why == BY_CONSUMED:
                for q in range(before):  # every old partition reached its point
                    end, at = ends[q]
                    assert end <= 0 or furthest.get(q, -1) >= end \
                        or drained_at.get(q, -1.0) >= at
            else:
                assert now - written >= bound and release.late
        for q in range(after):
            assert hold.held(q) == (q >= before and hold.active)
        if hold.active and written is not None:
            assert now - written < bound
    if written is not None and now - written >= bound:
        hold.decide(now)
        assert not hold.active
