"""The inline runner's share of ``Runtime.handled`` is derived from its handler-time sample
countdown rather than counted per call (counting each call cost too much): it must still
equal the handlers that returned, across the warm-up, many countdowns, raises and hand-overs."""

from __future__ import annotations

import asyncio
from typing import Any

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Dispatch
from smartnsq.consumer.handling import inline_runner
from smartnsq.consumer.runtime import Runtime
from smartnsq.message import FINISHED, PENDING, Message
from smartnsq.observability.counters import HANDLER_SAMPLE, PartitionCounts


class FakeLink:
    """The link the runner answers through (what it calls of a ``smartnsq.message.Responder``):
    records the answers."""

    dead = False
    ordered = False

    def __init__(self) -> None:
        self.counts = PartitionCounts()
        self.answers: list[int] = []
        self.given_back = 0

    def settle(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        message._state = state
        self.answers.append(state)

    def give_back(self, message: Message) -> None:
        self.given_back += 1


def test_inline_handled_is_exact_across_countdowns_raises_and_hand_overs() -> None:
    loop = asyncio.new_event_loop()
    try:
        # (the attempt count numbers the messages: no give-up may take them from the runner)
        rt = Runtime("t", "c", ConsumerConfig(max_attempts=0))
        rt.loop = loop
        rt.queue = Dispatch(loop)
        returned = 0

        async def later() -> None:
            return None

        def handler(msg: Message) -> Any:
            nonlocal returned
            n = msg.attempts
            if n % 7 == 0:
                raise ValueError("no")
            if n % 11 == 0:
                return later()  # an awaitable: a worker finishes it (not counted here)
            returned += 1
            return None

        run = inline_runner(rt, handler)
        link = FakeLink()
        total = 5 * HANDLER_SAMPLE + 37
        for i in range(1, total + 1):
            msg = Message(0, i, b"%016x" % i, b"x", 0, None, None, None, False)
            msg._state = PENDING
            msg._auto = True
            link.counts.received += 1
            run(msg, link)
            assert rt.handled == returned, i
        assert returned > 0 and link.answers.count(FINISHED) == returned
        # timed: the first HANDLER_SAMPLE calls, then one starting each countdown
        timed = HANDLER_SAMPLE + len(range(HANDLER_SAMPLE, total, HANDLER_SAMPLE))
        assert sum(rt.meter.handler.buckets) == timed
        # a second runner for the same runtime keeps the first one's count
        run2 = inline_runner(rt, lambda m: None)
        msg = Message(0, 1, b"%016x" % 0, b"x", 0, None, None, None, False)
        msg._state = PENDING
        msg._auto = True
        run2(msg, link)
        assert rt.handled == returned + 1
        for coro in rt.queue.started.values():
            coro.close()  # type: ignore[attr-defined]
    finally:
        loop.close()
