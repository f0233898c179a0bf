"""pynsq's modules and module-level names, importable as a pynsq program imports them.

A pynsq program (or its test suite) imports ``nsq.conn``, ``nsq.event``, ``nsq.protocol``...
at module level; a missing module stops it before it starts. Each of pynsq's ``__all__``
names is here with pynsq's meaning: the command builders give the wire bytes nsqd reads, the
event mixin calls listeners as pynsq's does, a message built by hand triggers pynsq's message
events, and the compression sockets inflate what the matching encoder deflated.
"""

from __future__ import annotations

import importlib
import json
import socket
import struct
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from pynsq_support import classic_nsqd

from smartnsq.compat import pynsq as nsq
from smartnsq.errors import AlreadyResponded

# pynsq 0.9.1's nsq.__all__
PYNSQ_ALL = ["Reader", "Writer", "run", "BackoffTimer", "Message", "Error", "LegacyReader",
             "SyncConn", "AsyncConn", "unpack_response", "decode_message",
             "identify", "subscribe", "ready", "finish", "touch", "requeue", "nop", "pub",
             "mpub", "valid_topic_name", "valid_channel_name",
             "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE"]

MODULES = ["conn", "event", "protocol", "message", "sync", "deflate_socket", "snappy_socket",
           "backoff_timer", "legacy_reader"]


@pytest.mark.parametrize("name", MODULES)
def test_each_pynsq_module_imports(name: str) -> None:
    module = importlib.import_module(f"smartnsq.compat.pynsq.{name}")
    assert getattr(nsq, name) is module


def test_the_names_of_pynsq_all_are_there() -> None:
    missing = [name for name in PYNSQ_ALL if not hasattr(nsq, name)]
    assert not missing
    from smartnsq.compat.pynsq import conn, event, protocol

    assert nsq.AsyncConn is conn.AsyncConn
    assert nsq.Error is protocol.Error
    assert event.MESSAGE == "message"


def test_the_command_builders_give_the_wire_bytes() -> None:
    p = nsq.protocol
    assert nsq.subscribe("t", "c") == b"SUB t c\n"
    assert nsq.ready(3) == b"RDY 3\n"
    assert nsq.finish(b"0123456789abcdef") == b"FIN 0123456789abcdef\n"
    assert nsq.finish("0123456789abcdef") == b"FIN 0123456789abcdef\n"
    assert nsq.requeue(b"0123456789abcdef", 1500) == b"REQ 0123456789abcdef 1500\n"
    assert nsq.touch(b"0123456789abcdef") == b"TOUCH 0123456789abcdef\n"
    assert nsq.nop() == b"NOP\n"
    assert nsq.pub("t", b"hi") == b"PUB t\n" + struct.pack(">I", 2) + b"hi"
    assert nsq.mpub("t", [b"a", b"bc"]) == (b"MPUB t\n" + struct.pack(">IIIcI", 15, 2, 1, b"a", 2)
                                            + b"bc")
    assert p.dpub("t", 250, b"x") == b"DPUB t 250\n" + struct.pack(">I", 1) + b"x"
    assert p.auth(b"secret") == b"AUTH\n" + struct.pack(">I", 6) + b"secret"
    head, body = nsq.identify({"client_id": "me"}).split(b"\n", 1)
    assert head == b"IDENTIFY"
    assert json.loads(body[4:]) == {"client_id": "me"}
    assert p.MAGIC_V2 == b"  V2"
    with pytest.raises(AssertionError):
        nsq.subscribe("bad topic!", "c")
    with pytest.raises(AssertionError):
        nsq.ready(-1)


def test_names_and_frames_as_pynsq_reads_them() -> None:
    assert nsq.valid_topic_name("orders#ephemeral")
    assert not nsq.valid_topic_name("bad topic!")
    assert not nsq.valid_channel_name("x" * 65)
    assert (nsq.FRAME_TYPE_RESPONSE, nsq.FRAME_TYPE_ERROR, nsq.FRAME_TYPE_MESSAGE) == (0, 1, 2)
    assert nsq.unpack_response(struct.pack(">I", 0) + b"OK") == (0, b"OK")
    data = struct.pack(">QH", 123, 2) + b"0123456789abcdef" + b"body"
    message = nsq.decode_message(data)
    assert isinstance(message, nsq.Message)
    assert (message.id, message.body, message.timestamp, message.attempts) == \
        (b"0123456789abcdef", b"body", 123, 2)


def test_errors_are_pynsq_errors() -> None:
    p = nsq.protocol
    assert issubclass(p.SendError, nsq.Error)
    assert issubclass(p.ConnectionClosedError, nsq.Error)
    assert issubclass(p.IntegrityError, nsq.Error)
    cause = OSError("reset")
    error = p.SendError("failed to send", cause)
    assert (error.msg, error.error) == ("failed to send", cause)


def test_the_event_mixin_calls_listeners_as_pynsq_does() -> None:
    event = nsq.event
    heard: list[tuple[str, dict[str, Any]]] = []

    def one(**kwargs: Any) -> None:
        heard.append(("one", kwargs))

    def two(**kwargs: Any) -> None:
        heard.append(("two", kwargs))

    evented = event.EventedMixin()
    evented.on(event.READY, one)
    evented.on(event.READY, two)
    with pytest.raises(event.DuplicateListenerError):
        evented.on(event.READY, one)
    with pytest.raises(AssertionError):
        evented.on(event.READY, "not callable")  # type: ignore[arg-type]
    evented.trigger(event.READY, conn="c")
    evented.off(event.READY, one)
    with pytest.raises(event.InvalidListenerError):
        evented.off(event.READY, one)
    evented.trigger(event.READY, conn="d")
    assert heard == [("one", {"conn": "c"}), ("two", {"conn": "c"}), ("two", {"conn": "d"})]
    names = {"CONNECT", "CLOSE", "DATA", "ERROR", "IDENTIFY", "READY", "RESPONSE", "MESSAGE",
             "HEARTBEAT", "BACKOFF", "CONTINUE", "RESUME", "REQUEUE", "TOUCH", "FINISH",
             "AUTH", "AUTH_RESPONSE", "IDENTIFY_RESPONSE"}
    assert {getattr(event, n) for n in names} == {n.lower() for n in names}


def test_a_message_built_by_hand_triggers_its_events() -> None:
    heard: list[tuple[str, dict[str, Any]]] = []
    message = nsq.Message(b"0123456789abcdef", b"body", 7, 1)
    assert (message.id, message.body, message.timestamp, message.attempts) == \
        (b"0123456789abcdef", b"body", 7, 1)
    for name in (nsq.event.FINISH, nsq.event.REQUEUE, nsq.event.TOUCH):
        message.on(name, lambda name=name, **kwargs: heard.append((name, kwargs)))
    message.touch()
    message.requeue(backoff=False, delay=3)
    assert message.has_responded()
    with pytest.raises(AlreadyResponded):  # pynsq asserts; see docs/migration-pynsq.md
        message.finish()
    other = nsq.Message(b"fedcba9876543210", b"b", 7, 1)
    other.on(nsq.event.FINISH, lambda **kwargs: heard.append(("finish", kwargs)))
    other.finish()
    assert heard == [("touch", {"message": message}),
                     ("requeue", {"message": message, "backoff": False, "delay": 3}),
                     ("finish", {"message": other})]


def test_backoff_timer_as_pynsq_computes_it() -> None:
    timer = nsq.BackoffTimer(0, 10)
    assert timer.get_interval() == 0
    timer.failure()
    assert timer.get_interval() == pytest.approx(0.25 + 0.03)
    for _ in range(1000):
        timer.failure()
    assert timer.get_interval() == pytest.approx(10)
    timer.success()
    assert timer.get_interval() == pytest.approx(10 - 0.28)
    for _ in range(1000):
        timer.success()
    assert timer.get_interval() == 0
    with pytest.raises(AssertionError):
        nsq.BackoffTimer("0", 10)  # type: ignore[arg-type]


def test_the_compression_sockets_inflate_what_their_encoders_deflate() -> None:
    left, right = socket.socketpair()
    try:
        encoder = nsq.deflate_socket.DeflateEncoder(level=6)
        wrapped = nsq.deflate_socket.DeflateSocket(right, 6)
        left.sendall(encoder.encode(b"hello ") + encoder.encode(b"world"))
        received = b""
        while len(received) < 11:
            received += wrapped.recv(4096)
        assert received == b"hello world"
        assert wrapped.fileno() == right.fileno()  # the rest is the socket's

        s_encoder = nsq.snappy_socket.SnappyEncoder()
        s_wrapped = nsq.snappy_socket.SnappySocket(right)
        left.sendall(s_encoder.encode(b"snappy bytes"))
        received = b""
        while len(received) < 12:
            received += s_wrapped.recv(4096)
        assert received == b"snappy bytes"
    finally:
        left.close()
        right.close()


def test_a_deflate_socket_bootstraps_from_bytes_read_before_the_switch() -> None:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    early = compressor.compress(b"early") + compressor.flush(zlib.Z_SYNC_FLUSH)
    left, right = socket.socketpair()
    try:
        wrapped = nsq.deflate_socket.DeflateSocket(right, 6)
        wrapped.bootstrap(early)
        assert wrapped.recv(4096) == b"early"
    finally:
        left.close()
        right.close()


def test_legacy_reader_builds_one_reader_per_task() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        legacy = nsq.LegacyReader(all_tasks={"a": lambda m: True, "b": lambda m: True},
                                  topic="t", channel="c",
                                  nsqd_tcp_addresses=["127.0.0.1:1"])
    assert [w.category for w in caught] == [DeprecationWarning]
    assert sorted(r.channel for r in legacy.readers) == ["c.a", "c.b"]
    assert all(isinstance(r, nsq.Reader) for r in legacy.readers)


@pytest.fixture(scope="module")
def nsqd() -> Iterator[str]:
    """A classic dev nsqd with the topic ``s`` (channel ``c``)."""
    with classic_nsqd("sync-conn-devcluster", "s") as cluster:
        yield cluster.nsqd_tcp_addresses[0]


def test_sync_conn_publishes_and_reads_the_answer(nsqd: str) -> None:
    host, port = nsqd.rsplit(":", 1)
    conn = nsq.SyncConn(timeout=5.0)
    conn.connect(host, int(port))
    try:
        conn.send(nsq.pub("s", b"sync"))
        assert nsq.unpack_response(conn.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
        conn.send(nsq.subscribe("s", "c"))
        assert nsq.unpack_response(conn.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
        conn.send(nsq.ready(1))
        frame, data = nsq.unpack_response(conn.read_response())
        assert frame == nsq.FRAME_TYPE_MESSAGE
        assert nsq.decode_message(data).body == b"sync"
    finally:
        conn.s.close()


def test_a_second_answer_is_an_assertion_error_as_in_pynsq() -> None:
    """pynsq asserts that a message is answered once (``assert not self._has_responded``):
    code catching ``AssertionError`` keeps working, and smartnsq's ``AlreadyResponded``
    still names what happened."""
    from smartnsq.errors import AlreadyResponded

    message = nsq.Message(b"0123456789abcdef", b"b", 0, 1)
    message.finish()
    for again in (message.finish, message.requeue):
        with pytest.raises(AssertionError) as info:
            again()
        assert isinstance(info.value, AlreadyResponded)
