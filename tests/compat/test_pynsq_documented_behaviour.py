"""The pynsq layer keeps pynsq's documented Reader/Message/Writer/run() behaviour.

What pynsq documents and its users rely on: ``preprocess_message``/``validate_message`` (a
message that fails validation is finished, the handler never sees it), ``max_tries`` and
``giving_up()``, ``requeue(delay=, time_ms=, backoff=)`` with ``requeue_delay`` x attempts
as the default delay, handlers returning True/False or raising, coroutine handlers, one
answer per message, the argument checks of the constructors, and ``run()`` ending on
``stop()`` (from any thread) or SIGTERM.

The messages here are real smartnsq messages answered through a recording responder (the
core's ``Responder`` protocol), handed to the Reader as its consumer hands them; the Readers
point at a closed port, so no server is involved and every answer is seen exactly.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

import smartnsq.compat.pynsq_loops as loops
from smartnsq import sync
from smartnsq.compat import pynsq as nsq
from smartnsq.compat.pynsq import options as pynsq_options
from smartnsq.compat.pynsq import writer as pynsq_writer
from smartnsq.errors import AlreadyResponded, ConnectionFailed, InvalidArgument
from smartnsq.message import FINISHED, PENDING, REQUEUED
from smartnsq.message import Message as CoreMessage
from smartnsq.observability import logs
from smartnsq.transport import loop_thread

NOWHERE = "127.0.0.1:1"  # nothing listens there: the Readers never get a real message
DEADLINE = 10.0


@pytest.fixture(autouse=True)
def fresh_repeat_filter() -> None:
    """The library holds back a log line identical to a recent one: these tests read them."""
    logs.reset()


class Recorder:
    """A responder that records every answer the layer sends for a message."""

    topic = "t"
    channel = "c"
    node = "127.0.0.1:4150"
    ordered = False
    dead = False

    def __init__(self) -> None:
        self.answers: list[tuple[bytes, int, float | None, bool]] = []
        self.touches: list[bytes] = []
        self._changed = threading.Condition()

    def answer(self, message: CoreMessage, state: int, delay: float | None,
               backoff: bool) -> None:
        if message._state != PENDING:
            message._refuse()
        message._state = state
        with self._changed:
            self.answers.append((message.body, state, delay, backoff))
            self._changed.notify_all()

    settle = answer

    def touch(self, message: CoreMessage) -> None:
        with self._changed:
            self.touches.append(message.body)
            self._changed.notify_all()

    def give_back(self, message: CoreMessage) -> None:
        self.answer(message, REQUEUED, 0.0, False)

    def wait_answers(self, count: int) -> list[tuple[bytes, int, float | None, bool]]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.answers) >= count, DEADLINE), \
                f"only {len(self.answers)} of {count} answers arrived"
            return list(self.answers)

    def by_body(self, count: int) -> dict[bytes, tuple[int, float | None, bool]]:
        return {body: (state, delay, backoff)
                for body, state, delay, backoff in self.wait_answers(count)}


def core_message(recorder: Recorder, body: bytes, attempts: int = 1, *,
                 youzan: bool = False, ident: bytes = b"0123456789abcdef") -> CoreMessage:
    message = CoreMessage(1_700_000_000_000_000_000, attempts, ident, body, youzan=youzan)
    message._responder = recorder
    message._state = PENDING
    message._auto = False
    return message


def deliver(reader: nsq.Reader, messages: Iterable[CoreMessage]) -> None:
    """Hand messages to the Reader on the network loop, as its consumer does."""
    for message in messages:
        reader._thread.call_soon(reader._deliver, message)


def run_until(condition: Callable[[], bool]) -> None:
    """nsq.run() until ``condition()`` holds (checked on the run() loop) or the deadline."""
    loop = loops.user_loop()
    deadline = time.monotonic() + DEADLINE

    def check() -> None:
        if condition() or time.monotonic() > deadline:
            nsq.stop()
        else:
            loop.call_later(0.005, check)

    loop.call_soon(check)
    nsq.run()
    assert condition(), "run() was stopped by the deadline"


def reader_of(handler: Any, cls: type[nsq.Reader] = nsq.Reader, **kwargs: Any) -> nsq.Reader:
    return cls("t", "c", handler, nsqd_tcp_addresses=NOWHERE, **kwargs)


# -- the handler's answers --------------------------------------------------------------------

def test_a_message_failing_validation_is_finished_without_the_handler() -> None:
    """pynsq: ``validate_message(preprocess_message(m))`` false finishes ``m``; the handler
    gets the original message, not what preprocess_message returned."""
    recorder = Recorder()
    handled: list[Any] = []
    validated: list[Any] = []

    class Validating(nsq.Reader):
        def preprocess_message(self, message: nsq.Message) -> Any:
            return ("pre", message.body)

        def validate_message(self, message: Any) -> bool:
            validated.append(message)
            return bool(message[1] != b"invalid")

    def handler(message: nsq.Message) -> bool:
        handled.append(message)
        return True

    reader = reader_of(handler, Validating)
    deliver(reader, [core_message(recorder, b"invalid"), core_message(recorder, b"valid")])
    run_until(lambda: len(validated) == 2)
    assert validated == [("pre", b"invalid"), ("pre", b"valid")]
    assert [m.body for m in handled] == [b"valid"] and isinstance(handled[0], nsq.Message)
    assert recorder.by_body(2) == {b"invalid": (FINISHED, None, False),
                                   b"valid": (FINISHED, None, False)}


def test_max_tries_gives_up_with_a_finish_and_zero_never_gives_up() -> None:
    recorder = Recorder()
    handled: list[bytes] = []
    gave_up: list[tuple[bytes, int]] = []

    class Counting(nsq.Reader):
        def giving_up(self, message: nsq.Message) -> None:
            gave_up.append((message.body, message.attempts))
            super().giving_up(message)

    def handler(message: nsq.Message) -> bool:
        handled.append(message.body)
        return True

    limited = reader_of(handler, Counting, max_tries=3)
    unlimited = reader_of(handler, Counting, max_tries=0)
    deliver(limited, [core_message(recorder, b"4th", attempts=4),
                      core_message(recorder, b"3rd", attempts=3)])
    deliver(unlimited, [core_message(recorder, b"1000th", attempts=1000)])
    run_until(lambda: len(handled) == 2 and len(gave_up) == 1)
    assert gave_up == [(b"4th", 4)]  # attempts > max_tries: given up, never handled
    assert sorted(handled) == [b"1000th", b"3rd"]
    assert recorder.by_body(3) == {b"4th": (FINISHED, None, False),
                                   b"3rd": (FINISHED, None, False),
                                   b"1000th": (FINISHED, None, False)}


def test_requeue_delays_as_pynsq_documents() -> None:
    """``delay`` in seconds (-1 or absent: ``requeue_delay`` x attempts), ``time_ms``, and
    ``backoff`` (True unless told), for requeues by hand and for a False return."""
    recorder = Recorder()
    seen: list[bytes] = []

    def handler(message: nsq.Message) -> bool:
        seen.append(message.body)
        if message.body == b"default":
            message.requeue()
        elif message.body == b"delay":
            message.requeue(delay=5)
        elif message.body == b"minus-one":
            message.requeue(delay=-1)
        elif message.body == b"time_ms":
            message.requeue(time_ms=1500)
        elif message.body == b"no-backoff":
            message.requeue(backoff=False)
        return False  # ignored once answered; else a requeue with the default delay

    reader = reader_of(handler, requeue_delay=7)
    deliver(reader, [core_message(recorder, b"default", attempts=2),
                     core_message(recorder, b"delay", attempts=2),
                     core_message(recorder, b"minus-one", attempts=3),
                     core_message(recorder, b"time_ms"),
                     core_message(recorder, b"no-backoff"),
                     core_message(recorder, b"returned-false", attempts=2)])
    run_until(lambda: len(seen) == 6)
    assert recorder.by_body(6) == {
        b"default": (REQUEUED, 14.0, True),
        b"delay": (REQUEUED, 5.0, True),
        b"minus-one": (REQUEUED, 21.0, True),
        b"time_ms": (REQUEUED, 1.5, True),
        b"no-backoff": (REQUEUED, 7.0, False),
        b"returned-false": (REQUEUED, 14.0, True),
    }


def test_one_answer_per_message_and_touch_before_it(caplog: pytest.LogCaptureFixture) \
        -> None:
    """A second answer, or a touch after the answer, is refused; a handler raising after it
    answered sends nothing more (pynsq requeues only a message not answered yet)."""
    recorder = Recorder()
    refusals: list[str] = []
    states: list[tuple[bool, bool]] = []

    def handler(message: nsq.Message) -> bool:
        message.touch()
        states.append((message.has_responded(), message.is_async()))
        message.finish()
        states.append((message.has_responded(), message.is_async()))
        for again in (message.finish, message.requeue, message.touch):
            try:
                again()
            except AlreadyResponded as exc:
                refusals.append(str(exc))
        raise RuntimeError("after answering")

    reader = reader_of(handler)
    with caplog.at_level(logging.ERROR, logger="smartnsq.compat.pynsq"):
        deliver(reader, [core_message(recorder, b"once")])
        run_until(lambda: len(refusals) == 3)
    assert states == [(False, False), (True, False)]
    assert all("already answered" in text for text in refusals)
    assert recorder.wait_answers(1) == [(b"once", FINISHED, None, False)]
    assert recorder.touches == [b"once"]
    assert "uncaught exception while handling message" in caplog.text


def test_a_raise_or_a_none_return_requeues(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    seen: list[bytes] = []

    def handler(message: nsq.Message) -> bool | None:
        seen.append(message.body)
        if message.body == b"raise":
            raise ValueError("cannot process")
        return None

    reader = reader_of(handler, requeue_delay=2)
    with caplog.at_level(logging.WARNING, logger="smartnsq.compat.pynsq"):
        deliver(reader, [core_message(recorder, b"raise"), core_message(recorder, b"none")])
        run_until(lambda: len(seen) == 2)
    assert recorder.by_body(2) == {b"raise": (REQUEUED, 2.0, True),
                                   b"none": (REQUEUED, 2.0, True)}
    assert "cannot process" in caplog.text
    assert "returned None" in caplog.text and "return True to finish" in caplog.text


def test_coroutine_handlers_answer_by_their_result(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    ran: list[bytes] = []

    async def handler(message: nsq.Message) -> bool:
        await asyncio.sleep(0)
        ran.append(message.body)
        if message.body == b"raise":
            raise RuntimeError("coroutine failed")
        if message.body == b"by-hand":
            message.requeue(delay=3, backoff=False)
            return True  # answered already: the result is not a second answer
        return message.body == b"true"

    reader = reader_of(handler, requeue_delay=1)
    with caplog.at_level(logging.ERROR, logger="smartnsq.compat.pynsq"):
        deliver(reader, [core_message(recorder, body)
                         for body in (b"true", b"false", b"raise", b"by-hand")])
        run_until(lambda: len(ran) == 4)
        answers = recorder.by_body(4)
    assert answers == {b"true": (FINISHED, None, False), b"false": (REQUEUED, 1.0, True),
                       b"raise": (REQUEUED, 1.0, True), b"by-hand": (REQUEUED, 3.0, False)}
    assert len(recorder.answers) == 4
    assert "coroutine handler failed" in caplog.text


def test_a_burst_larger_than_one_batch_is_all_handled_in_order() -> None:
    recorder = Recorder()
    seen: list[bytes] = []
    count = loops.Mailbox.BATCH + 50

    def handler(message: nsq.Message) -> bool:
        seen.append(message.body)
        return True

    reader = reader_of(handler)
    bodies = [b"%d" % i for i in range(count)]
    messages = [core_message(recorder, body) for body in bodies]
    reader._thread.call_soon(lambda: [reader._deliver(m) for m in messages])
    run_until(lambda: len(seen) == count)
    assert seen == bodies
    assert len(recorder.wait_answers(count)) == count


def test_a_handler_calling_stop_is_the_last_to_run() -> None:
    """stop() from a handler: the messages already handed over wait for the next run()."""
    recorder = Recorder()
    seen: list[bytes] = []

    def handler(message: nsq.Message) -> bool:
        seen.append(message.body)
        if message.body == b"first":
            nsq.stop()
            nsq.stop()  # a second stop must not end the next run() as well
        return True

    reader = reader_of(handler)
    ready = threading.Event()
    messages = [core_message(recorder, body) for body in (b"first", b"second", b"third")]

    def hand_over() -> None:
        for message in messages:
            reader._deliver(message)
        ready.set()

    reader._thread.call_soon(hand_over)
    assert ready.wait(DEADLINE)
    watchdog = threading.Timer(DEADLINE, nsq.stop)
    watchdog.start()
    try:
        nsq.run()
    finally:
        watchdog.cancel()
    assert seen == [b"first"]
    run_until(lambda: len(seen) == 3)
    assert seen == [b"first", b"second", b"third"]


def test_messages_no_handler_took_go_back_on_close() -> None:
    """Delivered while run() is not running, then close(): requeued at once, without delay
    or back-off; a message arriving after close() goes back the same way."""
    recorder = Recorder()
    handled: list[bytes] = []
    reader = reader_of(lambda m: handled.append(m.body) or True)
    deliver(reader, [core_message(recorder, b"a"), core_message(recorder, b"b")])
    deadline = time.monotonic() + DEADLINE
    while len(reader._waiting) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # polling for the network loop's hand-over, with a deadline
    assert len(reader._waiting) == 2
    reader.close().result(DEADLINE)
    assert recorder.by_body(2) == {b"a": (REQUEUED, 0, False), b"b": (REQUEUED, 0, False)}
    late = core_message(recorder, b"late")
    reader._deliver(late)
    assert recorder.by_body(3)[b"late"] == (REQUEUED, 0, False)
    assert handled == [] and reader.stats() == []


# -- the message --------------------------------------------------------------------------------

def test_message_fields() -> None:
    recorder = Recorder()
    reader = reader_of(lambda m: True)
    classic = reader._message(core_message(recorder, b"x" * 50, attempts=3))
    assert classic.id == "0123456789abcdef"  # a classic id: its 16 ASCII hex characters
    assert classic.body == b"x" * 50 and classic.attempts == 3
    assert classic.timestamp == 1_700_000_000_000_000_000
    assert classic.node == recorder.node and classic.topic == "t"  # the core message's
    assert repr(classic) == f"<Message id=0123456789abcdef attempts=3 body={b'x' * 40!r}>"
    youzan = reader._message(core_message(recorder, b"y", youzan=True,
                                          ident=bytes(range(16))))
    assert youzan.id == bytes(range(16)).hex() and len(youzan.id) == 32


def test_a_readers_message_triggers_pynsqs_message_events() -> None:
    """``message.on("finish" | "requeue" | "touch", cb)`` in a handler: called as pynsq calls
    them, after the answer went to the server."""
    recorder = Recorder()
    heard: list[tuple[str, dict[str, Any]]] = []

    def handler(message: nsq.Message) -> bool:
        for name in (nsq.event.FINISH, nsq.event.REQUEUE, nsq.event.TOUCH):
            message.on(name, lambda name=name, **kwargs: heard.append((name, kwargs)))
        message.touch()
        if message.body == b"again":
            message.requeue(backoff=False)
        return True

    reader = reader_of(handler)
    deliver(reader, [core_message(recorder, b"done"), core_message(recorder, b"again")])
    run_until(lambda: len(heard) == 4)
    assert [(name, kwargs.get("backoff")) for name, kwargs in heard] == [
        ("touch", None), ("finish", None), ("touch", None), ("requeue", False)]
    assert all(isinstance(kwargs["message"], nsq.Message) for _, kwargs in heard)
    assert recorder.by_body(2) == {b"done": (FINISHED, None, False),  # requeue_delay x 1:
                                   b"again": (REQUEUED, 90.0, False)}
    reader.close().result(DEADLINE)


def test_message_is_alive_as_in_pynsq() -> None:
    reader = reader_of(lambda m: True)
    message = reader._message(core_message(Recorder(), b"x"))
    assert isinstance(message.is_alive(), bool)


# -- arguments -----------------------------------------------------------------------------------

def test_constructor_arguments_are_checked_as_pynsq_asserts_them() -> None:
    with pytest.raises(InvalidArgument, match="reconnect_interval"):
        nsq.Writer(NOWHERE, reconnect_interval="15")
    with pytest.raises(InvalidArgument, match="lookupd_poll_jitter"):
        reader_of(lambda m: True, lookupd_poll_jitter=1.5)
    with pytest.raises(InvalidArgument, match="nsqd_tcp_addresses"):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=4150)
    with pytest.raises(InvalidArgument, match="message_handler"):
        nsq.Reader("t", "c", "not callable", nsqd_tcp_addresses=NOWHERE)
    reader = nsq.Reader("t", "c", nsqd_tcp_addresses=NOWHERE)
    with pytest.raises(InvalidArgument, match="message_handler"):
        reader.set_message_handler(42)
    assert reader.message_handler is None


def test_names_addresses_and_reprs() -> None:
    reader = nsq.Reader("topic", "chan", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    assert reader.name == "topic:chan" and reader.nsqd_tcp_addresses == [NOWHERE]
    assert repr(reader) == "<smartnsq.compat.pynsq.Reader topic:chan>"
    named = nsq.Reader("topic", "chan", lambda m: True, name="mine",
                       nsqd_tcp_addresses=(NOWHERE,))
    assert named.name == "mine"
    writer = nsq.Writer(NOWHERE)
    assert writer.name == NOWHERE and writer.nsqd_tcp_addresses == [NOWHERE]
    assert repr(writer) == f"<smartnsq.compat.pynsq.Writer {NOWHERE}>"
    assert isinstance(writer.producer, sync.Producer)
    conn = pynsq_options.Conn("10.0.0.1:4150")
    assert (conn.host, conn.port, conn.id, repr(conn)) == \
        ("10.0.0.1", 4150, "10.0.0.1:4150", "<Conn 10.0.0.1:4150>")
    assert pynsq_options.Conn("sock").port == 0


def test_connection_arguments_map_to_the_core() -> None:
    options, delay = pynsq_options.connection_options({
        "user_agent": "app/1.0", "sample_rate": 10, "hostname": "worker-1",
        "output_buffer_size": 16384, "tls_v1": True})
    assert options == {"user_agent": "app/1.0", "sample_rate": 10, "hostname": "worker-1",
                       "output_buffer_size": 16384, "tls": True}
    assert delay == 90.0  # pynsq's default requeue_delay
    verified, _ = pynsq_options.connection_options({"tls_v1": True,
                                          "tls_options": {"cert_reqs": ssl.CERT_REQUIRED}})
    assert verified == {"tls": True}  # verification stays on
    no_tls = pynsq_options.connection_options({"tls_options": {"ca_certs": "/ca"}})[0]
    assert no_tls == {}  # no tls_v1
    assert pynsq_writer._body(bytearray(b"ab")) == b"ab"
    assert pynsq_writer._body(memoryview(b"cd")) == b"cd"


def test_a_failed_construction_takes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    before = loop_thread.shared_users()
    had_loop = threading.get_ident() in loops.loops
    with pytest.raises(InvalidArgument):
        nsq.Writer(NOWHERE, producer_options={"timeout": -1})
    assert loop_thread.shared_users() == before

    def no_thread() -> loop_thread.LoopThread:
        raise RuntimeError("no loop thread for you")

    monkeypatch.setattr(loop_thread, "shared", no_thread)
    with pytest.raises(RuntimeError, match="no loop thread"):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    assert (threading.get_ident() in loops.loops) is had_loop
    assert loop_thread.shared_users() == before


# -- run() and stop() ----------------------------------------------------------------------------

def test_stop_from_another_thread_ends_run() -> None:
    writer = nsq.Writer(NOWHERE)  # a user of the run() loop
    stopper = threading.Thread(target=nsq.stop)
    writer.io_loop.call_soon(stopper.start)
    watchdog = threading.Timer(DEADLINE, nsq.stop)
    watchdog.start()
    try:
        nsq.run()
    finally:
        watchdog.cancel()
    stopper.join(DEADLINE)
    assert not stopper.is_alive()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="run() installs its signal handlers on the main thread only")
def test_sigterm_ends_run() -> None:
    writer = nsq.Writer(NOWHERE)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    writer.io_loop.call_soon(signal.raise_signal, signal.SIGTERM)
    watchdog = threading.Timer(DEADLINE, nsq.stop)
    watchdog.start()
    try:
        nsq.run()
        assert signal.getsignal(signal.SIGTERM) is nsq._on_signal
    finally:
        watchdog.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_callbacks_keep_running_after_one_raises(caplog: pytest.LogCaptureFixture) -> None:
    keeper = nsq.Writer(NOWHERE)  # keeps the run() loop open once the other is closed
    writer = nsq.Writer(NOWHERE)
    writer.close()
    assert keeper.io_loop is writer.io_loop
    answers: list[Any] = []

    def broken(conn: Any, data: Any) -> None:
        raise RuntimeError("callback bug")

    def recording(conn: Any, data: Any) -> None:
        answers.append((conn, data))

    with caplog.at_level(logging.ERROR, logger="smartnsq.compat.pynsq"):
        writer.io_loop.call_soon(writer.pub, "t", b"x", broken)
        writer.io_loop.call_soon(writer.pub, "t", b"y", recording)
        run_until(lambda: bool(answers))
    conn, data = answers[0]
    assert conn is None and isinstance(data, nsq.SendError) and isinstance(data, nsq.Error)
    assert "callback bug" in caplog.text


def test_a_reader_on_a_loop_run_by_other_means_needs_a_handler(
        caplog: pytest.LogCaptureFixture) -> None:
    """run() refuses a Reader without a handler; a loop run some other way logs why the
    Reader does not consume instead of failing later."""
    reader = nsq.Reader("t", "c", nsqd_tcp_addresses=NOWHERE)
    with caplog.at_level(logging.ERROR, logger="smartnsq.compat.pynsq"):
        reader.io_loop.run_until_complete(asyncio.sleep(0))
    assert "no message_handler: not consuming" in caplog.text
    assert not reader._starting


def test_a_publish_whose_callback_cannot_run_fails_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    """A closed Writer whose run() loop is gone: the publish fails at once (its future), and
    the error is logged since its callback can never run."""
    writer = nsq.Writer(NOWHERE)
    writer.close()
    assert writer.io_loop.is_closed()  # it was the loop's last user
    called: list[Any] = []
    with caplog.at_level(logging.ERROR, logger="smartnsq.compat.pynsq"):
        future = writer.pub("t", b"x", lambda conn, data: called.append(data))
        plain = writer.mpub("t", [b"y"])
    assert isinstance(future.exception(DEADLINE), ConnectionFailed)
    assert isinstance(plain.exception(DEADLINE), ConnectionFailed)
    assert called == []
    assert "its callback cannot run" in caplog.text
    assert "mpub to 't' failed" in caplog.text


def test_finding_the_thread_loop_leaves_a_policys_own_factory_in_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer asks the policy for the thread's loop without creating one; a policy whose
    ``new_event_loop`` was replaced on the instance keeps that replacement afterwards."""
    policy = asyncio.get_event_loop_policy()
    made: list[asyncio.AbstractEventLoop] = []

    def factory() -> asyncio.AbstractEventLoop:
        loop = asyncio.SelectorEventLoop()
        made.append(loop)
        return loop

    monkeypatch.setattr(policy, "new_event_loop", factory, raising=False)
    loops.set_loop()
    assert vars(policy)["new_event_loop"] is factory
    assert made == []  # asking created nothing
