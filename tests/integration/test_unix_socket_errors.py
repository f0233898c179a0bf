"""What goes wrong on a unix socket, and what the client says: every error names the path.

Loopback only: the sockets are in a temporary folder of the test; the peers are small asyncio
servers of the test's own (one that never answers, one that only counts who connected), or
nothing at all (a path with no listener, a socket file a crashed server left behind).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.config import ConnectionConfig
from smartnsq.errors import ConnectionFailed, InvalidArgument, Timeout
from smartnsq.model.routes import UNIX_PATH_MAX
from smartnsq.transport.connection import Connection


@pytest.fixture
def folder() -> Iterator[Path]:
    """A short folder: pytest's own can be deeper than sun_path's 107 bytes allow."""
    path = Path(tempfile.mkdtemp(prefix="sn-unix-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class _Listener:
    """A unix server that accepts and stays silent, counting its connections."""

    def __init__(self) -> None:
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)


@pytest.fixture
async def silent(folder: Path) -> AsyncIterator[tuple[str, _Listener]]:
    listener = _Listener()
    path = str(folder / "silent.sock")
    server = await asyncio.start_unix_server(listener.handle, path)
    try:
        yield path, listener
    finally:
        server.close()
        for writer in listener.writers:
            writer.close()
        await server.wait_closed()


async def test_no_listener_at_the_path(folder: Path) -> None:
    path = str(folder / "missing.sock")
    with pytest.raises(ConnectionFailed) as raised:
        async with bounded(2):
            await Connection.connect(path, 0)
    assert f"unix:{path}" in str(raised.value)
    assert isinstance(raised.value.__cause__, FileNotFoundError)


async def test_a_socket_file_left_behind_refuses(folder: Path) -> None:
    path = str(folder / "stale.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # bound, never listening, closed: what a killed server leaves
    stale.close()
    with pytest.raises(ConnectionFailed) as raised:
        async with bounded(2):
            await Connection.connect(path, 0)
    assert f"unix:{path}" in str(raised.value)
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)


async def test_the_handshake_deadline_holds_on_a_socket(silent: tuple[str, _Listener]) -> None:
    path, listener = silent
    with pytest.raises(Timeout, match=f"unix:{path}"):
        async with bounded(0.3 + 1):
            await Connection.connect(path, 0, ConnectionConfig(connect_timeout=0.3))
    assert listener.accepted == 1


async def test_tls_to_a_socket_needs_the_certificates_name_before_connecting(
        silent: tuple[str, _Listener]) -> None:
    path, listener = silent
    with pytest.raises(InvalidArgument, match="tls_server_hostname"):
        await Connection.connect(path, 0, ConnectionConfig(tls=True))
    async with Producer(nsqd=path, tls=True) as producer:
        with pytest.raises(InvalidArgument, match="tls_server_hostname"):
            async with bounded(5):  # refused at once: retrying cannot name the certificate
                await producer.publish(fresh_name("t"), b"x", timeout=5)
    assert listener.accepted == 0


@pytest.mark.parametrize("make", [
    lambda nsqd: Producer(nsqd=nsqd),
    lambda nsqd: Consumer("t", "c", nsqd=nsqd, handler=lambda m: None),
], ids=["Producer", "Consumer"])
def test_a_path_too_long_for_sun_path_fails_where_it_is_given(make: Any) -> None:
    with pytest.raises(InvalidArgument, match=f"at most {UNIX_PATH_MAX} bytes") as raised:
        make("/tmp/" + "d" * UNIX_PATH_MAX + ".sock")
    assert raised.value.field == "nsqd"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets: Linux")
async def test_an_abstract_socket_is_reached_by_its_at_name() -> None:
    listener = _Listener()
    name = f"smartnsq-test-{os.getpid()}-{fresh_name('abstract')}"
    server = await asyncio.start_unix_server(listener.handle, "\0" + name)
    try:
        with pytest.raises(Timeout, match=f"unix:@{name}"):  # reached: it never answers
            async with bounded(0.3 + 1):
                await Connection.connect(f"@{name}", 0, ConnectionConfig(connect_timeout=0.3))
        assert listener.accepted == 1
    finally:
        server.close()
        for writer in listener.writers:
            writer.close()
        await server.wait_closed()
