"""A blocking facade called on a thread that runs an event loop: it works, and says (once per
calling line, a ``RuntimeWarning``) that the loop stands still meanwhile; from a plain thread
it says nothing. (The cluster runs in a thread of its own: the blocked loop is the caller's.)"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator

import pytest
from support import WAIT, BackgroundCluster

from smartnsq import Admin, sync


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(1, {"blockwarn": 1}, WAIT)
    yield background
    background.stop()


def test_a_blocking_call_inside_async_code_warns(bg: BackgroundCluster) -> None:
    async def inside_a_loop() -> None:
        with sync.Producer(lookupd=bg.lookupd) as producer:
            with pytest.warns(RuntimeWarning, match=r"blocks the event loop .* await smartnsq"):
                producer.publish("blockwarn", b"x")
            with pytest.warns(RuntimeWarning) as caught:
                producer.publish_many("blockwarn", [b"y"])
            assert caught[0].filename == __file__  # the user's line, not the facade's
        with Admin(bg.lookupd) as admin, pytest.warns(RuntimeWarning, match="AsyncAdmin"):
            admin.nodes()

    asyncio.run(inside_a_loop())


def test_a_blocking_call_from_a_plain_thread_is_quiet(bg: BackgroundCluster) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sync.Producer(lookupd=bg.lookupd) as producer:
            producer.publish("blockwarn", b"x")
        with Admin(bg.lookupd) as admin:
            admin.nodes()
