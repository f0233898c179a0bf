"""What a link's answers tell the RDY model. The link calls the controller itself on every
message (``flow.Flow`` has no per-message method), so these drive the real link, flow
control, controller and dispatch queue; only the connection is a list of the commands sent.

A FIN is a success, a requeue the handler asked for with ``backoff=True`` (or a raise) a
failure that slows the consumer down, and a requeue with ``backoff=False`` (the handler's
"not for me now", the drain, a message nobody will handle) says nothing about the downstream
system: it must not start a back-off, on a plain subscription (the consumer's back-off) or an
ordered one (the partition's own).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Dispatch
from smartnsq.consumer.flow import Flow
from smartnsq.consumer.link import Link
from smartnsq.consumer.runtime import Runtime
from smartnsq.message import FINISHED, REQUEUED, Message
from smartnsq.model.backoff import BACKING_OFF, NORMAL

MAX_IN_FLIGHT = 4


class Wire:
    """The consumer's side of one subscription, on an event loop that is not running: the
    link's commands are recorded, RDY apart from the answers."""

    def __init__(self, *, ordered: bool) -> None:
        self.loop = asyncio.new_event_loop()
        cfg = ConsumerConfig()
        rt = self.rt = Runtime("t", "c", cfg)
        rt.trace = False
        rt.loop = self.loop
        rt.loop_thread_id = threading.get_ident()
        rt.queue = Dispatch(self.loop)
        rt.flow = Flow(self.loop, MAX_IN_FLIGHT, cfg.backoff_policy, cfg.rdy_tick_interval,
                       cfg.low_rdy_idle_timeout)
        self.rdy: list[int] = []
        self.answers: list[bytes] = []
        conn: Any = SimpleNamespace(send=self._send, send_now=self._send,
                                    address_text="127.0.0.1:4150", is_youzan=ordered,
                                    local_address="127.0.0.1:1", is_closed=False,
                                    last_receive=0.0, max_rdy_count=2500)
        self.link = Link(rt, conn, 0 if ordered else None, ordered=ordered, detail=ordered)
        rt.flow.add(self.link)
        self.sent = 0

    def _send(self, data: bytes, now: bool = False) -> None:
        if data.startswith(b"RDY "):
            self.rdy.append(int(data[4:].strip()))
        else:
            self.answers.append(data)

    def deliver(self) -> Message:
        self.sent += 1
        n = self.sent
        if self.link.ordered:
            msg = Message(0, 1, n.to_bytes(8, "big") + bytes(8), b"body", queue_offset=34 * n,
                          raw_size=34)
        else:
            msg = Message(0, 1, b"%016x" % n, b"body")
        self.link.on_message(msg)
        assert self.rt.queue.pending.popleft() is msg  # no inline handler: it was queued
        return msg

    def backoff(self) -> str:
        """The back-off that governs the link: the partition's own (ordered), else the
        consumer's."""
        ctl = self.rt.flow.ctl
        own = ctl.backoff_state(self.link, self.loop.time())
        return str(ctl.backoff.state) if own is None else own

    def close(self) -> None:
        self.rt.flow.close()
        self.loop.close()


@pytest.fixture(params=[False, True], ids=["plain", "ordered"])
def wire(request: pytest.FixtureRequest) -> Iterator[Wire]:
    w = Wire(ordered=request.param)
    yield w
    w.close()


def test_a_requeue_without_backoff_does_not_slow_the_consumer_down(wire: Wire) -> None:
    msg = wire.deliver()
    wire.link.settle(msg, REQUEUED, 0.0, False)  # msg.req(backoff=False), a drain, a give-back
    assert wire.answers[-1].startswith(b"REQ ")
    assert wire.backoff() == NORMAL
    assert wire.rt.flow.ctl.backoff.level == 0


def test_a_message_handed_back_does_not_slow_the_consumer_down(wire: Wire) -> None:
    wire.link.give_back(wire.deliver())
    assert wire.backoff() == NORMAL


def test_a_failed_requeue_backs_off_and_a_fin_does_not(wire: Wire) -> None:
    wire.link.settle(wire.deliver(), FINISHED, None, False)
    assert wire.answers[-1].startswith(b"FIN ") and wire.backoff() == NORMAL
    wire.link.settle(wire.deliver(), REQUEUED, 0.0, True)  # msg.req() or a raise
    assert wire.backoff() == BACKING_OFF
    assert wire.rdy[-1] == 0  # nothing more comes while backing off


def test_the_answers_come_through_message_req_as_well(wire: Wire) -> None:
    wire.deliver().req(0, backoff=False)
    assert wire.backoff() == NORMAL
    wire.deliver().req(0)
    assert wire.backoff() == BACKING_OFF
