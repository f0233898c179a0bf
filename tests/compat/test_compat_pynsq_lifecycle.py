"""The pynsq layer's resources: the shared loop thread, run() loops, failures at construction.

No cluster: these Readers/Writers point at a closed port and are never run, or run briefly.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

import smartnsq.compat.pynsq_loops as loops
from smartnsq.compat import pynsq as nsq
from smartnsq.compat.pynsq import options as pynsq_options
from smartnsq.errors import ConnectionFailed, InvalidArgument
from smartnsq.transport import loop_thread
from smartnsq.transport.loop_thread import LoopThread

NOWHERE = "127.0.0.1:1"  # nothing listens there: connecting fails, retried in the background


def users() -> int:
    return loop_thread.shared_users()


def test_close_gives_the_loop_thread_back_before_its_future_completes() -> None:
    before = users()
    reader = nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    assert users() == before + 1
    reader.close().result(10)
    assert users() == before
    reader.close().result(10)  # idempotent: nothing released twice
    assert users() == before


def test_a_reader_dropped_unclosed_is_kept_until_closed(pynsq_objects: list[Any]) -> None:
    """As pynsq's IOLoop does, the layer keeps an open Reader nobody references (a pynsq
    program may build one without keeping it, then call run()); close() lets it go and gives
    the loop thread back, then the Reader can be collected."""
    before = users()
    nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    reader = weakref.ref(pynsq_objects.pop())  # the fixture would keep it alive (and close it)
    gc.collect()
    kept = reader()
    assert kept is not None, "an open Reader was garbage-collected"
    assert users() == before + 1
    kept.close().result(10)
    del kept
    gc.collect()
    assert reader() is None
    assert users() == before


def test_bad_arguments_raise_at_construction_and_take_nothing() -> None:
    before = users()
    for topic, channel in (("bad topic!", "c"), ("t", "bad channel!"), ("", "c"), ("t", None)):
        with pytest.raises(InvalidArgument):
            nsq.Reader(topic, channel, lambda m: True, nsqd_tcp_addresses=NOWHERE)
    # arguments the Consumer checks (pynsq raises on its bad arguments the same way)
    with pytest.raises(InvalidArgument):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE,
                   consumer_options={"ordered": "yes"})
    with pytest.raises(InvalidArgument):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses="no-port")
    with pytest.raises(InvalidArgument):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE,
                   low_rdy_idle_timeout=0)
    assert users() == before


def test_run_refuses_a_reader_without_handler() -> None:
    reader = nsq.Reader("t", "c", nsqd_tcp_addresses=NOWHERE)
    watchdog = threading.Timer(10.0, nsq.stop)  # run() once blocked here
    watchdog.start()
    try:
        with pytest.raises(InvalidArgument, match="message_handler"):
            nsq.run()
    finally:
        watchdog.cancel()
    reader.set_message_handler(lambda m: True)
    assert reader._has_handler()

    class Overriding(nsq.Reader):
        def process_message(self, message: nsq.Message) -> bool:
            return True

    assert Overriding("t", "c", nsqd_tcp_addresses=NOWHERE)._has_handler()


def test_publishes_fail_instead_of_hanging_once_nothing_runs_them() -> None:
    thread = LoopThread("writer-test").start()
    stopped = nsq.Writer(NOWHERE, producer_options={"loop_thread": thread})
    thread.stop()  # the network loop is gone: a publish handed to it would never run
    closed = nsq.Writer(NOWHERE)
    closed.close()
    for writer in (stopped, closed):
        for future in (writer.pub("t", b"x"), writer.mpub("t", [b"x", b"y"]),
                       writer.dpub("t", 5, b"x")):
            assert isinstance(future.exception(5), ConnectionFailed)
    stopped.close()


def test_a_failed_publish_still_calls_back_with_an_error() -> None:
    writer = nsq.Writer(NOWHERE)
    answers: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(conn: Any, data: Any) -> None:
        answers.append((conn, data))
        done.set()
        nsq.stop()

    def close_then_publish() -> None:  # on the run() thread, as pynsq apps do
        writer.close()
        writer.pub("t", b"x", callback)

    writer.io_loop.call_soon(close_then_publish)
    watchdog = threading.Timer(10.0, nsq.stop)
    watchdog.start()
    try:
        nsq.run()
    finally:
        watchdog.cancel()
    assert done.is_set()
    conn, data = answers[0]
    assert conn is None and isinstance(data, nsq.Error)
    assert isinstance(data.error, ConnectionFailed)


def test_stats_and_starvation_are_read_on_the_network_loop() -> None:
    reader = nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    consumer = reader._consumers[0]
    where: list[bool] = []

    def stats() -> dict[str, Any]:
        where.append(reader._thread.in_loop_thread())
        return {"topic": "t"}

    def is_starved() -> bool:
        where.append(reader._thread.in_loop_thread())
        return False

    consumer.stats = stats  # type: ignore[method-assign]
    consumer.is_starved = is_starved  # type: ignore[method-assign]
    assert reader.stats() == [{"topic": "t"}]
    assert reader.is_starved() is False
    assert where == [True, True]  # where the consumer's state changes: no torn reads
    reader.close().result(10)


def test_the_run_loop_is_cleaned_up_with_its_last_user() -> None:
    def scenario() -> None:
        before = loops.set_loop()
        writer = nsq.Writer(NOWHERE)
        reader = nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
        loop = writer.io_loop
        assert reader.io_loop is loop and threading.get_ident() in loops.loops
        loop.call_soon(nsq.stop)
        nsq.run()
        writer.close()
        assert threading.get_ident() in loops.loops  # the Reader still uses it
        reader.close().result(10)
        assert threading.get_ident() not in loops.loops
        expected = before if before is not None and not before.is_closed() else None
        assert loops.set_loop() is expected  # ours is not left set as the thread's loop
        if before is None:
            assert loop.is_closed()  # it was ours

    scenario()  # on the main thread (pytest's)
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            scenario()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(30)
    assert not errors, errors[0]


def test_lookupd_addresses_are_normalised_by_the_core() -> None:
    # https:// keeps its scheme: the lookupd is asked over TLS, not as plain http
    assert pynsq_options.lookupd_addresses(["http://h:4161/", " h:4161 ", "https://h:4161"]) == \
        ["h:4161", "h:4161", "https://h:4161"]
    for bad in ("http://nohost", "h:port", "h:0"):
        with pytest.raises(InvalidArgument):
            nsq.Writer(lookupd_http_addresses=bad)
        with pytest.raises(InvalidArgument):
            nsq.Reader("t", "c", lambda m: True, lookupd_http_addresses=[bad])
