"""Answers to a message from several threads: the first one wins atomically, exactly one FIN
or REQ leaves. The subscription's link, flow control and dispatch queue are real; its
connection is a list of the answers sent and its event loop runs in a thread, as under
``smartnsq.sync.Consumer``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Dispatch
from smartnsq.consumer.flow import Flow
from smartnsq.consumer.link import Link
from smartnsq.consumer.runtime import Runtime
from smartnsq.errors import AlreadyResponded
from smartnsq.message import REQUEUED, Message

_STATE_SLOT: Any = Message.__dict__["_state"]


class PausingMessage(Message):
    """Pauses the first read of its state made by ``pause_thread``, until another answer was
    given (or a short bound passed: answers being atomic, the other one waits for this one)."""

    __slots__ = ("other_done", "pause_thread", "paused")

    other_done: threading.Event
    pause_thread: int | None
    paused: threading.Event

    @property
    def _state(self) -> int:
        value = int(_STATE_SLOT.__get__(self))
        if threading.get_ident() == self.pause_thread and not self.paused.is_set():
            self.paused.set()
            self.other_done.wait(0.3)
        return value

    @_state.setter
    def _state(self, value: int) -> None:
        _STATE_SLOT.__set__(self, value)


@pytest.fixture
def link() -> Iterator[tuple[Link, list[bytes], asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    cfg = ConsumerConfig()
    rt = Runtime("t", "c", cfg)
    rt.trace = False
    rt.loop = loop
    rt.queue = Dispatch(loop)
    rt.flow = Flow(loop, 10, cfg.backoff_policy, cfg.rdy_tick_interval,
                   cfg.low_rdy_idle_timeout)
    sent: list[bytes] = []

    def send(data: bytes, now: bool = False) -> None:
        if not data.startswith(b"RDY "):
            sent.append(data)

    conn: Any = SimpleNamespace(send=send, send_now=send, address_text="127.0.0.1:4150",
                                is_youzan=True, local_address="127.0.0.1:1", is_closed=False,
                                last_receive=0.0, max_rdy_count=2500)
    responder = Link(rt, conn, 0, ordered=False, detail=False)
    rt.flow.add(responder)  # (before the loop runs: nothing else touches it yet)
    ready = threading.Event()
    ident: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        ident.append(threading.get_ident())
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(5)
    rt.loop_thread_id = ident[0]
    yield responder, sent, loop
    loop.call_soon_threadsafe(rt.flow.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> Any:
    """``call()`` on the loop's thread, its result here."""
    async def run() -> Any:
        return call()

    return asyncio.run_coroutine_threadsafe(run(), loop).result(5)


def flush(loop: asyncio.AbstractEventLoop) -> None:
    """Let the loop run what threads handed to it."""
    on_loop(loop, lambda: None)


def deliver(link: Link, loop: asyncio.AbstractEventLoop, cls: type[Message] = Message) -> Any:
    """A message delivered on ``link`` as the connection delivers it (on the loop), then
    taken from the dispatch queue as a worker would."""
    msg = cls(1, 1, b"\x00" * 7 + b"\x01" + b"\x00" * 8, b"body")
    on_loop(loop, lambda: link.on_message(msg))
    assert on_loop(loop, link.rt.queue.pending.popleft) is msg
    return msg


def test_two_threads_answering_at_once_send_one_answer(link: Any) -> None:
    responder, sent, loop = link
    msg = deliver(responder, loop, PausingMessage)
    msg.other_done = threading.Event()
    msg.paused = threading.Event()
    outcomes: dict[str, str] = {}

    go = threading.Event()

    def requeue() -> None:
        go.wait(5)
        try:
            msg.req(0)
            outcomes["req"] = "sent"
        except AlreadyResponded:
            outcomes["req"] = "refused"

    def finish() -> None:
        msg.paused.wait(5)  # the other thread is between its check and its answer
        try:
            msg.fin()
            outcomes["fin"] = "sent"
        except AlreadyResponded:
            outcomes["fin"] = "refused"
        finally:
            msg.other_done.set()

    first = threading.Thread(target=requeue)
    msg.pause_thread = None
    first.start()
    msg.pause_thread = first.ident
    go.set()
    second = threading.Thread(target=finish)
    second.start()
    first.join(5)
    second.join(5)
    flush(loop)
    assert sorted(outcomes.values()) == ["refused", "sent"]
    assert len(sent) == 1
    assert sent[0].startswith(b"REQ " if outcomes["req"] == "sent" else b"FIN ")


def test_an_answer_from_a_thread_is_visible_at_once_and_a_second_one_raises(link: Any) -> None:
    responder, sent, loop = link
    msg = deliver(responder, loop)
    worker = threading.Thread(target=msg.fin)
    worker.start()
    worker.join(5)
    # before the loop sent it: already answered (the consumer's auto-answer checks this)
    assert msg.has_responded and msg.finished and not msg.requeued
    with pytest.raises(AlreadyResponded):
        msg.req()
    flush(loop)
    assert msg.finished and len(sent) == 1 and sent[0].startswith(b"FIN ")


def test_a_claim_the_loop_overtook_is_dropped(link: Any) -> None:
    responder, sent, loop = link
    msg = deliver(responder, loop)

    def on_loop() -> None:
        # a thread claims the message, then the loop answers on its own before the hop runs
        # (as the worker does on cancellation): only the loop's answer leaves
        worker = threading.Thread(target=msg.fin)
        worker.start()
        worker.join(5)
        responder.settle(msg, REQUEUED, 0.0, False)

    loop.call_soon_threadsafe(on_loop)
    flush(loop)
    flush(loop)
    assert msg.requeued and len(sent) == 1 and sent[0].startswith(b"REQ ")
