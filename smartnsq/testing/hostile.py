"""Hostile peers: tiny loopback servers that misbehave on purpose, for tests.

The dev cluster is a faithful nsqd/nsqlookupd; these are not. Each one does the single unkind
thing a broken or malicious peer can do to a client (``docs/hostile-peers.md``
lists them), so a test can show the client survives it:

* :class:`DripLookupd` answers a valid lookup one byte at a time (by default one per second):
  no single read ever times out, only a deadline on the whole request bounds it;
* :class:`SilentLookupd` accepts and reads the request, then never answers;
* :class:`HugeLookupd` answers with a body of ``size`` bytes (hundreds of MiB by default),
  streamed, so the server itself stays small;
* :class:`PartitionsLookupd` answers a well-formed youzan lookup listing ``count`` partitions
  (10^5 by default), each led by its own loopback "node";
* :class:`FakeLookupd` answers properly (optionally over TLS): the healthy neighbour in a
  test, or an ``https://`` lookupd;
* :class:`SilentNsqd` accepts a connection and never writes a byte;
* :class:`DeflatingNsqd` answers IDENTIFY with ``deflate: true`` whatever the client asked,
  then (``bomb``) sends a compressed stream that inflates to ``bomb`` zero bytes;
* :class:`StallingNsqd` completes the handshake, then answers the first command with half a
  frame and goes silent (no heartbeats either);
* :class:`LateNsqd` completes the handshake and answers the first command after ``delay``
  seconds, every later one at once, in order, as nsqd does;
* :class:`ReplayingProxy` stands between a client and a real nsqd, passes everything both
  ways, and sends the client an earlier message frame of the server's once more (an older
  message redelivered after newer ones), built from the server's own bytes, not forged.

All are async context managers binding 127.0.0.1 on a free port (``address`` /
``host``/``port``); leaving the block closes the listener and aborts every connection.
``connections`` counts accepted connections; ``requests`` records what the peer read
(request lines for lookupds, command lines for nsqds).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import zlib
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

__all__ = [
    "DeflatingNsqd",
    "DripLookupd",
    "FakeLookupd",
    "HugeLookupd",
    "LateNsqd",
    "PartitionsLookupd",
    "ReplayingProxy",
    "SilentLookupd",
    "SilentNsqd",
    "StallingNsqd",
    "lookup_answer",
]

HOST = "127.0.0.1"
_MAX_HEAD = 64 * 1024


def lookup_answer(partitions: int = 1, *, tcp_port: int = 4150, http_port: int = 4151,
                  version: str = "0.3.7-HA.1.13.0") -> dict[str, Any]:
    """A youzan ``/lookup`` answer (bare v1 form): ``partitions`` partitions, each led by a
    node of its own on 127.0.0.1 (ports counted up from ``tcp_port``/``http_port``)."""
    def node(i: int) -> dict[str, Any]:
        return {"broadcast_address": HOST, "hostname": "hostile", "remote_address": HOST,
                "tcp_port": (tcp_port + i) % 65535 + 1 if i else tcp_port,
                "http_port": (http_port + i) % 65535 + 1 if i else http_port,
                "version": version, "distributed_id": f"n{i}"}
    nodes = [node(i) for i in range(partitions)]
    return {"channels": ["ch"], "producers": nodes[:1],
            "partitions": {str(i): nodes[i] for i in range(partitions)},
            "meta": {"partition_num": partitions, "replica": 1, "extend_support": False,
                     "ordered": False, "multi_part": False}}


class _Peer:
    """Listener bookkeeping shared by every hostile peer."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stop = asyncio.Event()
        self.port = 0
        self.connections = 0
        self.requests: list[bytes] = []

    @property
    def host(self) -> str:
        return HOST

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    async def __aenter__(self) -> Any:
        self._server = await asyncio.start_server(self._serve, HOST, 0, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self._stop.set()  # handlers end by themselves (a cancelled one upsets asyncio 3.11)
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = list(self._tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=5.0)
            for task in late:
                task.cancel()
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            await self.handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                _Stopped):
            pass  # the client gave up on us (that is the point), or the test is over
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def pause(self, seconds: float | None = None) -> None:
        """Wait ``seconds`` (for ever if ``None``); raises when the peer is being closed."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except asyncio.TimeoutError:
            return
        raise _Stopped


class _Stopped(Exception):
    """The peer is closing: its handlers stop."""


# -- lookupds ----------------------------------------------------------------------------------

class _Lookupd(_Peer):
    """Reads HTTP/1.1 requests (no bodies: lookupd's reads are GETs) and answers each."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_HEAD:
                return
            line = head.split(b"\r\n", 1)[0]
            self.requests.append(line)
            path = line.split(b" ")[1].decode("latin-1") if line.count(b" ") >= 2 else "/"
            await self.answer(path, writer)

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @staticmethod
    def body_for(path: str, answer: dict[str, Any]) -> tuple[int, bytes]:
        """``/listlookup`` gets a 404 (a lone classic-style lookupd), anything else ``answer``."""
        if path.startswith("/listlookup"):
            return 404, b'{"message":"NOT_FOUND"}'
        return 200, json.dumps(answer, separators=(",", ":")).encode()

    @staticmethod
    def head(status: int, length: int) -> bytes:
        reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
        return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {length}\r\n\r\n").encode()


class FakeLookupd(_Lookupd):
    """A lookupd that answers every ``/lookup`` with ``answer`` at once (over TLS with
    ``ssl_context``); ``/listlookup`` is a 404, so it is used alone like a classic one."""

    def __init__(self, answer: dict[str, Any] | None = None, *,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(ssl_context=ssl_context)
        self.answer_data = lookup_answer() if answer is None else answer

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        status, body = self.body_for(path, self.answer_data)
        writer.write(self.head(status, len(body)) + body)
        await writer.drain()


class DripLookupd(FakeLookupd):
    """A lookupd that sends its (valid) answer one byte every ``interval`` seconds."""

    def __init__(self, answer: dict[str, Any] | None = None, *, interval: float = 1.0) -> None:
        super().__init__(answer)
        self.interval = interval
        self.sent = 0

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        status, body = self.body_for(path, self.answer_data)
        data = self.head(status, len(body)) + body
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            self.sent += 1
            await self.pause(self.interval)


class SilentLookupd(_Lookupd):
    """A lookupd that reads requests and never answers (the connection stays open)."""

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        await self.pause()


class HugeLookupd(_Lookupd):
    """A lookupd whose every answer is ``size`` bytes of JSON (a padded but valid answer),
    streamed in 1 MiB writes; ``sent`` counts body bytes written."""

    def __init__(self, size: int = 300 * 1024 * 1024) -> None:
        super().__init__()
        self.size = size
        self.sent = 0

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        core = json.dumps(lookup_answer(), separators=(",", ":")).encode()
        # {"pad":"xxxx...", <the real answer's fields>}
        prefix, suffix = b'{"pad":"', b'",' + core[1:]
        pad = max(self.size - len(prefix) - len(suffix), 0)
        writer.write(self.head(200, len(prefix) + pad + len(suffix)) + prefix)
        block = b"x" * (1024 * 1024)
        left = pad
        while left:
            piece = block if left >= len(block) else block[:left]
            writer.write(piece)
            left -= len(piece)
            self.sent += len(piece)
            await writer.drain()
        writer.write(suffix)
        await writer.drain()


class PartitionsLookupd(FakeLookupd):
    """A lookupd answering a well-formed lookup that lists ``count`` partitions."""

    def __init__(self, count: int = 100_000) -> None:
        super().__init__(lookup_answer(count))


# -- nsqds -------------------------------------------------------------------------------------

_IDENTIFY_ANSWER: dict[str, Any] = {
    "max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000,
    "msg_timeout": 60000, "tls_v1": False, "deflate": False, "deflate_level": 0,
    "max_deflate_level": 6, "snappy": False, "sample_rate": 0, "auth_required": False,
    "output_buffer_size": 16384, "output_buffer_timeout": 250,
}


def frame(data: bytes, frame_type: int = 0) -> bytes:
    """One server frame: size, type, data."""
    return (len(data) + 4).to_bytes(4, "big") + frame_type.to_bytes(4, "big") + data


class _Nsqd(_Peer):
    """Reads the magic and commands (``IDENTIFY``/``AUTH``/``PUB``... with their bodies)."""

    async def read_command(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        line = (await reader.readuntil(b"\n"))[:-1]
        self.requests.append(line)
        name = line.split(b" ", 1)[0]
        body = b""
        if name in (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE"):
            size = int.from_bytes(await reader.readexactly(4), "big")
            body = await reader.readexactly(min(size, 16 * 1024 * 1024))
        return name, body

    async def handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        **answer: Any) -> dict[str, Any]:
        """Read the magic and IDENTIFY, answer it (plain); the client's IDENTIFY body back."""
        if await reader.readexactly(4) != b"  V2":
            raise ValueError("bad magic")
        name, body = await self.read_command(reader)
        if name != b"IDENTIFY":
            raise ValueError("expected IDENTIFY")
        asked = json.loads(body)
        data = {**_IDENTIFY_ANSWER, **answer}
        writer.write(frame(json.dumps(data).encode()))
        await writer.drain()
        return dict(asked)


class SilentNsqd(_Nsqd):
    """An nsqd that accepts connections and never sends a byte (it reads everything)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass


def deflate_bomb(inflated: int, level: int = 9) -> Iterator[bytes]:
    """Raw deflate (sync-flushed) pieces that inflate to ``inflated`` zero bytes."""
    out = zlib.compressobj(level, zlib.DEFLATED, -15)
    block = bytes(1024 * 1024)
    left = inflated
    while left:
        piece = block if left >= len(block) else block[:left]
        left -= len(piece)
        data = out.compress(piece)
        if data:
            yield data
    yield out.flush(zlib.Z_SYNC_FLUSH)


class DeflatingNsqd(_Nsqd):
    """An nsqd that switches deflate on whatever IDENTIFY asked (``asked`` records what it
    did ask), acknowledges it with a compressed ``OK``, then sends a compressed stream
    inflating to ``bomb`` zero bytes (none when 0) and answers each command ``OK``."""

    def __init__(self, *, bomb: int = 0) -> None:
        super().__init__()
        self.bomb = bomb
        self.asked: list[dict[str, Any]] = []
        self.bomb_sent = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked = await self.handshake(reader, writer, deflate=True, deflate_level=6)
        self.asked.append(asked)
        out = zlib.compressobj(6, zlib.DEFLATED, -15)
        writer.write(out.compress(frame(b"OK")) + out.flush(zlib.Z_SYNC_FLUSH))
        await writer.drain()
        if self.bomb:
            for piece in deflate_bomb(self.bomb):
                writer.write(piece)
                self.bomb_sent += len(piece)
                await writer.drain()
        inflate = zlib.decompressobj(-15)
        while data := await reader.read(65536):
            for line in inflate.decompress(data).split(b"\n")[:-1]:
                self.requests.append(line)
                if line.startswith((b"PUB", b"SUB", b"CLS")):
                    writer.write(out.compress(frame(b"OK")) + out.flush(zlib.Z_SYNC_FLUSH))


class StallingNsqd(_Nsqd):
    """An nsqd that completes the handshake, then answers the first command with the first
    half of an ``OK`` frame and sends nothing more."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.handshake(reader, writer)
        await self.read_command(reader)
        writer.write(frame(b"OK")[:5])
        await writer.drain()
        while await reader.read(65536):
            pass


class LateNsqd(_Nsqd):
    """An nsqd that answers the first command ``delay`` seconds late and every later one at
    once, always in order (a stalled partition that recovers); NOPs are not answered."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.handshake(reader, writer)
        first = True
        while True:
            name, _ = await self.read_command(reader)
            if name in (b"NOP", b"RDY", b"FIN", b"REQ", b"TOUCH"):
                continue
            if first:
                first = False
                await self.pause(self.delay)
            writer.write(frame(b"CLOSE_WAIT" if name == b"CLS" else b"OK"))
            await writer.drain()



# -- a proxy in front of a real nsqd -----------------------------------------------------------

Replay = Callable[[list[bytes]], bytes | None]
"""``replay(messages)``: given the message frames forwarded so far on one connection (whole
frames, size prefix included, oldest first), the bytes to send the client once more right now,
or ``None``."""


class ReplayingProxy(_Peer):
    """A loopback TCP proxy in front of one nsqd (``upstream``, ``"host:port"``).

    Client to server, bytes pass verbatim. Server to client, the stream is cut at frame
    boundaries (the 4-byte size prefix: nothing else of a frame is read) and each frame is
    passed on whole; after each *message* frame, ``replay`` is asked whether to send one of
    the connection's earlier message frames again, and what it returns is written right
    behind the frame just forwarded. So a test gets a genuine order regression made of a real
    server's own bytes: ids, offsets, attempts and bodies as the server wrote them, only one
    of them out of its place. A copy rather than a held-back frame, because an ordered youzan
    subscription has one message in flight per partition: the next frame only comes once the
    client answered the last one, so holding frames back would stall the channel.

    Plain streams only: with TLS or stream compression negotiated the frames cannot be told
    apart (the proxy does not look at IDENTIFY). ``messages`` holds each connection's message
    frames as forwarded, ``injected`` what ``replay`` added, in order, and ``errors`` what a
    ``replay`` raised (that connection ends: a test asserts the list is empty).
    """

    def __init__(self, upstream: str, replay: Replay) -> None:
        super().__init__()
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.replay = replay
        self.messages: list[list[bytes]] = []
        self.injected: list[bytes] = []
        self.errors: list[BaseException] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream),
                                                      10.0)
        self._writers.add(up_writer)  # aborted with the client's when the proxy closes
        try:
            pumps = [asyncio.ensure_future(self._to_server(reader, up_writer)),
                     asyncio.ensure_future(self._to_client(up_reader, writer))]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            # one side is gone: so is the other (the aborts end the pump still reading)
            up_writer.transport.abort()
            writer.transport.abort()
            await asyncio.wait(pumps)
            # the pumps end by EOF or OSError; anything else came from replay
            self.errors += [e for e in (p.exception() for p in pumps) if e is not None]
        finally:
            self._writers.discard(up_writer)
            up_writer.transport.abort()

    @staticmethod
    async def _to_server(reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                up.write(data)
                await up.drain()
        except OSError:
            pass

    async def _to_client(self, up: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        messages: list[bytes] = []
        self.messages.append(messages)
        pending = bytearray()
        try:
            while data := await up.read(65536):
                pending += data
                while len(pending) >= 8:
                    end = 4 + int.from_bytes(pending[:4], "big")
                    if len(pending) < end:
                        break
                    one = bytes(pending[:end])
                    del pending[:end]
                    writer.write(one)
                    if int.from_bytes(one[4:8], "big") == 2:  # a message frame
                        messages.append(one)
                        again = self.replay(messages)
                        if again is not None:
                            self.injected.append(again)
                            writer.write(again)
                await writer.drain()
        except OSError:
            pass
