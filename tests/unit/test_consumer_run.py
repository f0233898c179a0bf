"""``Consumer.run()``'s edges, in process: a timeout returns False and leaves the consumer
running, the signal handlers are put back whatever ended it, a signal that cannot be caught is
refused before anything starts, and a closed consumer's run() is over at once. (The signals
themselves are sent to a child process: tests/integration/test_consumer_run_signals.py.)"""

from __future__ import annotations

import asyncio
import signal

import pytest

from smartnsq import Consumer
from smartnsq.errors import InvalidArgument

NOWHERE = ["127.0.0.1:1"]  # nothing listens: the subscription retries in the background


def _handle(message: object) -> None:
    """Never called: nothing is delivered."""


async def test_a_timeout_returns_false_keeps_consuming_and_puts_the_handlers_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    consumer = Consumer("t", "c", nsqd=NOWHERE, handler=_handle, reconnect_delay=0.05)
    try:
        assert await consumer.run(timeout=0.01) is False
        assert not consumer.closed
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        await consumer.close()
    assert await consumer.run() is True  # closed: nothing to wait for
    assert {s: signal.getsignal(s) for s in before} == before


async def test_a_closed_consumer_that_never_started_is_run_at_once() -> None:
    consumer = Consumer("t", "c", nsqd=NOWHERE, handler=_handle)
    await consumer.close()
    assert await consumer.run() is True


async def test_a_signal_that_cannot_be_caught_is_refused_before_anything_starts() -> None:
    before = signal.getsignal(signal.SIGINT)
    consumer = Consumer("t", "c", nsqd=NOWHERE, handler=_handle)
    with pytest.raises(InvalidArgument) as info:
        await consumer.run(stop_on=(signal.SIGINT, signal.SIGKILL))
    assert info.value.field == "stop_on"
    assert signal.getsignal(signal.SIGINT) is before  # the one taken first is put back
    assert consumer.connection_count == 0 and not consumer.closed
    await consumer.close()


async def test_the_handlers_are_held_while_it_runs_and_stop_on_nothing_holds_none() -> None:
    before = signal.getsignal(signal.SIGTERM)
    consumer = Consumer("t", "c", nsqd=NOWHERE, handler=_handle)
    during: list[object] = []

    def note() -> None:  # runs while run() waits
        during.append(signal.getsignal(signal.SIGTERM))

    loop = asyncio.get_running_loop()
    try:
        loop.call_soon(note)
        assert await consumer.run(timeout=0.01) is False
        loop.call_soon(note)
        assert await consumer.run(timeout=0.01, stop_on=()) is False
    finally:
        await consumer.close()
    assert during[0] is not before  # run() held SIGTERM
    assert during[1] is before  # stop_on=(): left alone
