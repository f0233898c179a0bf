"""While a publish waits on a topic, the pool polls its routes: at first rounds of their own,
twice as often (a graceful handoff ends 0.07-4.1 s after a leave), then spaced by lookup."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

from smartnsq import pool as pool_module
from smartnsq.pool import PartitionPool, RoutesCallback, TopicRoutes


class RecordingSource:
    """A route source that records each refresh and whether it asked for a round at once."""

    def __init__(self, wanted: int) -> None:
        self.calls: list[bool] = []
        self.enough = asyncio.Event()
        self._wanted = wanted

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def routes(self, topic: str) -> TopicRoutes:
        return TopicRoutes(topic)

    def refresh(self, topic: str, *, now: bool = False) -> None:
        self.calls.append(now)
        if len(self.calls) >= self._wanted:
            self.enough.set()

    def subscribe(self, callback: RoutesCallback) -> None:
        return None


async def test_a_wait_polls_at_once_first_then_as_lookup_spaces_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "FAST_POLL_FOR", 0.2)
    source = RecordingSource(wanted=12)
    pool = PartitionPool(source, idle_timeout=None, wait_refresh=0.04)
    waiter = pool.changed("t", timeout=30.0)
    await asyncio.wait_for(source.enough.wait(), 10)
    assert source.calls[0] is True  # the first poll is a round of its own
    assert source.calls[-1] is False  # past FAST_POLL_FOR, lookup's spacing applies
    flips = [a for a, b in zip(source.calls, source.calls[1:], strict=False) if a != b]
    assert flips == [True]  # fast first, slow after, never back
    waiter.cancel()
    await pool.close()



class OldSource(RecordingSource):
    """A user's source written before ``refresh(now=)`` existed."""

    def refresh(self, topic: str) -> None:  # type: ignore[override]
        super().refresh(topic)


async def test_a_source_without_now_gets_spaced_refreshes() -> None:
    source = OldSource(wanted=3)
    pool = PartitionPool(source, idle_timeout=None, wait_refresh=0.02)
    waiter = pool.changed("t", timeout=30.0)
    await asyncio.wait_for(source.enough.wait(), 10)  # (before: TypeError in the timer)
    assert source.calls[:3] == [False, False, False]
    waiter.cancel()
    await pool.close()


async def test_a_wait_soon_after_another_gets_no_second_fast_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "FAST_POLL_FOR", 0.1)
    source = RecordingSource(wanted=6)
    pool = PartitionPool(source, idle_timeout=None, wait_refresh=0.04)
    first = pool.changed("t", timeout=30.0)
    await asyncio.wait_for(source.enough.wait(), 10)
    assert source.calls[0] is True and source.calls[-1] is False
    first.cancel()
    await wait_until(lambda: not pool._polling)  # nobody waits any more: the polling ended
    source.calls.clear()
    source.enough.clear()
    source._wanted = 2
    second = pool.changed("t", timeout=30.0)
    await asyncio.wait_for(source.enough.wait(), 10)
    assert source.calls[:2] == [False, False]  # within FAST_POLL_REARM of the first start
    second.cancel()
    await pool.close()
