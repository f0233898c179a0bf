"""``nsq.conn.AsyncConn``: pynsq's low-level connection, its documented events, on its loop.

A program written against pynsq's ``AsyncConn`` listens to events (``identify_response``,
``ready``, ``message``, ``heartbeat``, ``response``, ``error``, ``close``...), sends the
commands ``nsq.protocol`` builds and answers messages through them; every event runs on the
loop that was current when the connection was built. Here such a program runs against a
classic dev nsqd, through ``nsq.run()`` on a thread of its own and inside a tornado
``AsyncTestCase``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pynsq_support import DEADLINE, classic_nsqd, in_thread

from smartnsq.compat import pynsq as nsq
from smartnsq.compat.pynsq import event


@pytest.fixture(scope="module")
def nsqd() -> Iterator[str]:
    """A classic dev nsqd with the topics ``a1``, ``a2``, ``a3`` (channel ``c``)."""
    with classic_nsqd("asyncconn-devcluster", "a1", "a2", "a3") as cluster:
        yield cluster.nsqd_tcp_addresses[0]


@pytest.fixture
def nsqd_on_class(request: pytest.FixtureRequest, nsqd: str) -> None:
    request.cls.nsqd = nsqd


def address(nsqd: str) -> tuple[str, int]:
    host, port = nsqd.rsplit(":", 1)
    return host, int(port)


def test_a_pynsq_program_on_async_conn_sees_the_documented_events(nsqd: str) -> None:
    seen: list[str] = []
    details: dict[str, Any] = {}

    def scenario() -> None:
        host, port = address(nsqd)
        conn = nsq.conn.AsyncConn(host, port, heartbeat_interval=1, user_agent="test/1")
        loop = asyncio.get_event_loop()
        responses: list[bytes] = []

        def record(name: str) -> Callable[..., None]:
            def listener(**kwargs: Any) -> None:
                assert asyncio.get_running_loop() is loop  # on the loop it was built on
                seen.append(name)
            return listener

        for name in (event.CONNECT, event.IDENTIFY, event.READY, event.HEARTBEAT,
                     event.RESUME, event.CLOSE):
            conn.on(name, record(name))

        def on_identify_response(conn: Any, data: dict[str, Any], **kwargs: Any) -> None:
            seen.append(event.IDENTIFY_RESPONSE)
            details["max_rdy_count"] = data.get("max_rdy_count")

        def on_ready(conn: Any, **kwargs: Any) -> None:
            conn.send(nsq.pub("a1", b"hello"))
            conn.send(nsq.subscribe("a1", "c"))

        def on_response(conn: Any, data: bytes, **kwargs: Any) -> None:
            responses.append(data)
            seen.append(event.RESPONSE)
            if len(responses) == 3:  # IDENTIFY's answer, PUB's OK, then SUB's
                assert conn.send_rdy(1) is True

        def on_message(conn: Any, message: nsq.Message, **kwargs: Any) -> None:
            seen.append(event.MESSAGE)
            details["body"] = message.body
            details["in_flight"] = conn.in_flight
            message.finish()
            conn.send(nsq.finish(message.id))  # a second FIN: nsqd answers E_FIN_FAILED

        def on_error(conn: Any, error: Exception, **kwargs: Any) -> None:
            seen.append(event.ERROR)
            details.setdefault("errors", []).append(error)

        def on_heartbeat(conn: Any, **kwargs: Any) -> None:
            if event.ERROR in seen:
                conn.close()

        def on_close(conn: Any, **kwargs: Any) -> None:
            details["closed"] = conn.closed()
            nsq.stop()

        conn.on(event.IDENTIFY_RESPONSE, on_identify_response)
        conn.on(event.READY, on_ready)
        conn.on(event.RESPONSE, on_response)
        conn.on(event.MESSAGE, on_message)
        conn.on(event.ERROR, on_error)
        conn.on(event.HEARTBEAT, on_heartbeat)
        conn.on(event.CLOSE, on_close)
        assert conn.id == nsqd and str(conn) == nsqd
        assert not conn.connected()
        conn.connect()
        assert conn.connecting()
        loop.call_later(DEADLINE, nsq.stop)  # a bound, not a wait: the test fails if it hits
        nsq.run()
        assert json.loads(responses[0])["max_rdy_count"] == details["max_rdy_count"]
        assert responses[1:3] == [b"OK", b"OK"]

    in_thread(scenario)
    # pynsq's order (the IDENTIFY answer is a response too, before identify_response)
    assert seen[:7] == [event.CONNECT, event.IDENTIFY, event.RESPONSE, event.IDENTIFY_RESPONSE,
                        event.READY, event.RESPONSE, event.RESPONSE]
    assert seen.index(event.MESSAGE) < seen.index(event.RESUME) < seen.index(event.ERROR)
    assert event.HEARTBEAT in seen
    assert seen[-2:] == [event.ERROR, event.CLOSE]  # the stream's end, as pynsq reports it
    assert details["body"] == b"hello" and details["in_flight"] == 1
    assert details["max_rdy_count"] > 0
    fin_failed, closed = details["errors"]
    assert isinstance(fin_failed, nsq.Error) and "E_FIN_FAILED" in str(fin_failed)
    assert isinstance(closed, nsq.protocol.ConnectionClosedError)
    assert details["closed"] is True


def test_a_refused_connection_is_logged_and_closed(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, Any]] = []

    def scenario() -> None:
        with socket_closed_port() as port:
            conn = nsq.AsyncConn("127.0.0.1", port, timeout=2.0)
        conn.on(event.ERROR, lambda conn, error, **kw: seen.append(("error", error)))

        def on_close(conn: Any, **kwargs: Any) -> None:
            seen.append(("close", None))
            nsq.stop()

        conn.on(event.CLOSE, on_close)
        conn.connect()
        asyncio.get_event_loop().call_later(DEADLINE, nsq.stop)
        nsq.run()

    with caplog.at_level(logging.WARNING, logger="smartnsq.compat.pynsq"):
        in_thread(scenario)
    assert [name for name, _ in seen] == ["close"]  # as pynsq: no error event
    assert any("cannot connect" in r.getMessage() for r in caplog.records)


class socket_closed_port:
    """A loopback port that was just bound and closed: nothing listens there."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


def test_async_conn_checks_its_arguments_as_pynsq_asserts_them() -> None:
    with pytest.raises(AssertionError):
        nsq.AsyncConn("127.0.0.1", "4150")  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        nsq.AsyncConn("127.0.0.1", 4150, heartbeat_interval=0)
    with pytest.raises(AssertionError):
        nsq.AsyncConn("127.0.0.1", 4150, sample_rate=100)


tornado_testing = pytest.importorskip("tornado.testing")


@pytest.mark.usefixtures("nsqd_on_class")
class AsyncConnTestCase(tornado_testing.AsyncTestCase):  # type: ignore[misc, name-defined]
    """A tornado application's test of its own AsyncConn code: the connection built in
    ``setUp`` (the test case's loop current, not running yet), its events on that loop."""

    nsqd: str

    def setUp(self) -> None:
        super().setUp()
        loop = self.io_loop.asyncio_loop
        self.ready: asyncio.Future[Any] = loop.create_future()
        self.response: asyncio.Future[bytes] = loop.create_future()
        self.closed: asyncio.Future[Any] = loop.create_future()
        host, port = address(self.nsqd)
        self.conn = nsq.conn.AsyncConn(host, port)
        self.conn.on(event.READY, lambda conn, **kw: self.ready.set_result(
            asyncio.get_running_loop()))
        self.responses: list[bytes] = []
        self.conn.on(event.RESPONSE, self.on_response)
        self.conn.on(event.CLOSE, lambda conn, **kw: self.closed.set_result(True))

    def on_response(self, conn: Any, data: bytes, **kwargs: Any) -> None:
        self.responses.append(data)
        if len(self.responses) == 2:  # the IDENTIFY answer, then the PUB's
            self.response.set_result(data)

    def tearDown(self) -> None:
        if not self.conn.closed():  # the test failed half-way: close before the loop goes
            self.conn.close()
            self.io_loop.run_sync(lambda: asyncio.wait_for(asyncio.shield(self.closed),
                                                           DEADLINE))
        super().tearDown()

    @tornado_testing.gen_test(timeout=DEADLINE)  # type: ignore[untyped-decorator]
    async def test_events_run_on_the_test_cases_loop(self) -> None:
        self.conn.connect()
        assert await self.ready is self.io_loop.asyncio_loop
        self.conn.send(nsq.pub("a2", b"tornado"))
        assert await self.response == b"OK"
        self.conn.close()
        assert await self.closed is True


def events_of_a_program(nsq_module: Any, host: str, port: int,
                        stop: Callable[[], None]) -> list[str]:
    """The events a pynsq program on ``AsyncConn`` sees, in order: publish, subscribe, take
    a message, FIN it twice (the second is refused), close at the next heartbeat."""
    ev = nsq_module.event
    seen: list[str] = []
    responses: list[bytes] = []
    conn = nsq_module.conn.AsyncConn(host, port, heartbeat_interval=1)
    for name in (ev.CONNECT, ev.IDENTIFY, ev.IDENTIFY_RESPONSE, ev.READY, ev.HEARTBEAT,
                 ev.RESUME, ev.RESPONSE, ev.MESSAGE, ev.ERROR, ev.CLOSE):
        conn.on(name, lambda name=name, **kwargs: seen.append(name))

    def on_ready(conn: Any, **kwargs: Any) -> None:
        conn.send(nsq_module.pub("a3", b"same"))
        conn.send(nsq_module.subscribe("a3", "c"))

    def on_response(conn: Any, data: bytes, **kwargs: Any) -> None:
        responses.append(data)
        if len(responses) == 3:
            conn.send_rdy(1)

    def on_message(conn: Any, message: Any, **kwargs: Any) -> None:
        message.finish()
        conn.send(nsq_module.finish(message.id))

    def on_heartbeat(conn: Any, **kwargs: Any) -> None:
        if ev.ERROR in seen and not conn.closed():
            conn.close()

    conn.on(ev.READY, on_ready)
    conn.on(ev.RESPONSE, on_response)
    conn.on(ev.MESSAGE, on_message)
    conn.on(ev.HEARTBEAT, on_heartbeat)
    conn.on(ev.CLOSE, lambda **kwargs: stop())
    conn.connect()
    return seen


def test_the_events_come_as_pynsq_triggers_them(nsqd: str) -> None:
    """The same program on pynsq itself (when installed) and here: the same events, in the
    same order."""
    pynsq = pytest.importorskip("nsq")
    importlib.import_module("nsq.conn")
    ioloop = pytest.importorskip("tornado.ioloop")
    host, port = address(nsqd)
    runs: dict[str, list[str]] = {}

    def on_pynsq() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = ioloop.IOLoop.current()
        try:
            runs["pynsq"] = events_of_a_program(pynsq, host, port, loop.stop)
            loop.call_later(DEADLINE, loop.stop)
            loop.start()
        finally:
            loop.close(all_fds=True)
            asyncio.set_event_loop(None)

    def on_compat() -> None:
        runs["compat"] = events_of_a_program(nsq, host, port, nsq.stop)
        asyncio.get_event_loop().call_later(DEADLINE, nsq.stop)
        nsq.run()

    in_thread(on_pynsq)
    in_thread(on_compat)
    assert runs["pynsq"][-1] == "close"  # the program ran to its end on pynsq
    assert runs["compat"] == runs["pynsq"]
