"""The cases issue 21 named that the state machine meets only by chance, pinned as tests."""

from __future__ import annotations

import asyncio
import time

import pytest

import smartnsq.sync
from smartnsq import Producer
from smartnsq.errors import LookupFailed


async def _dead_addresses(n: int) -> list[str]:
    """Loopback ports that refuse: bound, then closed."""
    out = []
    for _ in range(n):
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        out.append(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        server.close()
        await server.wait_closed()
    return out


async def test_routes_against_only_dead_lookupds_fails_at_once() -> None:
    """A refused connection is not worth the whole deadline: ``LookupFailed`` naming a
    lookupd, well before the 10 s ``timeout``; the sync facade the same."""
    dead = await _dead_addresses(2)
    async with Producer(lookupd=dead) as producer:
        started = time.monotonic()
        with pytest.raises(LookupFailed, match=r"127\.0\.0\.1:"):
            await producer.routes("orders", timeout=10)
        assert time.monotonic() - started < 2.0

    def sync_routes() -> float:
        with smartnsq.sync.Producer(lookupd=dead) as producer:
            began = time.monotonic()
            with pytest.raises(LookupFailed, match=r"127\.0\.0\.1:"):
                producer.routes("orders", timeout=10)
            return time.monotonic() - began

    assert await asyncio.to_thread(sync_routes) < 2.0
