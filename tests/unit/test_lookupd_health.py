"""Which lookupds a lookup round asks, and in which order (the pure ``model.lookupd_health``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.model.lookupd_health import LookupdHealth, targets

health = st.lists(st.tuples(st.integers(0, 5), st.floats(-10, 10, allow_nan=False),
                            st.integers(0, 3), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(health, st.floats(-5, 5, allow_nan=False))
def test_lookupd_ranking(states: list[tuple[int, float, int, bool]], now: float) -> None:
    lookupds = []
    for i, (failures, retry_at, slow, seed) in enumerate(states):
        lookupd = LookupdHealth(f"127.0.0.1:{4161 + i}", seed)
        lookupd.failures, lookupd.retry_at, lookupd.slow_streak = failures, retry_at, slow
        lookupds.append(lookupd)
    ranked = targets(lookupds, now)
    due = [d for d in lookupds if d.retry_at <= now]
    if due:  # every lookupd due is asked, healthiest (fewest failures, then fastest) first
        assert sorted(map(id, ranked)) == sorted(map(id, due))
        keys = [(d.failures, d.slow_streak, not d.seed) for d in ranked]
        assert keys == sorted(keys)
    else:  # none due: the one due soonest is asked anyway, never none
        assert len(ranked) == 1
        assert ranked[0].retry_at == min(d.retry_at for d in lookupds)
