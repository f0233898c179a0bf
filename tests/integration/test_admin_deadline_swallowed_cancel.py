"""A creation or expansion that waits ends at its own deadline, even when the cancellation
that ``asyncio.wait_for`` sends at that deadline is lost.

On Python 3.10 and 3.11 a ``wait_for`` whose inner future completes in the same instant as
it is cancelled returns that result and drops the cancellation (CPython bpo-42130). The admin
calls nest one: each HTTP request has its own ``wait_for``, with the call's remaining time
as its timeout, so under load the two deadlines meet and the outer cancellation is gone. The
outer ``wait_for`` then waits for a loop that nothing stops: CI caught ``create_topic(...,
timeout=1.0)`` still polling 20 minutes later. Here the waiting step swallows the first
cancellation on purpose, as the race does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from smartnsq.admin import AsyncAdmin
from smartnsq.errors import Timeout

BOUND = 10.0  # the test's own bound: far past the calls' 0.5 s deadline


def _swallow_one_cancel(admin: AsyncAdmin, name: str) -> None:
    """``admin.<name>`` (a lookup while waiting) shows nothing yet: the first call holds
    until it is cancelled and swallows that cancellation, later ones answer at once."""
    swallowed = []

    async def view(*args: Any, **kwargs: Any) -> None:
        if swallowed:
            await asyncio.sleep(0)
            return None
        try:
            await asyncio.sleep(BOUND)
        except asyncio.CancelledError:
            swallowed.append(True)
        return None

    setattr(admin, name, view)


async def _bounded(call: Any) -> float:
    """How long ``call`` took to raise its own ``Timeout`` (the test's bound is the bug)."""
    started = time.monotonic()
    try:
        await asyncio.wait_for(call, BOUND)
    except Timeout:
        return time.monotonic() - started
    except asyncio.TimeoutError:
        pytest.fail(f"the call did not end at its deadline: the test's {BOUND:g}s bound did")
    pytest.fail("the call returned, but nothing it waited for could complete")


@pytest.mark.nsq_cluster(nodes=3)
async def test_create_ends_at_its_deadline(nsq_cluster: Any) -> None:
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses, timeout=5.0) as admin:
        _swallow_one_cancel(admin, "_view")
        took = await _bounded(admin.create_topic("lost", partitions=2, replicas=1,
                                                 channels=["c"], timeout=0.5,
                                                 poll_interval=0.05))
    assert took < 3.0


@pytest.mark.nsq_cluster(nodes=3)
async def test_expand_ends_at_its_deadline(nsq_cluster: Any) -> None:
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses, timeout=5.0) as admin:
        await admin.create_topic("grows", partitions=1, replicas=1, channels=["c"])
        _swallow_one_cancel(admin, "_quiet_view")
        took = await _bounded(admin.expand_topic("grows", 2, wait=True, channels=["c"], timeout=0.5,
                                                 poll_interval=0.05))
    assert took < 3.0
