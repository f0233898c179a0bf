"""The short total-queue check (smartnsq.devcluster.chaos) as a CI test.

A seeded schedule of node kills, graceful leaves and leader moves on the realistic profile
scaled down, with a smartnsq Producer and Consumer on an unordered and an ordered topic:
nothing acknowledged may be lost, nothing phantom delivered, no key's order broken.
"""

from __future__ import annotations

import itertools

import pytest

from smartnsq.devcluster.chaos import ChaosConfig, make_schedule, run_chaos
from smartnsq.devcluster.profile import profile_named

SHORT = ChaosConfig(seed=7, seconds=8.0, profile=profile_named("realistic", 0.03, seed=7),
                    rate=80.0, drain_seconds=20.0)


def test_schedule_is_seeded_and_one_fault_at_a_time() -> None:
    assert make_schedule(SHORT) == make_schedule(SHORT)
    other = make_schedule(ChaosConfig(seed=8, seconds=8.0))
    assert make_schedule(SHORT) != other
    steps = make_schedule(ChaosConfig(seed=3, seconds=120.0))
    assert {s.fault for s in steps} == {"kill", "leave", "move_leader"}
    for a, b in itertools.pairwise(steps):
        assert b.at >= a.at + a.down_for  # a node is back before the next fault
    with pytest.raises(ValueError, match="faults"):
        ChaosConfig(faults=("flood",))


async def test_short_chaos_run_loses_nothing_acknowledged() -> None:
    report = await run_chaos(SHORT)
    print(report.format())
    assert report.schedule
    for topic in report.topics:
        assert topic.acknowledged > 0
        assert topic.lost == 0, topic.lost_examples
        assert topic.phantom == 0
        assert topic.order_violations == 0
    assert report.drained
    assert report.ok
