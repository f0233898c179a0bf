"""How a link settles an answer when its connection is gone: the FIN's write is not preceded
by an ``is_closed`` check (a property call per message on the ordered path), so the
connection's own refusal (``ConnectionClosed``) must count the answer lost, keep the counts
true and move the ordered partition's lane on, exactly as the check did. The link, its flow
control and dispatch queue are real; the connection is a stand-in that refuses every write once
it is gone."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Dispatch
from smartnsq.consumer.flow import Flow
from smartnsq.consumer.link import Link
from smartnsq.consumer.runtime import Runtime
from smartnsq.errors import ConnectionClosed
from smartnsq.message import FINISHED, REQUEUED, Message


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()  # never run: the flow's timers are only armed
    yield loop
    loop.close()


def closed_link(loop: asyncio.AbstractEventLoop, *,
                ordered: bool) -> tuple[Link, Runtime, deque[Message], list[bytes]]:
    sent: list[bytes] = []
    cfg = ConsumerConfig()
    rt = Runtime("t", "c", cfg)
    rt.trace = False
    rt.loop = loop
    rt.loop_thread_id = -1
    rt.flow = Flow(loop, 10, cfg.backoff_policy, cfg.rdy_tick_interval,
                   cfg.low_rdy_idle_timeout)
    rt.queue = Dispatch(loop)

    def send(data: bytes, now: bool = False) -> None:
        if conn.is_closed:  # as Connection.send does
            raise ConnectionClosed("connection to 127.0.0.1:4150 closed")
        sent.append(data)

    conn: Any = SimpleNamespace(send=send, send_now=send, address_text="127.0.0.1:4150",
                                is_youzan=ordered, local_address="127.0.0.1:1",
                                is_closed=False, last_receive=0.0, max_rdy_count=2500)
    link = Link(rt, conn, 0 if ordered else None, ordered=ordered, detail=ordered)
    rt.flow.add(link)
    rt.flow.close()  # (no timers left on the loop)
    sent.clear()
    return link, rt, rt.queue.pending, sent


def message(n: int, *, youzan: bool) -> Message:
    if youzan:
        return Message(0, 1, n.to_bytes(8, "big") + bytes(8), b"body", queue_offset=34 * n,
                       raw_size=34)
    return Message(0, 1, b"%016x" % n, b"body")


def test_an_ordered_fin_refused_by_the_closed_connection_is_lost_and_the_lane_moves(
        loop: asyncio.AbstractEventLoop) -> None:
    link, rt, queued, sent = closed_link(loop, ordered=True)
    first, second = message(1, youzan=True), message(2, youzan=True)
    link.on_message(first)
    link.on_message(second)  # waits behind the first in the partition's lane
    assert list(queued) == [first] and link.lane_busy
    link.conn.is_closed = True
    link.settle(first, FINISHED, None, False)
    assert rt.lost_answers == 1 and rt.finished == 1 and sent == []
    assert link.in_flight == 1 and rt.in_flight == 1 and list(queued) == [first, second]


def test_a_plain_fin_and_req_after_close_are_lost_answers(
        loop: asyncio.AbstractEventLoop) -> None:
    link, rt, _, _ = closed_link(loop, ordered=False)
    a, b = message(1, youzan=False), message(2, youzan=False)
    link.on_message(a)
    link.on_message(b)
    link.conn.is_closed = True
    link.settle(a, FINISHED, None, False)
    link.settle(b, REQUEUED, 1.0, True)
    assert rt.lost_answers == 2 and rt.finished == 1 and rt.requeued == 1
    assert link.in_flight == 0 and rt.in_flight == 0
