"""Racing requests to several lookupds: go on ``grace`` after the first usable answer.

Lookupds read the same etcd but register nsqd on their own, so one may briefly miss a node the
others see: a round asks every healthy lookupd at once and merges what comes. It never waits
for the slowest one: once one has answered, the others get ``answer_grace`` more, and the
round goes on with what has arrived; a request still running then ends (by its own deadline)
in the background.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["outcome_read", "race"]

T = TypeVar("T")


async def race(pending_tasks: set[asyncio.Task[T]], settle: Callable[[asyncio.Task[T]], bool],
               grace: float) -> set[asyncio.Task[T]]:
    """Wait on ``pending_tasks`` until all have ended, or ``grace`` s after the first one
    ``settle`` (called once per ended task) calls usable; returns those still running (the
    caller lets them end in the background). Cancelled, it cancels every task still running
    and reads each one's outcome when it comes, so none is reported as never retrieved."""
    loop = asyncio.get_running_loop()
    pending = set(pending_tasks)
    grace_ends: float | None = None
    try:
        while pending:
            wait = None if grace_ends is None else max(grace_ends - loop.time(), 0.0)
            done, pending = await asyncio.wait(pending, timeout=wait,
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break  # the grace is over: go on without the slow ones
            usable = False
            for task in done:
                usable = settle(task) or usable
            if usable and grace_ends is None:
                grace_ends = loop.time() + grace
    except BaseException:
        # cancelled (the manager closing): a request may have ended in the same turn, its
        # failure unread; read every one's outcome, whenever it comes
        for task in pending:
            task.add_done_callback(outcome_read)
            task.cancel()
        raise
    return pending


def outcome_read(task: asyncio.Task[Any]) -> None:
    """Mark a task's failure as seen (it was recorded where it happened)."""
    if not task.cancelled():
        task.exception()
