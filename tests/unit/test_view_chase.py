"""The consumers' chase (smartnsq.discovery.chase.ViewChase) against a recording lookup: after a
loss, rounds of their own first, then refreshes the lookup manager spaces (news ending a chase is
test_failover_model's);
a leaderless view is looked at again on the consumer's doubling delay."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smartnsq.discovery.chase import ViewChase
from smartnsq.model import failover as policy


class RecordingLookup:
    """Records each ask: "round" (a round of its own) or "refresh" (a spaced one)."""

    def __init__(self) -> None:
        self.asks: list[str] = []
        self.changed = asyncio.Event()
        self.wanted = 0

    def _note(self, what: str) -> None:
        self.asks.append(what)
        if len(self.asks) >= self.wanted:
            self.changed.set()

    def refresh(self, topic: str, access: str) -> asyncio.Future[None]:
        self._note("refresh")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def view(self, topic: str, access: str, *, refresh: bool, timeout: float) -> Any:
        assert refresh and timeout == policy.ROUND_TIMEOUT
        self._note("round")

    async def until(self, count: int) -> list[str]:
        self.wanted = count
        if len(self.asks) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)
        return self.asks[:count]


async def test_a_loss_is_chased_fast_first_then_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "CHASE_FAST", 0.2)
    monkeypatch.setattr(policy, "CHASE_FOR", 0.6)
    lookup = RecordingLookup()
    chase = ViewChase("t", "r", lookup, lambda n: 0.05)
    chase.lost()
    asks = await lookup.until(6)
    assert asks[0] == "round" and asks[-1] == "refresh"
    assert asks == sorted(asks, key=lambda a: a != "round")  # rounds first, never back
    chase.stop()


async def test_a_leaderless_view_is_looked_at_again_on_a_doubling_delay() -> None:
    lookup = RecordingLookup()
    delays: list[int] = []

    def delay(n: int) -> float:
        delays.append(n)
        return 0.01

    chase = ViewChase("t", "r", lookup, delay)
    rechecked = asyncio.Event()

    def again() -> None:
        if len(delays) < 3:
            chase.leaderless([0], again)
        else:
            rechecked.set()

    chase.leaderless([0], again)
    await asyncio.wait_for(rechecked.wait(), 10)
    assert delays == [1, 2, 3]  # the n-th look waits delay(n)
    assert lookup.asks == ["refresh"] * 3
    chase.leaderless([], again)  # a leader for every partition: the count starts over
    chase.leaderless([0], again)
    assert delays[-1] == 1
    chase.stop()
