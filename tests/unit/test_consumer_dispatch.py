"""The worker takes the next queued message itself while no other worker waits (what
``Dispatch.get`` does then, without awaiting a coroutine): the workers must hand out messages
exactly as readers of ``Dispatch.get`` alone would. Both run the same scripted bursts on a real
queue with a handler that waits to be released; the order of every handler start and end must
be the same."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Dispatch
from smartnsq.consumer.handling import worker
from smartnsq.consumer.runtime import Runtime
from smartnsq.message import FINISHED, PENDING, Message

WAIT = 5.0  # seconds: the bound of every wait below (none is reached when the test passes)


class Responder:
    """The link the workers answer through: records the FINs."""

    dead = False
    ordered = False

    def __init__(self) -> None:
        self.finished: list[bytes] = []

    def settle(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        message._state = state
        if state == FINISHED:
            self.finished.append(message.body)

    def give_back(self, message: Message) -> None:
        raise AssertionError("nothing is given back here")


Reader = Callable[[Runtime, Callable[[Message], Awaitable[None]]], Awaitable[None]]


async def get_only(rt: Runtime, handler: Callable[[Message], Awaitable[None]]) -> None:
    """The reference reader: every message through ``Dispatch.get``, answered as a worker
    answers."""
    while True:
        msg = await rt.queue.get()
        if msg is None:
            return
        await handler(msg)
        rt.handled_queued += 1
        if msg._state == PENDING and msg._auto:
            msg._responder.settle(msg, FINISHED, None, False)


async def script(reader: Reader, workers: int, bursts: list[int]) -> list[tuple[str, int]]:
    """Push ``bursts`` of messages; release each started handler in the order they started,
    the next burst once the one before is all released. The events, in order."""
    loop = asyncio.get_running_loop()
    rt = Runtime("t", "c", ConsumerConfig())
    rt.loop = loop
    rt.queue = Dispatch(loop)
    events: list[tuple[str, int]] = []
    total = sum(bursts)
    started = [asyncio.Event() for _ in range(total)]
    gates = [asyncio.Event() for _ in range(total)]
    ended = asyncio.Event()
    responder = Responder()

    async def handler(msg: Message) -> None:
        n = int(msg.body)
        events.append(("start", n))
        started[n].set()
        await gates[n].wait()
        events.append(("end", n))
        if len([e for e in events if e[0] == "end"]) == total:
            ended.set()

    tasks = [loop.create_task(reader(rt, handler)) for _ in range(workers)]
    n = 0
    for burst in bursts:
        first = n
        for _ in range(burst):
            msg = Message(0, 1, b"%016x" % n, b"%d" % n)
            msg._responder = responder  # type: ignore[assignment]
            msg._state = PENDING
            msg._auto = True
            rt.queue.push(msg)
            n += 1
        released: list[int] = []
        while len(released) < burst:
            starts = [i for kind, i in events if kind == "start" and i >= first]
            waiting = [i for i in starts if i not in released]
            if not waiting:  # the next one has not started yet: wait for it
                nxt = next(i for i in range(first, n) if i not in starts)
                await asyncio.wait_for(started[nxt].wait(), WAIT)
                continue
            gates[waiting[0]].set()
            released.append(waiting[0])
    await asyncio.wait_for(ended.wait(), WAIT)
    rt.queue.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
    assert sorted(responder.finished) == sorted(b"%d" % i for i in range(total))
    return events


@pytest.mark.parametrize(("workers", "bursts"), [
    (1, [5]), (2, [5]), (3, [7]), (3, [1, 4, 2]), (4, [2, 9, 3]), (8, [3, 3]),
])
def test_the_workers_hand_out_messages_as_dispatch_get_does(workers: int,
                                                            bursts: list[int]) -> None:
    reference = asyncio.run(script(get_only, workers, bursts))
    real = asyncio.run(script(worker, workers, bursts))
    assert real == reference
    assert len(real) == 2 * sum(bursts)
