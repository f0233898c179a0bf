"""Shared pieces of the nsqd tests (no tests here): a raw client, node fixtures, capture files.

The raw client is asyncio streams plus smartnsq's sans-I/O codec, so what the tests observe is
what any NSQ client would see on the wire. Waiting is always for a frame or for EOF, with a
timeout; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import snappy

from smartnsq.devcluster.nsqd.node import NsqdNode
from smartnsq.devcluster.state import ClusterState, TopicInfo
from smartnsq.protocol import commands
from smartnsq.protocol.commands import MAGIC_V2
from smartnsq.protocol.frames import ErrorFrame, FrameReader, MessageFrame, MessageLayout, Response

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TIMEOUT = 5.0
IDENTIFY = {"client_id": "raw", "hostname": "raw-host", "feature_negotiation": True,
            "heartbeat_interval": 30000, "user_agent": "test/1", "msg_timeout": 60000}


class RawClient:
    """One client connection: raw bytes out, decoded frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 layout: MessageLayout | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameReader(layout or MessageLayout())
        self.frames: list[Any] = []
        self._inflate: Any = None
        self._deflate: Any = None
        self._snappy_in: Any = None
        self._snappy_out: Any = None

    @classmethod
    async def connect(cls, address: str, *, magic: bytes = MAGIC_V2,
                      layout: MessageLayout | None = None) -> RawClient:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        client = cls(reader, writer, layout)
        if magic:
            writer.write(magic)
        return client

    @classmethod
    async def identified(cls, address: str, *, classic: bool = False,
                         **fields: Any) -> RawClient:
        """Connected, magic sent, IDENTIFYed (``fields`` override the defaults)."""
        layout = MessageLayout(youzan=not classic)
        client = await cls.connect(address, layout=layout)
        answer = await client.call(commands.identify({**IDENTIFY, **fields}))
        assert isinstance(answer, Response), answer
        return client

    # -- layout and stream transforms -------------------------------------------------------

    def expect(self, *, youzan: bool = True, ext: bool = False, detail: bool = False) -> None:
        """Decode the next message frames with this layout (as a client tracks its SUB)."""
        self.decoder.layout = MessageLayout(youzan=youzan, ext=ext, detail=detail)

    def use_snappy(self) -> None:
        self._snappy_in = snappy.StreamDecompressor()
        self._snappy_out = snappy.StreamCompressor()

    def use_deflate(self, level: int = 6) -> None:
        self._inflate = zlib.decompressobj(-15)
        self._deflate = zlib.compressobj(level, zlib.DEFLATED, -15)

    async def start_tls(self, context: ssl.SSLContext, hostname: str = "localhost") -> None:
        await self.writer.start_tls(context, server_hostname=hostname)

    # -- I/O ------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self._snappy_out is not None:
            data = self._snappy_out.add_chunk(data)
        elif self._deflate is not None:
            data = self._deflate.compress(data) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
        self.writer.write(data)

    async def _read(self, timeout: float) -> bytes:
        try:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
        except (ConnectionResetError, BrokenPipeError):
            return b""
        if self._snappy_in is not None and data:
            data = self._snappy_in.decompress(data)
        elif self._inflate is not None and data:
            data = self._inflate.decompress(data)
        return data

    async def frame(self, timeout: float = TIMEOUT) -> Any:
        """The next frame; ``None`` once the server has closed the connection."""
        while not self.frames:
            data = await self._read(timeout)
            if not data:
                return None
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    async def exact_frame(self, timeout: float = TIMEOUT) -> Any:
        """One frame read to its last byte and no further (what follows may be compressed)."""
        head = await asyncio.wait_for(self.reader.readexactly(4), timeout)
        size = int.from_bytes(head, "big")
        rest = await asyncio.wait_for(self.reader.readexactly(size), timeout)
        (frame,) = self.decoder.feed(head + rest)
        return frame

    async def call(self, data: bytes, timeout: float = TIMEOUT) -> Any:
        self.send(data)
        return await self.frame(timeout)

    async def message(self, timeout: float = TIMEOUT) -> MessageFrame:
        """The next message frame (heartbeats skipped)."""
        while True:
            frame = await self.frame(timeout)
            assert frame is not None, "connection closed while waiting for a message"
            if isinstance(frame, MessageFrame):
                return frame
            assert not isinstance(frame, ErrorFrame), frame

    async def closed(self, timeout: float = TIMEOUT) -> bool:
        """True when the server closes the connection (frames before that are dropped)."""
        while True:
            frame = await self.frame(timeout)
            if frame is None:
                return True

    def close(self) -> None:
        self.writer.close()


async def error_then_close(client: RawClient, command: bytes) -> bytes:
    """Send a command that must fail fatally; return the error payload."""
    answer = await client.call(command)
    assert isinstance(answer, ErrorFrame), answer
    assert await client.closed(), "the server kept the connection open"
    return bytes(answer.payload)


# -- node fixtures ------------------------------------------------------------------------------


@dataclass
class Nodes:
    """A ClusterState and its nsqd nodes (no lookupd: the tests talk to nodes directly)."""

    state: ClusterState
    nodes: list[NsqdNode]
    clients: list[RawClient] = field(default_factory=list)

    def node(self, node_id: str | None) -> NsqdNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def leader(self, topic: str, partition: int = 0) -> NsqdNode:
        p = self.state.partition(topic, partition)
        assert p is not None
        return self.node(p.leader)

    def replica(self, topic: str, partition: int = 0) -> NsqdNode:
        p = self.state.partition(topic, partition)
        assert p is not None
        return self.node(next(r for r in p.replicas if r != p.leader))

    def outsider(self, topic: str, partition: int = 0) -> NsqdNode:
        p = self.state.partition(topic, partition)
        assert p is not None
        return next(n for n in self.nodes if n.node_id not in p.replicas)

    def topic(self, name: str, partitions: int = 1, replicas: int = 1, *,
              channels: Sequence[str] = (), **flags: Any) -> TopicInfo:
        """Create a youzan topic (leaders spread by the state) with channels made up front."""
        if partitions * replicas > len(self.nodes) and not flags.get("ordered"):
            flags.setdefault("multipart", True)
        info = self.state.create_topic(name, partitions, replicas, **flags)
        for p in info.partitions:
            for channel in channels:
                self.node(p.leader).channel(p, info, channel)
        return info

    async def client(self, node: NsqdNode, **identify: Any) -> RawClient:
        client = await RawClient.identified(node.tcp_address, classic=node.classic,
                                            **identify)
        self.clients.append(client)
        return client

    async def raw(self, node: NsqdNode, **kwargs: Any) -> RawClient:
        client = await RawClient.connect(node.tcp_address, **kwargs)
        self.clients.append(client)
        return client


@contextlib.asynccontextmanager
async def running(count: int = 3, *, classic: bool = False,
                  **options: Any) -> AsyncIterator[Nodes]:
    """``count`` started nodes on one fresh ClusterState; everything stopped afterwards."""
    state = ClusterState()
    nodes = Nodes(state, [NsqdNode(state, classic=classic, name=f"nsqd-{i + 1}", **options)
                          for i in range(count)])
    try:
        for node in nodes.nodes:
            await node.start()
        yield nodes
    finally:
        for client in nodes.clients:
            client.close()
        for node in nodes.nodes:
            await node.stop()


# -- capture files ------------------------------------------------------------------------------

_HEX_LINE = re.compile(r"^ {4}[0-9a-f]{4}  ((?:[0-9a-f]{2} )+)")


@dataclass
class Step:
    kind: str  # connect, send, recv, closed
    data: bytes = b""
    text: str = ""
    port: int = 0


def load_tcp_capture(path: Path) -> list[Step]:
    """The exchanges of a ``tcp_*.txt`` capture, as steps to replay."""
    steps: list[Step] = []
    current: Step | None = None
    for line in path.read_text().splitlines():
        hexed = _HEX_LINE.match(line)
        if hexed and current is not None:
            current.data += bytes.fromhex(hexed.group(1).replace(" ", ""))
            continue
        current = None
        if line.startswith("## connect "):
            port = int(line.split()[2].rsplit(":", 1)[1])
            steps.append(Step("connect", port=port, text=line))
        elif line.startswith(">> SEND"):
            current = Step("send", text=line)
            steps.append(current)
        elif line.startswith("<< RECV"):
            current = Step("recv", text=line)
            steps.append(current)
        elif "closed by server" in line or "server CLOSED" in line:
            steps.append(Step("closed", text=line))
    return steps
