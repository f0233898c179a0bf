"""Cases the stateful fuzz found that its state machine meets only by chance, pinned as tests."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

import smartnsq.sync
from smartnsq import Producer
from smartnsq.errors import LookupFailed, Timeout
from smartnsq.testing.hostile import SilentNsqd


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


async def test_a_connection_attempt_outliving_its_call_leaves_no_unread_error() -> None:
    """Found by the stateful fuzz: a publish whose deadline ends while the pool is still
    dialling leaves the dial running for the next caller; when that dial then fails, its
    error was never read ("Task exception was never retrieved", once per such call)."""
    loop = asyncio.get_running_loop()
    reports: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context["message"]))
    try:
        async with SilentNsqd() as silent:
            producer = Producer(nsqd=[silent.address], connect_timeout=0.3)
            with pytest.raises(Timeout):
                await producer.publish("orders", b"x", timeout=0.05)
            dials = [t for t in asyncio.all_tasks()
                     if getattr(t.get_coro(), "__qualname__", "") == "NodePool._open"]
            assert dials  # still dialling after the call ended
            await asyncio.wait(dials)
            del dials
            await producer.close(timeout=1.0)
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert [r for r in reports if "never retrieved" in r] == []


async def test_a_dial_whose_deadline_has_passed_says_so_without_a_negative_time() -> None:
    """A caller whose deadline passed while it was on its way gives the pool a negative time
    left; a fuzz run once saw "connecting to … took longer than -0.0002s"."""
    from smartnsq.discovery.nodes import NodePool
    from smartnsq.model.routes import StaticRouteSource

    async with SilentNsqd() as silent:
        host, port = silent.address.rsplit(":", 1)
        pool = NodePool(StaticRouteSource([silent.address]), idle_timeout=None)
        try:
            with pytest.raises(Timeout) as caught:
                await pool.acquire((host, int(port)), timeout=-0.0002)
            assert "-0" not in str(caught.value) and "deadline" in str(caught.value), \
                caught.value
        finally:
            await pool.close()
