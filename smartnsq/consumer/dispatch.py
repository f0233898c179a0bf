"""The queue between the connections and the handlers, and who is woken for the next message.

The links push what they received and could not hand to an inline handler; the worker tasks
(``smartnsq.consumer.handling``) and ``async for`` take from it. ``idle`` and ``waking`` are
public for one reader: a worker takes the next message itself while nobody waits
(:meth:`Dispatch.get` without the coroutine), on every queued message's path.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import Any

from ..message import Message

__all__ = ["Dispatch"]


class Dispatch:
    """The queue between the connections and the handlers, built for bursts.

    ``asyncio.Queue`` wakes one waiting worker per ``put``: a read of 200 messages would cost
    200 task switches even when the handler never waits. Here at most one idle worker is being
    woken at a time; a worker that takes a message while more are waiting wakes the next one
    before running its handler. A handler that does not suspend lets one worker drain the whole
    burst in one step; handlers that do suspend still get every worker, one wake-up per handler
    start.
    """

    __slots__ = ("_loop", "idle", "pending", "started", "stopped", "waking")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.pending: deque[Message] = deque()
        # queued messages whose plain handler already ran inline and returned an awaitable:
        # a worker awaits it (the handler holds a worker's slot, as if it had started there)
        self.started: dict[Message, Awaitable[Any]] = {}
        self.idle: deque[asyncio.Future[None]] = deque()
        self.waking = 0
        self.stopped = False

    def push(self, msg: Message) -> None:
        self.pending.append(msg)
        if not self.waking and self.idle:
            self.wake()

    def hand_over(self, msg: Message, rest: Awaitable[Any]) -> None:
        """The inline handler of ``msg`` returned ``rest``: the next free worker awaits it."""
        self.started[msg] = rest
        self.pending.appendleft(msg)
        if not self.waking and self.idle:
            self.wake()

    def wake(self) -> None:
        idle = self.idle
        while idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                self.waking += 1
                return

    async def get(self) -> Message | None:
        """The next message, waiting for one; ``None`` once stopped and empty."""
        pending = self.pending
        while True:
            if pending:
                msg = pending.popleft()
                if pending and self.idle and not self.waking:
                    self.wake()
                return msg
            if self.stopped:
                return None
            fut = self._loop.create_future()
            self.idle.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.waking -= 1  # woken, then cancelled: pass the wake-up on
                    if pending:
                        self.wake()
                raise
            self.waking -= 1

    def stop(self) -> None:
        self.stopped = True
        for fut in self.idle:
            if not fut.done():
                fut.set_result(None)
                self.waking += 1
        self.idle.clear()

    def take_all(self) -> list[Message]:
        """The messages no handler has started on (those that did stay, for the workers)."""
        started = self.started
        items = [m for m in self.pending if m not in started]
        self.pending.clear()
        self.pending.extend(started)
        return items

    def __len__(self) -> int:
        return len(self.pending)
