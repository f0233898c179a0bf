"""pynsq's ``Reader.heartbeat(conn)`` hook, and its constructors' ``AssertionError``.

pynsq calls ``heartbeat(conn)`` on its IOLoop for each heartbeat a connection receives (its
documented hook for liveness monitoring); the heartbeats are the server's, so that test also
runs on the real classic nsqd (``-m real``). pynsq's constructors check their arguments with
``assert``: a program catching ``AssertionError`` must keep working, and one catching
smartnsq's ``InvalidArgument`` (or ``ValueError``) too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smartnsq.compat import pynsq as nsq
from smartnsq.devcluster import DevCluster
from smartnsq.errors import InvalidArgument, InvalidArgumentAssertion
from smartnsq.transport.loop_thread import LoopThread

DEADLINE = 20.0
NOWHERE = "127.0.0.1:1"


@pytest.fixture(params=["dev", pytest.param("real", marks=pytest.mark.real)])
def classic_nsqd(request: pytest.FixtureRequest) -> Iterator[str]:
    """A classic nsqd (the dev cluster's, or the real one) with topic ``hb``, channel ``c``."""
    cluster: Any
    if request.param == "real":
        from smartnsq.testing.realcluster import ENV, RealCluster

        if not os.environ.get(ENV):
            pytest.skip(f"real NSQ servers: set {ENV} to the folder of their binaries")
        cluster = RealCluster(nodes=1, lookupds=1, mode="classic")
    else:
        cluster = DevCluster(nodes=1, lookupds=1, mode="classic")
    thread = LoopThread("hooks-cluster").start()
    try:
        thread.run(cluster.start())
        try:
            thread.run(cluster.create_topic("hb", channels=["c"]))
            yield cluster.nsqd_tcp_addresses[0]
        finally:
            thread.run(cluster.stop())
    finally:
        thread.stop()


def run_until(done: threading.Event) -> None:
    watchdog = threading.Timer(DEADLINE, nsq.stop)
    watchdog.start()
    try:
        nsq.run()
    finally:
        watchdog.cancel()
    assert done.is_set(), "the watchdog stopped run()"


def test_heartbeat_is_called_with_the_connection_on_the_run_thread(classic_nsqd: str) -> None:
    beats: list[tuple[str, str, int, int]] = []
    done = threading.Event()

    class Monitored(nsq.Reader):
        def heartbeat(self, conn: Any) -> None:
            beats.append((conn.id, conn.host, conn.port, threading.get_ident()))
            if len(beats) == 2:
                done.set()
                nsq.stop()

    reader = Monitored("hb", "c", lambda m: True, nsqd_tcp_addresses=classic_nsqd,
                       heartbeat_interval=1)
    run_until(done)
    host, _, port = classic_nsqd.rpartition(":")
    assert beats[:2] == [(classic_nsqd, host, int(port), threading.get_ident())] * 2
    reader.close().result(DEADLINE)


def test_a_raising_heartbeat_hook_is_logged_and_called_again(
        classic_nsqd: str, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    done = threading.Event()

    class Broken(nsq.Reader):
        def heartbeat(self, conn: Any) -> None:
            calls.append(1)
            if len(calls) == 2:
                done.set()
                nsq.stop()
            raise RuntimeError("monitoring is down")

    reader = Broken("hb", "c", lambda m: True, nsqd_tcp_addresses=classic_nsqd,
                    heartbeat_interval=1)
    run_until(done)
    assert "monitoring is down" in caplog.text
    reader.close().result(DEADLINE)


# -- the constructors' errors ---------------------------------------------------------------

BAD: list[tuple[str, Callable[[], Any]]] = [
    ("topic", lambda: nsq.Reader("bad topic!", "c", lambda m: True,
                                 nsqd_tcp_addresses=NOWHERE)),
    ("channel", lambda: nsq.Reader("t", "", lambda m: True, nsqd_tcp_addresses=NOWHERE)),
    ("no address", lambda: nsq.Reader("t", "c", lambda m: True)),
    ("max_in_flight", lambda: nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE,
                                         max_in_flight=-1)),
    ("jitter", lambda: nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE,
                                  lookupd_poll_jitter=2.0)),
    ("unknown keyword", lambda: nsq.Reader("t", "c", lambda m: True,
                                           nsqd_tcp_addresses=NOWHERE, bogus=1)),
    ("handler", lambda: nsq.Reader("t", "c", 42, nsqd_tcp_addresses=NOWHERE)),
    ("address", lambda: nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses="no-port")),
    ("lookupd", lambda: nsq.Reader("t", "c", lambda m: True,
                                   lookupd_http_addresses=["http://nohost"])),
    ("connection option", lambda: nsq.Reader("t", "c", lambda m: True,
                                             nsqd_tcp_addresses=NOWHERE,
                                             heartbeat_interval=100)),
    ("writer without address", lambda: nsq.Writer()),
    ("writer reconnect_interval", lambda: nsq.Writer(NOWHERE, reconnect_interval="15")),
    ("writer option", lambda: nsq.Writer(NOWHERE, snappy=True, deflate=True)),
    ("writer producer option", lambda: nsq.Writer(NOWHERE, producer_options={"timeout": -1})),
]


@pytest.mark.parametrize("build", [b for _, b in BAD], ids=[name for name, _ in BAD])
def test_bad_constructor_arguments_raise_what_pynsq_and_smartnsq_callers_catch(
        build: Callable[[], Any]) -> None:
    with pytest.raises(AssertionError) as raised:
        build()
    error = raised.value
    assert isinstance(error, InvalidArgument) and isinstance(error, ValueError)
    assert isinstance(error, InvalidArgumentAssertion)
    assert error.field and error.rule and str(error).startswith(f"invalid {error.field}")


def test_bad_arguments_to_the_setters_and_run_raise_it_too() -> None:
    reader = nsq.Reader("t", "c", nsqd_tcp_addresses=NOWHERE)
    with pytest.raises(InvalidArgumentAssertion, match="message_handler"):
        reader.set_message_handler("not callable")
    with pytest.raises(InvalidArgumentAssertion, match="max_in_flight"):
        reader.set_max_in_flight(-1)
    watchdog = threading.Timer(DEADLINE, nsq.stop)
    watchdog.start()
    try:
        with pytest.raises(InvalidArgumentAssertion, match="message_handler"):
            nsq.run()  # a Reader without a handler
    finally:
        watchdog.cancel()
    reader.close().result(DEADLINE)


def test_the_error_keeps_the_original_traceback() -> None:
    """Raised where the argument was refused (the check's frame is in its traceback)."""
    with pytest.raises(InvalidArgumentAssertion) as raised:
        nsq.Reader("bad topic!", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    assert any(entry.name == "check_topic" for entry in raised.traceback)


# -- Message.is_alive() -------------------------------------------------------------------------

def test_is_alive_says_whether_the_message_timed_out_as_pynsq_documents() -> None:
    """pynsq: "whether or not this message is timed out based on the msg_timeout parameter"
    (and it returns its ``timed_out`` flag): False while the server still waits for the
    answer, True once msg_timeout passed since delivery or the last touch(), False once
    answered. Time is passed in: no clock is waited for."""
    from smartnsq.message import PENDING
    from smartnsq.message import Message as CoreMessage

    class Responder:
        topic, channel, node, ordered, dead = "t", "c", NOWHERE, False, False

        def answer(self, message: CoreMessage, state: int, delay: float | None,
                   backoff: bool) -> None:
            message._state = state

        settle = answer

        def touch(self, message: CoreMessage) -> None:
            pass

    reader = nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE, msg_timeout=30)
    core = CoreMessage(1, 1, b"0123456789abcdef", b"x")
    core._responder = Responder()  # type: ignore[assignment]
    core._state = PENDING
    core._auto = False
    message = reader._message(core)
    delivered = message._since
    assert message.is_alive() is False  # just delivered
    assert message._timed_out(delivered + 29.9) is False
    assert message._timed_out(delivered + 30.0) is True  # the server's 30 s passed
    message.touch()
    assert message._since >= delivered
    assert message._timed_out(message._since + 29.9) is False  # touch() restarted the timer
    message.finish()
    assert message._timed_out(message._since + 3600) is False  # answered: nothing times out
    reader.close().result(DEADLINE)
