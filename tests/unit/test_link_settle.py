"""How a link settles an answer when its connection is gone: the FIN's write is not preceded
by an ``is_closed`` check (a property call per message on the ordered path), so the
connection's own refusal (``ConnectionClosed``) must count the answer lost, keep the counts
true and move the ordered partition's lane on, exactly as the check did."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Runtime
from smartnsq.consumer.link import Link
from smartnsq.errors import ConnectionClosed
from smartnsq.message import FINISHED, REQUEUED, Message
from smartnsq.model.rdy import NOTHING


def closed_link(*, ordered: bool) -> tuple[Link, Runtime, list[Message], list[bytes]]:
    queued: list[Message] = []
    sent: list[bytes] = []
    rt = Runtime("t", "c", ConsumerConfig())
    rt.trace = False
    rt.loop_thread_id = -1
    rt.flow = SimpleNamespace(  # type: ignore[assignment]
        on_ordered_requeue=lambda *a: None, now=lambda: 0.0,
        ctl=SimpleNamespace(on_message=lambda *a: [],
                            on_finished=lambda *a, **k: NOTHING))
    rt.queue = SimpleNamespace(push=queued.append, pending=0)  # type: ignore[assignment]

    def refuse(data: bytes, now: bool = False) -> None:
        raise ConnectionClosed("connection to 127.0.0.1:4150 closed")

    conn: Any = SimpleNamespace(send=refuse, send_now=refuse, address_text="127.0.0.1:4150",
                                is_youzan=ordered, local_address="127.0.0.1:1",
                                is_closed=False, last_receive=0.0)
    link = Link(rt, conn, 0 if ordered else None, ordered=ordered, detail=ordered)
    return link, rt, queued, sent


def message(n: int, *, youzan: bool) -> Message:
    if youzan:
        return Message(0, 1, n.to_bytes(8, "big") + bytes(8), b"body", queue_offset=34 * n,
                       raw_size=34)
    return Message(0, 1, b"%016x" % n, b"body")


def test_an_ordered_fin_refused_by_the_closed_connection_is_lost_and_the_lane_moves() -> None:
    link, rt, queued, sent = closed_link(ordered=True)
    first, second = message(1, youzan=True), message(2, youzan=True)
    link.on_message(first)
    link.on_message(second)  # waits behind the first in the partition's lane
    assert queued == [first] and link.lane_busy
    link.conn.is_closed = True
    link.settle(first, FINISHED, None, False)
    assert rt.lost_answers == 1 and rt.finished == 1 and sent == []
    assert link.in_flight == 1 and rt.in_flight == 1 and queued == [first, second]


def test_a_plain_fin_and_req_after_close_are_lost_answers() -> None:
    link, rt, _, _ = closed_link(ordered=False)
    a, b = message(1, youzan=False), message(2, youzan=False)
    link.on_message(a)
    link.on_message(b)
    link.conn.is_closed = True
    link.settle(a, FINISHED, None, False)
    link.settle(b, REQUEUED, 1.0, True)
    assert rt.lost_answers == 2 and rt.finished == 1 and rt.requeued == 1
    assert link.in_flight == 0 and rt.in_flight == 0
