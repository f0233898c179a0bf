"""While a publish waits on a topic, the pool polls its routes: at first rounds of their own,
twice as often (a graceful handoff ends 0.07-4.1 s after a leave), then spaced by lookup."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from support import wait_until

from smartnsq.discovery.nodes import NodePool
from smartnsq.model import failover  # the polling's timing rule
from smartnsq.model.routes import RoutesCallback, TopicRoutes


class RecordingSource:
    """A route source that records each refresh and whether it asked for a round at once."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self._enough = asyncio.Event()
        self._wanted = 0

    async def polls(self, pool: NodePool, count: int) -> list[bool]:
        """Wait on a route change of "t" until ``count`` more refreshes came; what they asked."""
        self.calls.clear()
        self._enough.clear()
        self._wanted = count
        waiter = pool.changed("t", timeout=30.0)
        await asyncio.wait_for(self._enough.wait(), 10)
        waiter.cancel()
        return list(self.calls)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def routes(self, topic: str) -> TopicRoutes:
        return TopicRoutes(topic)

    def refresh(self, topic: str, *, now: bool = False) -> None:
        self.calls.append(now)
        if len(self.calls) >= self._wanted:
            self._enough.set()

    def subscribe(self, callback: RoutesCallback) -> None:
        return None


async def test_a_wait_polls_at_once_first_then_as_lookup_spaces_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failover, "FAST_POLL_FOR", 0.2)
    source = RecordingSource()
    pool = NodePool(source, idle_timeout=None, wait_refresh=0.04)
    calls = await source.polls(pool, 12)
    assert calls[0] is True  # the first poll is a round of its own
    assert calls[-1] is False  # past FAST_POLL_FOR, lookup's spacing applies
    flips = [a for a, b in itertools.pairwise(calls) if a != b]
    assert flips == [True]  # fast first, slow after, never back
    await pool.close()


class OldSource(RecordingSource):
    """A user's source written before ``refresh(now=)`` existed."""

    def refresh(self, topic: str) -> None:  # type: ignore[override]
        super().refresh(topic)


async def test_a_source_without_now_gets_spaced_refreshes() -> None:
    source = OldSource()
    pool = NodePool(source, idle_timeout=None, wait_refresh=0.02)
    # (before: a TypeError in the poll's timer, and no refresh at all)
    assert (await source.polls(pool, 3))[:3] == [False, False, False]
    await pool.close()


async def test_a_wait_soon_after_another_gets_no_second_fast_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failover, "FAST_POLL_FOR", 0.1)
    source = RecordingSource()
    pool = NodePool(source, idle_timeout=None, wait_refresh=0.04)
    first = await source.polls(pool, 6)
    assert first[0] is True and first[-1] is False
    await wait_until(lambda: not pool.book.polling)  # nobody waits any more: the polling ended
    # within FAST_POLL_REARM of the first start
    assert (await source.polls(pool, 2))[:2] == [False, False]
    await pool.close()


async def test_a_socket_node_backing_off_is_named_as_the_user_wrote_it(tmp_path: object) -> None:
    """``unix:PATH``, as in every other message naming a node, not ``PATH:0``."""
    from smartnsq.errors import ConnectionFailed, NodeBackoff
    from smartnsq.model.routes import parse_address

    path = f"{tmp_path}/nsqd.sock"  # no socket there: the connect fails at once
    address = parse_address(f"unix:{path}")
    pool = NodePool(RecordingSource(), idle_timeout=None, reconnect_delay=60.0,
                    reconnect_delay_max=60.0)  # the second call comes within the back-off
    try:
        with pytest.raises(ConnectionFailed):
            await pool.acquire(address, timeout=5)
        with pytest.raises(NodeBackoff) as info:
            await pool.acquire(address, timeout=5)
    finally:
        await pool.close()
    assert str(info.value).startswith(f"unix:{path} is backing off"), str(info.value)
