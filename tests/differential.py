"""The live differential: the same raw exchanges against the dev cluster and the real servers,
the answers normalised and compared field by field.

An :class:`Exchange` is one named conversation: a sequence of raw TCP commands over one or
more sockets (built with :mod:`smartnsq.protocol.commands`, frames read with
:class:`~smartnsq.protocol.frames.FrameReader`), or one HTTP request. :func:`run_exchange`
plays it on a :class:`Side` (a started cluster plus the topics every exchange shares) and
returns the normalised transcript: what varies between two correct servers (message ids and
timestamps, ports, addresses, hostnames, versions, start times) is masked, lists built from Go
maps are sorted, queue offsets are made relative to the first one the exchange saw. Two sides
that behave alike give equal transcripts.

The exchanges themselves are in :data:`YOUZAN` and :data:`CLASSIC`; ``tests/both/
test_differential.py`` runs each one as a test case and ``bench/differential.py`` prints the
score. Both clusters of a mode have the same shape (youzan: 3 nsqd, 2 lookupds; classic: 1 and
1) and the same topics, created once per run (:data:`YOUZAN_TOPICS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union
from urllib.parse import urlencode

from smartnsq.admin import AsyncAdmin
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    CLASSIC_LAYOUT,
    ErrorFrame,
    FrameReader,
    Heartbeat,
    MessageFrame,
    MessageLayout,
    Response,
)
from smartnsq.protocol.responses import parse_publish_response
from smartnsq.transport.http import HttpClient

T = TypeVar("T")

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
READ_TIMEOUT = 5.0   # a frame the exchange waits for
QUIET = 0.3          # how long the end of an exchange waits for extra frames or an EOF


# -- a loop of our own: both clusters live across test cases -----------------------------------


class Loop:
    """An event loop in a daemon thread; ``run(coro)`` from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="differential",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# -- topics every exchange of a mode shares ----------------------------------------------------


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replicas: int = 1
    ordered: bool = False
    ext: bool = False
    channels: tuple[str, ...] = ("default",)


YOUZAN_TOPICS = (
    TopicSpec("dn", partitions=2),                   # normal, 2 partitions on 2 of 3 nodes
    TopicSpec("dr", partitions=1, replicas=2),       # a leader, a replica, an outsider
    TopicSpec("do", partitions=2, ordered=True),     # ordered
    TopicSpec("de", partitions=1, ext=True),         # ext headers
    TopicSpec("dx", partitions=1, channels=()),      # no channel yet: hidden from writers
    TopicSpec("ds", partitions=1, channels=()),      # for /stats counters
)
CLASSIC_TOPICS = (TopicSpec("cn"), TopicSpec("cs", channels=("cs_idle",)))


@dataclass
class Side:
    """One started cluster (``dev`` or ``real``) and where its topics live."""

    label: str
    mode: str
    cluster: Any
    lookupds: list[str] = field(default_factory=list)        # http, leader first
    nsqd_tcp: list[str] = field(default_factory=list)
    nsqd_http: list[str] = field(default_factory=list)
    ports: dict[int, str] = field(default_factory=dict)      # port -> its role, for masking
    leaders: dict[tuple[str, int], int] = field(default_factory=dict)   # -> node index
    replicas: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    outsiders: dict[str, list[int]] = field(default_factory=dict)
    quiet: float = QUIET  # how long the end of a TCP exchange waits for more

    @property
    def youzan(self) -> bool:
        return self.mode == "youzan"

    async def prepare(self, topics: Sequence[TopicSpec]) -> None:
        c = self.cluster
        self.nsqd_tcp = list(c.nsqd_tcp_addresses)
        self.nsqd_http = list(c.nsqd_http_addresses)
        self.lookupds = list(c.lookupd_http_addresses)
        if self.youzan:
            await asyncio.gather(*(c.create_topic(
                t.name, t.partitions, t.replicas, ordered=t.ordered, ext=t.ext,
                channels=t.channels or None, timeout=120) for t in topics))
        else:
            for t in topics:
                await c.create_topic(t.name, channels=t.channels)
        async with AsyncAdmin(self.lookupds, timeout=5) as admin:
            if self.youzan:
                leader = await admin.leader_lookupd()
                assert leader is not None, f"{self.label}: no leader lookupd"
                self.lookupds.sort(key=lambda a: a != leader)
            for t in topics:
                hosting: set[int] = set()
                for i, address in enumerate(self.nsqd_http):
                    stats = await admin.stats(address, topic=t.name)
                    for entry in stats.partitions(t.name):
                        key = (t.name, entry.partition or 0)
                        hosting.add(i)
                        if entry.leader or not self.youzan:
                            self.leaders[key] = i
                        else:
                            self.replicas.setdefault(key, []).append(i)
                self.outsiders[t.name] = [i for i in range(len(self.nsqd_tcp))
                                          if i not in hosting]
        # nsqd ports by kind only: the two clusters place partitions differently
        for tcp, http in zip(self.nsqd_tcp, self.nsqd_http, strict=True):
            self.ports[int(tcp.rsplit(":", 1)[1])] = "<nsqd tcp>"
            self.ports[int(http.rsplit(":", 1)[1])] = "<nsqd http>"
        for i, lk in enumerate(self.lookupds):
            self.ports[int(lk.rsplit(":", 1)[1])] = f"<lookupd{i} http>"
        for member in getattr(c, "lookupds", []):
            info = getattr(member, "info", None)  # dev: a NodeInfo-like; real: a RealMember
            ports = ({"tcp": info.tcp_port, "rpc": info.rpc_port, "http": member.http.port}
                     if info is not None else dict(getattr(member, "ports", {})))
            where = self.ports.get(int(ports.get("http") or 0), "<lookupd>")[:-len(" http>")]
            for kind in ("tcp", "rpc"):
                if ports.get(kind):
                    self.ports[int(ports[kind])] = f"{where} {kind}>"

    def node(self, target: str) -> int:
        """An nsqd index: ``any``, ``leader:T:P``, ``replica:T:P``, ``outsider:T``, ``n<i>``."""
        kind, *rest = target.split(":")
        if kind == "any":
            return 0
        if kind.startswith("n") and kind[1:].isdigit():
            return int(kind[1:])
        if kind == "leader":
            return self.leaders[(rest[0], int(rest[1]))]
        if kind == "replica":
            return self.replicas[(rest[0], int(rest[1]))][0]
        if kind == "outsider":
            return self.outsiders[rest[0]][0]
        if kind == "nonleader":  # any node not leading T:P
            lead = self.leaders[(rest[0], int(rest[1]))]
            return next(i for i in range(len(self.nsqd_tcp)) if i != lead)
        raise ValueError(f"unknown target {target!r}")

    def http_address(self, target: str) -> str:
        """``lookupd:leader``, ``lookupd:follower`` or an nsqd target (see :meth:`node`)."""
        if target.startswith("lookupd:"):
            which = target.split(":", 1)[1]
            return self.lookupds[0 if which == "leader" else 1]
        return self.nsqd_http[self.node(target)]


# -- exchanges ---------------------------------------------------------------------------------

Build = Union[bytes, Callable[["TcpRun"], bytes]]  # noqa: UP007 - a runtime alias on 3.10


@dataclass(frozen=True)
class Step:
    """Send ``cmd`` on connection ``conn``, then read ``frames`` frames (an EOF ends early)."""

    conn: str
    cmd: Build | Http | None  # None: send nothing, only read; Http: ask over HTTP
    frames: int = 1


def send(cmd: Build, frames: int = 1, conn: str = "a") -> Step:
    return Step(conn, cmd, frames)


def recv(frames: int = 1, conn: str = "a") -> Step:
    return Step(conn, None, frames)


@dataclass(frozen=True)
class Tcp:
    steps: tuple[Step, ...]
    to: dict[str, str] = field(default_factory=dict)   # conn -> nsqd target (default any)
    magic: bool = True


@dataclass(frozen=True)
class Http:
    method: str
    to: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    v1: bool = True
    body: bytes = b""
    keep: tuple[str, ...] | None = None   # compare only these top-level keys of a JSON body
    schema: bool = False                  # compare keys and value types, not values
    topic: str | None = None              # /stats: keep only this topic's entries
    merge_producers: bool = False         # /nodes: one union of what every nsqd hosts


@dataclass(frozen=True)
class Exchange:
    name: str
    action: Tcp | Http
    deviation: str | None = None   # a documented difference: the case is xfail(strict)
    fixed: str | None = None       # a difference found here and fixed in the dev cluster
    real_flaky: bool = False


def tcp(name: str, *steps: Step, to: str | dict[str, str] = "any", magic: bool = True,
        **kw: Any) -> Exchange:
    targets = {"a": to} if isinstance(to, str) else dict(to)
    return Exchange(name, Tcp(tuple(steps), targets, magic), **kw)


def http(name: str, method: str, to: str, path: str, params: dict[str, str] | None = None,
         *, v1: bool = True, body: bytes = b"", keep: Sequence[str] | None = None,
         schema: bool = False, topic: str | None = None, merge_producers: bool = False,
         **kw: Any) -> Exchange:
    return Exchange(name, Http(method, to, path, dict(params or {}), v1, body,
                               tuple(keep) if keep is not None else None, schema, topic,
                               merge_producers), **kw)


# -- running a TCP exchange --------------------------------------------------------------------


class TcpRun:
    """The state of one TCP exchange on one side: its sockets and what they received."""

    def __init__(self, side: Side, exchange: Tcp) -> None:
        self.side = side
        self.exchange = exchange
        self.conns: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.readers: dict[str, FrameReader] = {}
        self.queued: dict[str, list[Any]] = {}
        self.closed: set[str] = set()
        self.messages: dict[str, list[MessageFrame]] = {}
        self.offset_base: int | None = None
        self.id_base: dict[int, int] = {}

    def msg(self, conn: str = "a", index: int = -1) -> MessageFrame:
        """A message received on ``conn`` (a stand-in with a zero id if none arrived: the
        transcript then shows the difference instead of the exchange failing)."""
        try:
            return self.messages[conn][index]
        except (KeyError, IndexError):
            return MessageFrame(0, 0, bytes(16) if self.side.youzan else b"0" * 16, b"")

    async def _open(self, conn: str) -> None:
        index = self.side.node(self.exchange.to.get(conn, "any"))
        host, port = self.side.nsqd_tcp[index].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        self.conns[conn] = (reader, writer)
        layout = MessageLayout() if self.side.youzan else CLASSIC_LAYOUT
        self.readers[conn] = FrameReader(layout)
        self.queued[conn] = []
        if self.exchange.magic:
            writer.write(commands.MAGIC_V2)

    def _relayout(self, conn: str, data: bytes) -> None:
        if not self.side.youzan:
            return
        name = commands.command_name(data)
        reader = self.readers[conn]
        if name == "IDENTIFY":
            with contextlib.suppress(ValueError):
                body = json.loads(data[data.index(b"\n") + 5:])
                if isinstance(body, dict) and "extend_support" in body:
                    reader.layout = MessageLayout(ext=bool(body["extend_support"]),
                                                  detail=reader.layout.detail)
        elif name in ("SUB_ORDERED", "SUB_ADVANCED"):
            reader.layout = MessageLayout(ext=reader.layout.ext, detail=True)

    async def _frame(self, conn: str, timeout: float) -> Any:
        """The next non-heartbeat frame, ``"EOF"`` or ``"timeout"``."""
        queue = self.queued[conn]
        reader, _ = self.conns[conn]
        while not queue:
            if conn in self.closed:
                return "EOF"
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout)
            except asyncio.TimeoutError:
                return "timeout"
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.closed.add(conn)
                return "EOF"
            queue.extend(f for f in self.readers[conn].feed(data)
                         if not isinstance(f, Heartbeat))
        return queue.pop(0)

    async def run(self) -> list[Any]:
        out: list[Any] = []
        try:
            for step in self.exchange.steps:
                if isinstance(step.cmd, Http):
                    out.append([f"http {step.cmd.path}", await run_http(self.side, step.cmd)])
                    continue
                if step.conn not in self.conns:
                    await self._open(step.conn)
                data = step.cmd(self) if callable(step.cmd) else step.cmd
                got: list[Any] = []
                if data is None:
                    data = b"(read)"
                elif step.conn not in self.closed:
                    self._relayout(step.conn, data)
                    with contextlib.suppress(OSError):
                        self.conns[step.conn][1].write(data)
                for _ in range(step.frames):
                    frame = await self._frame(step.conn, READ_TIMEOUT)
                    if isinstance(frame, MessageFrame):
                        self.messages.setdefault(step.conn, []).append(frame)
                    got.append(self.norm(frame))
                    if frame in ("EOF", "timeout"):
                        break
                out.append([f"{step.conn}> {_label(data)}", *got])
            # anything more, and whether each connection is still open
            tails = await asyncio.gather(*(self._tail(c) for c in sorted(self.conns)))
            out.append({c: t for c, t in zip(sorted(self.conns), tails, strict=True)})
        finally:
            for _, writer in self.conns.values():
                writer.close()
        return out

    async def _tail(self, conn: str) -> list[Any]:
        extra: list[Any] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.side.quiet
        while True:
            frame = await self._frame(conn, max(0.0, deadline - loop.time()))
            if frame == "timeout":
                extra.append("open")
                return extra
            extra.append(self.norm(frame))
            if frame == "EOF":
                return extra

    # normalising frames

    def norm(self, frame: Any) -> Any:
        if isinstance(frame, str):
            return frame
        if isinstance(frame, ErrorFrame):
            return ["E", _mask_text(frame.payload.decode("utf-8", "replace"), self.side)]
        if isinstance(frame, Response):
            data = bytes(frame.data)
            if data.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    return ["R", mask(json.loads(data), self.side)]
            if len(data) == 30 and data[:2] == b"OK":
                receipt = parse_publish_response(data)
                assert receipt is not None
                return ["R traced", {"partition": receipt.partition,
                                     "id": self._rel_id(receipt.internal_id),
                                     "trace_id": receipt.trace_id,
                                     "offset": self._rel_offset(receipt.queue_offset),
                                     "raw_size": receipt.raw_size}]
            return ["R", data.decode("utf-8", "replace")]
        if isinstance(frame, MessageFrame):
            out: dict[str, Any] = {"attempts": frame.attempts, "body": frame.body.decode(
                "utf-8", "replace")}
            if frame.youzan:
                out.update(partition=frame.partition, id=self._rel_id(frame.internal_id),
                           trace_id=frame.trace_id)
            else:
                out["id"] = "<hex>" if re.fullmatch(rb"[0-9a-f]{16}", frame.id) else frame.id
            if self.readers and any(r.layout.ext for r in self.readers.values()):
                out["ext_version"] = frame.ext_version
                out["ext"] = frame.headers if frame.ext_version == 4 else frame.ext
            if frame.queue_offset is not None:
                out["offset"] = self._rel_offset(frame.queue_offset)
                out["raw_size"] = frame.raw_size
            return ["M", out]
        return repr(frame)

    def _rel_offset(self, offset: int) -> int:
        if self.offset_base is None:
            self.offset_base = offset
        return offset - self.offset_base

    def _rel_id(self, internal_id: int) -> str:
        """Ids as ``p<partition>+<n>``: n counts from the first id this exchange saw of
        that partition (ids grow by one per message on both kinds of server)."""
        partition = (internal_id >> 50) & 0x3FF
        base = self.id_base.setdefault(partition, internal_id)
        return f"p{partition}+{internal_id - base}"


def _label(data: bytes) -> str:
    line = data.split(b"\n", 1)[0][:60]
    text = line.decode("ascii", "replace")
    if re.match(r"(FIN|REQ|TOUCH) ", text):
        return text.split(" ", 1)[0] + " <id>" + (" " + text.rsplit(" ", 1)[1]
                                                  if text.startswith("REQ") else "")
    return text


# -- normalising answers -----------------------------------------------------------------------

MASKED_KEYS = frozenset({
    "id", "remote_address", "hostname", "broadcast_address", "version", "distributed_id",
    "start_time", "ID", "NodeIP", "Epoch", "client_id", "user_agent", "uptime",
    "uptime_seconds", "connect_ts", "last_update", "node_id", "data_path", "identity",
    "depth_ts", "depth_ts_nano", "last_pub_ts", "timestamp", "delayed_queue_recent",
    "delayed_queue_recent_nano",
})
TIMING_HISTOGRAMS = frozenset({"msg_write_latency_stats", "msg_consume_latency_stats",
                               "msg_delivery_latency_stats"})
PORT_KEYS = frozenset({"tcp_port", "http_port", "TcpPort", "HttpPort", "RpcPort", "rpc_port",
                       "https_port"})


def mask(value: Any, side: Side, key: str | None = None) -> Any:
    if key == "memory":  # the Go runtime's heap figures: only their shape compares
        return schema_of(value)
    if isinstance(value, dict):
        return {k: mask(v, side, k) for k, v in sorted(value.items())}
    if key in TIMING_HISTOGRAMS and isinstance(value, list):  # buckets of measured times
        return f"<{sum(v for v in value if isinstance(v, int))} timed>"
    if isinstance(value, list):
        items = [mask(v, side, key) for v in value]
        if all(isinstance(v, (int, float, bool)) or v is None for v in items):
            return items   # positional (histograms, flags beside a list)
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))  # Go map order
    if key in MASKED_KEYS and value not in (None, "", 0):
        return "<masked>"
    if key in PORT_KEYS and value not in (None, ""):
        try:
            return side.ports.get(int(value), "<port>")
        except (TypeError, ValueError):
            return "<port>"
    if isinstance(value, str):
        return _mask_text(value, side)
    return value


_ADDRESS = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}:(\d{2,5})")


def _mask_text(text: str, side: Side) -> str:
    def one(m: re.Match[str]) -> str:
        return side.ports.get(int(m.group(1)), "<address>")
    return _ADDRESS.sub(one, text)


def schema_of(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: schema_of(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        shapes = {json.dumps(schema_of(v), sort_keys=True) for v in value}
        return [json.loads(s) for s in sorted(shapes)]
    return type(value).__name__


# -- running an HTTP exchange ------------------------------------------------------------------


async def run_http(side: Side, exchange: Http) -> dict[str, Any]:
    address = side.http_address(exchange.to)
    query = f"?{urlencode(exchange.params)}" if exchange.params else ""
    async with HttpClient() as client:
        answer = await client.request(exchange.method, f"http://{address}{exchange.path}{query}",
                                      timeout=10, max_body=16 << 20,
                                      headers=V1 if exchange.v1 else None, body=exchange.body)
    out: dict[str, Any] = {"status": answer.status,
                           "content-type": answer.header("content-type"),
                           "x-nsq-content-type": answer.header("x-nsq-content-type")}
    try:
        body: Any = json.loads(answer.body) if answer.body.strip() else None
        parsed = True
    except ValueError:
        body, parsed = answer.body.decode("utf-8", "replace"), False
    if parsed:
        if exchange.topic is not None:
            body = _only_topic(body, exchange.topic)
        if exchange.keep is not None and isinstance(body, dict):
            body = {k: body.get(k, "<absent>") for k in exchange.keep}
        body = schema_of(body) if exchange.schema else mask(body, side)
        if exchange.merge_producers:
            body = _merge_producers(body)
    else:
        body = _mask_text(body, side)
    out["body"] = body
    return out


def _merge_producers(body: Any) -> Any:
    """/nodes lists each nsqd with the partitions it leads; the two clusters place them
    differently, so compare the nsqd (without those) and the union of the placements."""
    if not isinstance(body, dict) or not isinstance(body.get("producers"), list):
        return body
    placed: list[str] = []
    producers = []
    for producer in body["producers"]:
        for topic, partitions in (producer.pop("partitions", None) or {}).items():
            placed += [f"{topic}:{pid}" for pid in partitions]
        topics = producer.pop("topics", None) or []
        tombstones = producer.pop("tombstones", None) or []
        placed += [f"{topic} tombstoned" for topic, dead in zip(topics, tombstones, strict=False)
                   if dead]
        producers.append(producer)
    return {**body, "producers": producers, "placed": sorted(placed)}


def _only_topic(body: Any, topic: str) -> Any:
    data = body.get("data", body) if isinstance(body, dict) else body
    if isinstance(data, dict) and isinstance(data.get("topics"), list):
        data["topics"] = [t for t in data["topics"] if t.get("topic_name") == topic]
    return body


async def run_exchange(side: Side, exchange: Exchange) -> Any:
    if isinstance(exchange.action, Http):
        return await run_http(side, exchange.action)
    return await TcpRun(side, exchange.action).run()


async def run_both(dev: Side, real: Side, exchange: Exchange) -> tuple[Any, Any]:
    a, b = await asyncio.gather(run_exchange(dev, exchange), run_exchange(real, exchange))
    return a, b


# -- building the clusters ---------------------------------------------------------------------


async def start_sides(mode: str, *, real_servers: bool = True) -> tuple[Side, Side]:
    """A dev and a real cluster of the mode's shape, started and given the shared topics
    (``real_servers=False``: two dev clusters, which checks the harness itself)."""
    from smartnsq.devcluster import DevCluster
    from smartnsq.testing.realcluster import RealCluster

    if mode == "youzan":
        dev_cluster: Any = DevCluster(nodes=3, lookupds=2)
        real_cluster: Any = (RealCluster(nodes=3, lookupds=2, mode="youzan") if real_servers
                             else DevCluster(nodes=3, lookupds=2))
        topics: Sequence[TopicSpec] = YOUZAN_TOPICS
    else:
        dev_cluster = DevCluster(nodes=1, lookupds=1, mode="classic")
        real_cluster = (RealCluster(nodes=1, lookupds=1, mode="classic") if real_servers
                        else DevCluster(nodes=1, lookupds=1, mode="classic"))
        topics = CLASSIC_TOPICS
    dev, real = Side("dev", mode, dev_cluster), Side("real", mode, real_cluster)
    if not real_servers:  # two in-process clusters answer within milliseconds
        dev.quiet = real.quiet = 0.05
    started: list[Any] = []
    try:
        for side in (dev, real):
            await side.cluster.start()
            started.append(side.cluster)
        await asyncio.gather(dev.prepare(topics), real.prepare(topics))
    except BaseException:
        for cluster in started:
            await cluster.stop()
        raise
    return dev, real


async def stop_sides(*sides: Side) -> None:
    for side in sides:
        with contextlib.suppress(Exception):
            await side.cluster.stop()





# == the exchanges ===========================================================================

c = commands
_U32 = struct.Struct(">I")


def ident(**fields: Any) -> bytes:
    """IDENTIFY as a client sends it, with ``fields`` on top."""
    return c.identify({"client_id": "diff", "hostname": "diff", "user_agent": "differential/1",
                       "feature_negotiation": True, **fields})


def fin(conn: str = "a", index: int = -1) -> Callable[[TcpRun], bytes]:
    return lambda run: c.fin(run.msg(conn, index).id)


def req(conn: str = "a", index: int = -1, delay: int = 0) -> Callable[[TcpRun], bytes]:
    return lambda run: c.req(run.msg(conn, index).id, delay)


def touch(conn: str = "a", index: int = -1) -> Callable[[TcpRun], bytes]:
    return lambda run: c.touch(run.msg(conn, index).id)


def raw_sized(header: bytes, size: int, body: bytes = b"") -> bytes:
    """A command line and a length prefix the codec would refuse to build (errors on purpose)."""
    return header + _U32.pack(size) + body


def stats(topic: str, channel: str | None = None, partition: int = 0) -> Step:
    """An HTTP step: the partition leader's /stats of ``topic`` (of one channel)."""
    params = {"format": "json", "topic": topic}
    if channel is not None:
        params["channel"] = channel
    return Step("http", Http("GET", f"leader:{topic}:{partition}", "/stats", params,
                             topic=topic))


def consume(name: str, topic: str, partition: int, publish: Sequence[bytes], *tail: Step,
            sub: Callable[[str, str, int], bytes] | None = None, identify: bytes | None = None,
            rdy: int = 1, first: int = 1, **kw: Any) -> Exchange:
    """Subscribe a fresh channel on the partition's leader (``s``), publish ``publish`` on
    another connection (``p``), ``RDY rdy`` and read ``first`` messages, then ``tail``."""
    channel = f"c_{name}"
    subscribe = (sub or (lambda t, ch, p: c.sub(t, ch, p)))(topic, channel, partition)
    steps = [send(identify, 1, "s")] if identify is not None else []
    steps += [send(subscribe, 1, "s")]
    steps += [send(c.pub(topic, body, partition), 1, "p") for body in publish]
    steps += [send(c.rdy(rdy), first, "s"), *tail]
    where = f"leader:{topic}:{partition}"
    return tcp(name, *steps, to={"s": where, "p": where}, **kw)


def classic_consume(name: str, publish: Sequence[bytes], *tail: Step, first: int = 1,
                    rdy: int = 1, **kw: Any) -> Exchange:
    channel = f"c_{name}"
    steps = [send(c.sub("cn", channel), 1, "s")]
    steps += [send(c.pub("cn", body), 1, "p") for body in publish]
    steps += [send(c.rdy(rdy), first, "s"), *tail]
    return tcp(name, *steps, to={"s": "any", "p": "any"}, **kw)


S, P = "s", "p"

# what the differential found and the dev cluster was fixed for (``Exchange.fixed``)
FIX_RECREATE = ("re-creating an existing topic with other meta answers 400 already exist "
                "(the same create again stays 200)")
FIX_MESSAGE_GET = "/message/get was missing"
FIX_STATS = ("youzan /stats: depth from the confirmed position, backlogs, counters, "
             "client_pub_stats, msg_size_stats as the leader accepts messages")

YOUZAN_TCP = [
    # -- handshake
    tcp("identify_feature_negotiation", send(ident())),
    tcp("identify_no_feature_negotiation", send(ident(feature_negotiation=False))),
    tcp("identify_extend_support_and_timeouts",
        send(ident(extend_support=True, output_buffer_timeout=5, heartbeat_interval=5000,
                   msg_timeout=30000))),
    tcp("identify_twice", send(ident()), send(ident())),
    tcp("identify_bad_json", send(raw_sized(b"IDENTIFY\n", 5, b"{nope"))),
    tcp("identify_heartbeat_too_high", send(ident(heartbeat_interval=10 ** 9))),
    tcp("identify_sample_rate_invalid", send(ident(sample_rate=200))),
    tcp("bad_magic", send(b"  V1"), magic=False),
    tcp("nop_then_unknown_command", send(c.nop(), 0), send(b"HELLO world\n")),
    tcp("dpub_is_invalid", send(c.dpub("dn", 1000, b"later"))),
    tcp("internal_create_topic_on_cluster", send(b"INTERNAL_CREATE_TOPIC dz 0 false\n")),
    # -- publishing
    tcp("pub_partition", send(c.pub("dn", b"hello", 0)), to="leader:dn:0"),
    tcp("pub_without_identify_partition_1", send(c.pub("dn", b"hi-1", 1)), to="leader:dn:1"),
    tcp("pub_no_partition_token", send(c.pub("dr", b"no-partition")), to="leader:dr:0"),
    tcp("pub_trace", send(ident()), send(c.pub_trace("dn", b"hello-trace", 77, 0)),
        to="leader:dn:0"),
    tcp("pub_trace_zero_id", send(c.pub_trace("dn", b"trace-zero", 0, 0)), to="leader:dn:0"),
    tcp("pub_trace_short_body",
        send(raw_sized(b"PUB_TRACE dn 0\n", 8, b"\x00" * 8)), to="leader:dn:0"),
    tcp("mpub", send(c.mpub("dn", [b"m-a", b"m-b", b"m-c"], 0)), to="leader:dn:0"),
    tcp("mpub_trace", send(c.mpub_trace("dn", [(5, b"mt-a"), (6, b"mt-b")], 0)),
        to="leader:dn:0"),
    tcp("mpub_zero_messages", send(b"MPUB dn 0\n" + _U32.pack(4) + _U32.pack(0)),
        to="leader:dn:0"),
    tcp("pub_empty_body", send(raw_sized(b"PUB dn 0\n", 0)), to="leader:dn:0"),
    tcp("pub_body_too_large", send(raw_sized(b"PUB dn 0\n", 64 << 20)), to="leader:dn:0"),
    tcp("mpub_body_too_large", send(raw_sized(b"MPUB dn 0\n", 64 << 20)), to="leader:dn:0"),
    tcp("pub_bad_partition", send(c.pub("dn", b"x", 7)), to="leader:dn:0"),
    tcp("pub_other_partition_of_node", send(c.pub("dn", b"x", 1)), to="leader:dn:0"),
    tcp("pub_non_numeric_partition", send(raw_sized(b"PUB dn zz\n", 1, b"x")),
        to="leader:dn:0"),
    tcp("pub_replica_not_leader", send(c.pub("dr", b"r", 0)), send(c.pub("dr", b"r2", 0)),
        to="replica:dr:0"),
    tcp("mpub_replica_not_leader", send(c.mpub("dr", [b"a", b"b"], 0)), to="replica:dr:0"),
    tcp("pub_trace_replica_not_leader", send(c.pub_trace("dr", b"trace-r", 3, 0)),
        to="replica:dr:0"),
    tcp("pub_outsider_node", send(c.pub("dr", b"o", 0)), to="outsider:dr"),
    tcp("pub_topic_not_exist", send(c.pub("no_such_topic", b"x", 0))),
    tcp("pub_invalid_topic_name", send(raw_sized(b"PUB bad!name 0\n", 1, b"x"))),
    tcp("pub_to_topic_without_channel", send(c.pub("dx", b"x", 0)), to="leader:dx:0"),
    # -- subscribing
    tcp("sub_replica_not_leader", send(c.sub("dr", "ch", 0)), to="replica:dr:0"),
    tcp("sub_topic_not_exist", send(c.sub("no_such_topic", "ch", 0))),
    tcp("sub_invalid_topic_name", send(b"SUB bad!name ch 0\n")),
    tcp("sub_invalid_channel_name", send(b"SUB dn bad!ch 0\n"), to="leader:dn:0"),
    tcp("sub_twice", send(c.sub("dn", "twice", 0)), send(c.sub("dn", "twice", 0)),
        to="leader:dn:0"),
    tcp("sub_bad_partition", send(c.sub("dn", "ch", 9)), to="leader:dn:0"),
    tcp("sub_missing_channel", send(b"SUB dn\n"), to="leader:dn:0"),
    tcp("rdy_before_sub", send(c.rdy(1), 0), send(c.nop(), 0)),
    tcp("rdy_too_high", send(c.sub("dn", "rdyhigh", 0)), send(c.rdy(100000)),
        to="leader:dn:0"),
    tcp("rdy_not_a_number", send(c.sub("dn", "rdynan", 0)), send(b"RDY x\n"),
        to="leader:dn:0"),
    tcp("fin_before_sub", send(c.fin(bytes(16)))),
    tcp("fin_unknown_id", send(c.sub("dn", "finunknown", 0)),
        send(c.fin(b"\x00\x00\x00\x00\x00\x00\x99\x99" + bytes(8))), send(c.nop(), 0),
        to="leader:dn:0"),
    tcp("fin_hex_id", send(c.sub("dn", "finhex", 0)), send(b"FIN 0000000000000001\n"),
        to="leader:dn:0"),
    tcp("req_unknown_id", send(c.sub("dn", "requnknown", 0)),
        send(c.req(b"\x00" * 7 + b"\x42" + bytes(8), 0)), to="leader:dn:0"),
    tcp("touch_unknown_id", send(c.sub("dn", "touchunknown", 0)),
        send(c.touch(b"\x00" * 7 + b"\x43" + bytes(8))), to="leader:dn:0"),
    tcp("cls_before_sub", send(c.cls())),
    consume("sub_rdy_fin", "dn", 0, [b"one", b"two"], send(fin(S), 1, S), send(fin(S), 0, S)),
    consume("touch_then_fin", "dn", 1, [b"t1"], send(touch(S), 0, S), send(fin(S), 0, S)),
    consume("req_redelivers", "dn", 0, [b"again"], send(req(S), 1, S), send(fin(S), 0, S)),
    consume("req_0_with_more_waiting", "dn", 0, [b"q1", b"q2", b"q3"], send(req(S), 1, S),
            send(fin(S), 1, S), send(fin(S), 1, S), send(fin(S), 0, S),
            deviation="REQ 0 while later messages wait: the real nsqd delivers the next waiting "
                      "message first and the requeued one after it; the dev cluster redelivers "
                      "the requeued one at once"),
    consume("fin_twice", "dn", 0, [b"twice"], send(fin(S), 0, S), send(fin(S), 1, S)),
    consume("cls_after_sub", "dn", 0, [b"bye"], send(c.cls(), 1, S), send(fin(S), 0, S)),
    consume("rdy_2_two_in_flight", "dn", 1, [b"r1", b"r2", b"r3"], send(fin(S, 0), 1, S),
            rdy=2, first=2),
    consume("pub_trace_consume", "dn", 1, [], send(
        c.pub_trace("dn", b"traced-body", 4242, 1), 1, P), recv(1, S), send(fin(S), 0, S),
        first=0),
    consume("sub_advanced_detail", "dn", 0, [b"adv-1", b"adv-2"],
            send(fin(S), 1, S), send(fin(S), 0, S),
            sub=lambda t, ch, p: c.sub_advanced(t, ch, p)),
    # -- ordered
    tcp("ordered_plain_sub_refused", send(c.sub("do", "osub", 0)), to="leader:do:0"),
    tcp("ordered_sub_advanced_refused", send(c.sub_advanced("do", "oadv", 0)),
        to="leader:do:0"),
    tcp("sub_order_misspelt", send(b"SUB_ORDER do och 0\n"), to="leader:do:0"),
    tcp("ordered_pub_without_partition", send(c.pub("do", b"x")), to="leader:do:0"),
    tcp("sub_ordered_normal_topic", send(c.sub_ordered("dn", "ordnormal", 0)),
        to="leader:dn:0"),
    consume("ordered_consume", "do", 0, [b"o-1", b"o-2"],
            send(fin(S), 1, S), send(fin(S), 0, S),
            sub=lambda t, ch, p: c.sub_ordered(t, ch, p)),
    tcp("ordered_pub_trace", send(c.pub_trace("do", b"ord-trace", 9, 1)), to="leader:do:1"),
    # -- ext
    tcp("pub_ext_trace", send(c.pub_ext("de", b"ext-body", {"##trace_id": "12", "k": "v"}, 0)),
        to="leader:de:0"),
    tcp("pub_ext_no_trace", send(c.pub_ext("de", b"ext-body", {"k": "v"}, 0)),
        to="leader:de:0"),
    tcp("pub_ext_to_normal_topic", send(c.pub_ext("dn", b"x", {"k": "v"}, 0)),
        to="leader:dn:0"),
    tcp("mpub_ext", send(c.mpub_ext("de", [({"a": "1"}, b"e1"), (None, b"e2")], 0)),
        to="leader:de:0"),
    tcp("pub_ext_bad_json", send(b"PUB_EXT de 0\n" + _U32.pack(2 + 5 + 1) + b"\x00\x05{nope"
                                 + b"x"), to="leader:de:0",
        deviation="a PUB_EXT header that is not JSON: the real nsqd appends its JSON parser's "
                  "own message to E_INVALID_JSON_HEADER, the dev cluster stops at the code's "
                  "text"),
    consume("ext_consume", "de", 0, [], send(
        c.pub_ext("de", b"with-headers", {"k": "v", "##trace_id": "99"}, 0), 1, P),
        send(c.pub("de", b"plain-on-ext", 0), 1, P), recv(1, S), send(fin(S), 1, S),
        send(fin(S), 0, S), identify=ident(extend_support=True), first=0),
    consume("ext_topic_without_extend_support", "de", 0, [b"plain"], send(fin(S), 0, S),
            identify=ident()),
    tcp("extend_support_on_normal_topic", send(ident(extend_support=True)),
        send(c.sub("dn", "extnormal", 0)), to="leader:dn:0"),
    # -- more handshake and flow
    tcp("identify_tls_not_configured", send(ident(tls_v1=True))),
    tcp("identify_desired_tag", send(ident(desired_tag="tag1"))),
    tcp("identify_unknown_field", send(ident(no_such_field=1))),
    tcp("auth_not_enabled", send(c.auth("secret"))),
    tcp("req_delay_too_long", send(c.sub("dn", "reqlong", 0)),
        send(b"REQ " + bytes(16) + b" 99999999999\n"), to="leader:dn:0"),
    tcp("touch_before_sub", send(c.touch(bytes(16)))),
    tcp("mpub_one_empty_message", send(b"MPUB dn 0\n" + _U32.pack(4 + 4 + 1 + 4) + _U32.pack(2)
                                       + _U32.pack(1) + b"x" + _U32.pack(0)),
        to="leader:dn:0"),
    tcp("mpub_trace_short_message", send(b"MPUB_TRACE dn 0\n" + _U32.pack(4 + 4 + 8)
                                         + _U32.pack(1) + _U32.pack(8) + bytes(8)),
        to="leader:dn:0"),
    tcp("pub_trace_no_partition", send(c.pub_trace("dr", b"trace-nopart", 4)),
        to="leader:dr:0"),
    tcp("sub_no_partition_token", send(c.sub("dr", "nopart")), to="leader:dr:0"),
    tcp("sub_advanced_no_partition", send(c.sub_advanced("dr", "advnopart")),
        to="leader:dr:0"),
    tcp("sub_advanced_bad_start", send(b"SUB_ADVANCED dr advbad 0 nowhere:1\n"),
        to="leader:dr:0"),
    consume("sub_advanced_from_msgcount", "dn", 1, [b"sa-1", b"sa-2", b"sa-3"],
            send(fin(S), 1, S), send(fin(S), 0, S),
            sub=lambda t, ch, p: c.sub_advanced(t, ch, p)),
    consume("ordered_rdy_2_one_in_flight", "do", 1, [b"or-1", b"or-2"],
            send(fin(S), 1, S), send(fin(S), 0, S),
            sub=lambda t, ch, p: c.sub_ordered(t, ch, p), rdy=2),
    consume("ordered_req_redelivers", "do", 1, [b"oq-1", b"oq-2"],
            send(req(S), 1, S), send(fin(S), 1, S), send(fin(S), 0, S),
            sub=lambda t, ch, p: c.sub_ordered(t, ch, p)),
    consume("ext_filter_exact", "de", 0, [], send(
        c.pub_ext("de", b"skip-me", {"color": "red"}, 0), 1, P),
        send(c.pub_ext("de", b"take-me", {"color": "blue"}, 0), 1, P), recv(1, S),
        send(fin(S), 0, S),
        identify=ident(extend_support=True, ext_filter={
            "type": 1, "filter_ext_key": "color", "filter_data": "blue"}), first=0),
    consume("desired_tag_dispatch", "de", 0, [], send(
        c.pub_ext("de", b"tagged-other", {"##client_dispatch_tag": "t2"}, 0), 1, P),
        send(c.pub_ext("de", b"tagged-mine", {"##client_dispatch_tag": "t1"}, 0), 1, P),
        recv(1, S), identify=ident(extend_support=True, desired_tag="t1"), first=0,
        deviation="desired_tag dispatch: within 5 s the real nsqd delivered nothing to a "
                  "consumer whose desired_tag matched a message's ##client_dispatch_tag; the "
                  "dev cluster delivers it at once"),
    tcp("fin_zero_id", send(c.sub("dn", "finzero", 0)), send(c.fin(bytes(16))),
        to="leader:dn:0"),
    # -- counters in /stats while clients are connected
    tcp("stats_clients_and_publishers",
        send(c.sub("ds", "st_anon", 0), 1, "s1"),
        send(ident(output_buffer_size=8192, output_buffer_timeout=5, msg_timeout=30000), 1,
             "s2"),
        send(c.sub("ds", "st_named", 0), 1, "s2"),
        send(c.pub("ds", b"s" * 10, 0), 1, P), send(c.pub("ds", b"m" * 200, 0), 1, P),
        send(c.pub("ds", b"l" * 5000, 0), 1, P), send(c.mpub("ds", [b"a", b"b" * 3000], 0), 1, P),
        stats("ds"), send(c.rdy(1), 1, "s1"), send(fin("s1"), 1, "s1"),
        stats("ds", "st_anon"),
        to={"s1": "leader:ds:0", "s2": "leader:ds:0", P: "leader:ds:0"},
        fixed="youzan channel depth counts from the confirmed position (in flight included); "
              "backlogs; topic client_num counts publishers; client_pub_stats; the extra "
              "fields of a client; consume and delivery counts"),
    tcp("stats_requeue_on_disconnect",
        send(c.sub("ds", "st_gone", 0), 1, S), send(c.pub("ds", b"gone", 0), 1, P),
        send(c.rdy(1), 1, S), send(b"HELLO\n", 1, S), send(c.nop(), 0, P),
        stats("ds", "st_gone"),
        to={S: "leader:ds:0", P: "leader:ds:0"},
        deviation="a message in flight when its consumer goes away counts as a requeue in "
                  "the real nsqd's channel requeue_count; the dev cluster does not count it"),
]


YOUZAN_HTTP = [
    # -- nsqlookupd
    http("lookupd_ping", "GET", "lookupd:leader", "/ping", v1=False),
    http("lookupd_info_v1", "GET", "lookupd:leader", "/info"),
    http("lookupd_info_v0", "GET", "lookupd:follower", "/info", v1=False),
    http("listlookup_v1", "GET", "lookupd:leader", "/listlookup"),
    http("listlookup_v0_follower", "GET", "lookupd:follower", "/listlookup", v1=False),
    http("lookup_read", "GET", "lookupd:leader", "/lookup", {"topic": "dn"}),
    http("lookup_write_meta", "GET", "lookupd:follower", "/lookup",
         {"topic": "dn", "access": "w", "metainfo": "true"}),
    http("lookup_write_partition_1", "GET", "lookupd:leader", "/lookup",
         {"topic": "dn", "access": "w", "partition": "1"}),
    http("lookup_v0_wrapped", "GET", "lookupd:leader", "/lookup",
         {"topic": "dr", "access": "w"}, v1=False),
    http("lookup_metainfo_false", "GET", "lookupd:leader", "/lookup",
         {"topic": "dr", "metainfo": "false"}),
    http("lookup_ordered_meta", "GET", "lookupd:leader", "/lookup",
         {"topic": "do", "access": "w", "metainfo": "true"}),
    http("lookup_ext_meta", "GET", "lookupd:leader", "/lookup",
         {"topic": "de", "access": "r", "metainfo": "1"}),
    http("lookup_no_channel_write", "GET", "lookupd:leader", "/lookup",
         {"topic": "dx", "access": "w"}),
    http("lookup_no_channel_read", "GET", "lookupd:leader", "/lookup", {"topic": "dx"}),
    http("lookup_unknown_read", "GET", "lookupd:leader", "/lookup", {"topic": "nope"}),
    http("lookup_unknown_write_meta", "GET", "lookupd:leader", "/lookup",
         {"topic": "nope", "access": "w", "metainfo": "true"}),
    http("lookup_unknown_write_v0", "GET", "lookupd:leader", "/lookup",
         {"topic": "nope", "access": "w"}, v1=False),
    http("lookup_missing_topic", "GET", "lookupd:leader", "/lookup"),
    http("lookup_bad_access", "GET", "lookupd:leader", "/lookup", {"topic": "dn", "access": "x"}),
    http("lookup_bad_partition", "GET", "lookupd:leader", "/lookup",
         {"topic": "dn", "partition": "x"}),
    http("topics", "GET", "lookupd:leader", "/topics"),
    http("topics_metainfo", "GET", "lookupd:follower", "/topics", {"metaInfo": "true"},
         fixed="registered_channels is null (a Go nil slice) until a channel is registered"),
    http("channels", "GET", "lookupd:leader", "/channels", {"topic": "dn"}),
    http("channels_missing_topic", "GET", "lookupd:leader", "/channels"),
    http("nodes", "GET", "lookupd:leader", "/nodes", merge_producers=True),
    http("lookupd_unknown_path", "GET", "lookupd:leader", "/nosuch"),
    http("topic_create_missing_partition_num", "POST", "lookupd:leader", "/topic/create",
         {"topic": "tc1", "replicator": "1"}),
    http("topic_create_bad_replicator", "POST", "lookupd:leader", "/topic/create",
         {"topic": "tc1", "partition_num": "1", "replicator": "9"}),
    http("topic_create_bad_partition_num", "POST", "lookupd:leader", "/topic/create",
         {"topic": "tc1", "partition_num": "0", "replicator": "1"}),
    http("topic_create_invalid_name", "POST", "lookupd:leader", "/topic/create",
         {"topic": "bad!name", "partition_num": "1", "replicator": "1"}),
    http("topic_create_missing_topic", "POST", "lookupd:leader", "/topic/create",
         {"partition_num": "1", "replicator": "1"}),
    http("topic_create_on_follower", "POST", "lookupd:follower", "/topic/create",
         {"topic": "tc2", "partition_num": "1", "replicator": "1"}),
    http("topic_create_needs_multipart", "POST", "lookupd:leader", "/topic/create",
         {"topic": "tc3", "partition_num": "2", "replicator": "2"}),
    http("topic_create_same_again", "POST", "lookupd:leader", "/topic/create",
         {"topic": "dn", "partition_num": "2", "replicator": "1"}),
    http("topic_create_other_partition_num", "POST", "lookupd:leader", "/topic/create",
         {"topic": "dn", "partition_num": "3", "replicator": "1"},
         fixed=FIX_RECREATE),
    http("topic_create_other_replicator", "POST", "lookupd:leader", "/topic/create",
         {"topic": "dn", "partition_num": "2", "replicator": "2"},
         fixed=FIX_RECREATE),
    http("topic_create_now_ext", "POST", "lookupd:leader", "/topic/create",
         {"topic": "dn", "partition_num": "2", "replicator": "1", "extend": "true"},
         fixed=FIX_RECREATE),
    http("topic_create_ordered_again", "POST", "lookupd:leader", "/topic/create",
         {"topic": "do", "partition_num": "2", "replicator": "1", "orderedmulti": "true"}),
    http("topic_create_get_method", "GET", "lookupd:leader", "/topic/create",
         {"topic": "tc4", "partition_num": "1", "replicator": "1"}),
    http("lookup_partition_0_read", "GET", "lookupd:follower", "/lookup",
         {"topic": "dn", "partition": "0"}),
    http("lookup_consistent", "GET", "lookupd:leader", "/lookup",
         {"topic": "dr", "access": "w", "consistent": "true"}),
    http("listlookup_v1_follower", "GET", "lookupd:follower", "/listlookup"),
    http("lookupd_info_v1_follower", "GET", "lookupd:follower", "/info"),
    http("channels_unknown_topic", "GET", "lookupd:leader", "/channels", {"topic": "nope"}),
    http("channels_partition_1", "GET", "lookupd:leader", "/channels",
         {"topic": "dn", "partition": "1"}),
    http("topic_delete_bad_partition", "POST", "lookupd:leader", "/topic/delete",
         {"topic": "dn", "partition": "0"}),
    http("topic_delete_missing_topic", "POST", "lookupd:leader", "/topic/delete",
         {"partition": "**"}),
    http("lookupd_channel_create_not_disabled", "POST", "lookupd:leader", "/channel/create",
         {"topic": "dn", "channel": "x"}),
    http("tombstone_missing_node", "POST", "lookupd:leader", "/topic/tombstone",
         {"topic": "dn"}),
    # -- nsqd
    http("nsqd_ping", "GET", "any", "/ping", v1=False),
    http("nsqd_ping_v1", "GET", "any", "/ping"),
    http("nsqd_stats_leader_only", "GET", "replica:dr:0", "/stats",
         {"format": "json", "topic": "dr", "leaderOnly": "true"}),
    http("nsqd_stats_replica", "GET", "replica:dr:0", "/stats",
         {"format": "json", "topic": "dr"}, topic="dr", schema=True),
    http("nsqd_stats_v0", "GET", "leader:dn:0", "/stats", {"format": "json", "topic": "none"},
         v1=False),
    http("nsqd_pub_ext", "POST", "leader:de:0", "/pub_ext",
         {"topic": "de", "partition": "0", "ext": '{"k":"v"}'}, body=b"http-ext"),
    http("nsqd_pub_ext_normal_topic", "POST", "leader:dn:0", "/pub_ext",
         {"topic": "dn", "partition": "0", "ext": '{"k":"v"}'}, body=b"x"),
    http("nsqd_pub_bad_partition", "POST", "leader:dn:0", "/pub",
         {"topic": "dn", "partition": "x"}, body=b"x"),
    http("nsqd_pub_ordered_no_partition", "POST", "leader:do:0", "/pub", {"topic": "do"},
         body=b"x"),
    http("nsqd_mpub_binary_bad", "POST", "leader:dn:1", "/mpub",
         {"topic": "dn", "partition": "1", "binary": "true"}, body=b"\x00\x00"),
    http("nsqd_pubtrace_bad_trace_id", "POST", "leader:dn:1", "/pubtrace",
         {"topic": "dn", "partition": "1", "trace_id": "x"}, body=b"t"),
    http("nsqd_message_get_count", "GET", "leader:dn:0", "/message/get",
         {"topic": "dn", "partition": "0", "search_mode": "count", "search_pos": "0"},
         fixed=FIX_MESSAGE_GET),
    http("nsqd_message_get_count_3", "GET", "leader:dn:0", "/message/get",
         {"topic": "dn", "partition": "0", "search_mode": "count", "search_pos": "3"},
         v1=False,
         fixed=FIX_MESSAGE_GET),
    http("nsqd_message_get_offset", "GET", "leader:dn:0", "/message/get",
         {"topic": "dn", "partition": "0", "search_mode": "virtual_offset", "search_pos": "0"},
         fixed=FIX_MESSAGE_GET),
    http("nsqd_message_get_past_end", "GET", "leader:dn:0", "/message/get",
         {"topic": "dn", "partition": "0", "search_mode": "count", "search_pos": "100000"},
         fixed=FIX_MESSAGE_GET),
    http("nsqd_message_get_bad_mode", "GET", "leader:dn:0", "/message/get",
         {"topic": "dn", "partition": "0", "search_mode": "x", "search_pos": "0"},
         fixed=FIX_MESSAGE_GET),
    http("nsqd_message_get_unknown_topic", "GET", "any", "/message/get",
         {"topic": "nope", "partition": "0", "search_mode": "count", "search_pos": "0"},
         fixed=FIX_MESSAGE_GET),
    http("nsqd_message_get_empty", "GET", "leader:dx:0", "/message/get",
         {"topic": "dx", "partition": "0", "search_mode": "count", "search_pos": "0"},
         fixed=FIX_MESSAGE_GET),
    http("nsqd_info_v1", "GET", "any", "/info"),
    http("nsqd_info_v0", "GET", "any", "/info", v1=False),
    http("nsqd_stats_topic", "GET", "leader:dn:0", "/stats", {"format": "json", "topic": "dn"},
         topic="dn", schema=True),
    http("nsqd_stats_counts", "GET", "leader:dr:0", "/stats",
         {"format": "json", "topic": "dr"}, topic="dr",
         fixed="channel message_count counts the partition's messages; msg_size_stats and "
               "msg_write_latency_stats count every message written"),
    http("nsqd_pub", "POST", "leader:dn:1", "/pub", {"topic": "dn", "partition": "1"},
         body=b"http-body"),
    http("nsqd_pub_v0", "POST", "leader:dn:1", "/pub", {"topic": "dn", "partition": "1"},
         v1=False, body=b"http-body"),
    http("nsqd_pub_missing_topic", "POST", "any", "/pub", body=b"x"),
    http("nsqd_pub_unknown_topic", "POST", "any", "/pub", {"topic": "nope"}, body=b"x"),
    http("nsqd_pub_not_leader", "POST", "replica:dr:0", "/pub",
         {"topic": "dr", "partition": "0"}, body=b"x"),
    http("nsqd_pub_empty_body", "POST", "leader:dn:1", "/pub",
         {"topic": "dn", "partition": "1"}),
    http("nsqd_pub_get_method", "GET", "leader:dn:1", "/pub", {"topic": "dn", "partition": "1"}),
    http("nsqd_mpub", "POST", "leader:dn:1", "/mpub", {"topic": "dn", "partition": "1"},
         body=b"a\nb\nc\n"),
    http("nsqd_mpub_binary", "POST", "leader:dn:1", "/mpub",
         {"topic": "dn", "partition": "1", "binary": "true"},
         body=_U32.pack(2) + _U32.pack(2) + b"b1" + _U32.pack(2) + b"b2"),
    http("nsqd_pubtrace", "POST", "leader:dn:1", "/pubtrace",
         {"topic": "dn", "partition": "1", "trace_id": "5"}, body=b"traced"),
    http("nsqd_channel_create", "POST", "leader:dn:0", "/channel/create",
         {"topic": "dn", "partition": "0", "channel": "httpch"}),
    http("nsqd_channel_create_not_leader", "POST", "replica:dr:0", "/channel/create",
         {"topic": "dr", "partition": "0", "channel": "httpch"}),
    http("nsqd_channel_create_missing_channel", "POST", "leader:dn:0", "/channel/create",
         {"topic": "dn", "partition": "0"}),
    http("nsqd_channel_create_unknown_topic", "POST", "any", "/channel/create",
         {"topic": "nope", "partition": "0", "channel": "c"}),
    http("nsqd_channel_delete_unknown", "POST", "leader:dn:0", "/channel/delete",
         {"topic": "dn", "partition": "0", "channel": "never"}),
    http("nsqd_channel_pause", "POST", "leader:dn:0", "/channel/pause",
         {"topic": "dn", "partition": "0", "channel": "httpch"}),
    http("nsqd_channel_unpause", "POST", "leader:dn:0", "/channel/unpause",
         {"topic": "dn", "partition": "0", "channel": "httpch"}),
    http("nsqd_channel_empty", "POST", "leader:dn:0", "/channel/empty",
         {"topic": "dn", "partition": "0", "channel": "httpch"}),
    http("nsqd_channel_setoffset_end", "POST", "leader:dn:0", "/channel/setoffset",
         {"topic": "dn", "partition": "0", "channel": "httpch"}, body=b"special:-1"),
    http("nsqd_channel_setoffset_bad", "POST", "leader:dn:0", "/channel/setoffset",
         {"topic": "dn", "partition": "0", "channel": "httpch"}, body=b"nowhere:1"),
    http("nsqd_channel_setorder", "POST", "leader:dn:0", "/channel/setorder",
         {"topic": "dn", "partition": "0", "channel": "httpch", "order": "true"}),
    http("nsqd_stats_unknown_channel", "GET", "leader:dn:0", "/stats",
         {"format": "json", "topic": "dn", "channel": "never"}, topic="dn",
         fixed="a channel filter naming no channel lists them all; msg_size_stats counts an "
               "MPUB's messages as they are read; depth_ts is zero for a caught-up channel "
               "that never confirmed a message"),
    http("nsqd_channel_stats_after_admin", "GET", "leader:dn:0", "/stats",
         {"format": "json", "topic": "dn", "channel": "httpch"}, topic="dn",
         fixed=FIX_STATS),
    http("nsqd_channel_delete", "POST", "leader:dn:0", "/channel/delete",
         {"topic": "dn", "partition": "0", "channel": "httpch"}),
    http("nsqd_unknown_path", "GET", "any", "/nosuch"),
]

YOUZAN = YOUZAN_TCP + YOUZAN_HTTP

CLASSIC_TCP = [
    tcp("identify_feature_negotiation", send(ident())),
    tcp("identify_no_feature_negotiation", send(ident(feature_negotiation=False))),
    tcp("identify_twice", send(ident()), send(ident())),
    tcp("identify_heartbeat_too_high", send(ident(heartbeat_interval=10 ** 9))),
    tcp("bad_magic", send(b"  V1"), magic=False),
    tcp("pub", send(c.pub("cn", b"hello"))),
    tcp("pub_without_identify_partition_token", send(c.pub("cn", b"p", 0))),
    tcp("mpub", send(c.mpub("cn", [b"a", b"b"]))),
    tcp("dpub", send(c.dpub("cn", 1000, b"later"))),
    tcp("dpub_too_long", send(c.dpub("cn", 10 ** 10, b"later"))),
    tcp("pub_empty_body", send(raw_sized(b"PUB cn\n", 0))),
    tcp("pub_body_too_large", send(raw_sized(b"PUB cn\n", 64 << 20))),
    tcp("pub_bad_topic", send(raw_sized(b"PUB bad!name\n", 1, b"x"))),
    tcp("sub_bad_channel", send(b"SUB cn bad!ch\n")),
    tcp("sub_twice", send(c.sub("cn", "twice")), send(c.sub("cn", "twice"))),
    tcp("sub_ordered_is_invalid", send(b"SUB_ORDERED cn ch 0\n")),
    tcp("pub_trace_is_invalid", send(c.pub_trace("cn", b"xxxxxxxxx", 1))),
    tcp("rdy_too_high", send(c.sub("cn", "rdyhigh")), send(c.rdy(100000))),
    tcp("fin_unknown_id", send(c.sub("cn", "finunknown")), send(b"FIN 0000000000000001\n"),
        send(c.nop(), 0)),
    tcp("cls_before_sub", send(c.cls())),
    tcp("unknown_command", send(b"HELLO\n")),
    tcp("identify_tls_not_configured", send(ident(tls_v1=True))),
    tcp("auth_not_enabled", send(c.auth("secret"))),
    tcp("req_delay_too_long", send(c.sub("cn", "reqlong")),
        send(b"REQ 0000000000000001 99999999999\n")),
    tcp("touch_unknown_id", send(c.sub("cn", "touchunknown")), send(b"TOUCH 0000000000000001\n")),
    tcp("mpub_zero_messages", send(b"MPUB cn\n" + _U32.pack(4) + _U32.pack(0))),
    tcp("mpub_body_too_large", send(raw_sized(b"MPUB cn\n", 64 << 20))),
    tcp("pub_missing_topic", send(raw_sized(b"PUB\n", 1, b"x"))),
    tcp("sub_ephemeral_channel", send(c.sub("cn", "eph#ephemeral"))),
    tcp("rdy_before_sub", send(c.rdy(1), 0), send(c.nop(), 0)),
    classic_consume("sub_rdy_fin", [b"one", b"two"], send(fin(S), 1, S), send(fin(S), 0, S)),
    classic_consume("req_redelivers", [b"again"], send(req(S), 1, S), send(fin(S), 0, S)),
    classic_consume("touch_then_fin", [b"t"], send(touch(S), 0, S), send(fin(S), 0, S)),
    classic_consume("cls_after_sub", [b"bye"], send(c.cls(), 1, S), send(fin(S), 0, S)),
    tcp("stats_client_names_and_producers", send(c.sub("cs", "cs_names"), 1, S),
        send(ident(user_agent="ua/2"), 1, P), send(c.pub("other", b"o"), 1, P),
        Step("http", Http("GET", "any", "/stats",
                          {"format": "json", "topic": "cs", "channel": "cs_names"}, topic="cs")),
        Step("http", Http("GET", "any", "/stats", {"format": "json", "topic": "other"},
                          keep=("producers",))),
        to={S: "any", P: "any"},
        fixed="classic /stats: producers (connected publishers and their counts); client_id "
              "and hostname are the remote host before IDENTIFY"),
    tcp("stats_counters", send(c.sub("cs", "cs_live"), 1, S), send(c.pub("cs", b"c1"), 1, P),
        send(c.pub("cs", b"c2"), 1, P), send(c.mpub("cs", [b"c3", b"c4"]), 1, P),
        send(c.rdy(1), 1, S), send(fin(S), 1, S),
        Step("http", Http("GET", "any", "/stats", {"format": "json", "topic": "cs"},
                          topic="cs")),
        send(fin(S), 0, S), to={S: "any", P: "any"},
        deviation="classic channel message_count: the real nsqd counts every message the "
                  "topic put into the channel, the dev cluster the deliveries"),
]

CLASSIC_HTTP = [
    http("lookupd_ping", "GET", "lookupd:leader", "/ping", v1=False),
    http("lookupd_info", "GET", "lookupd:leader", "/info"),
    http("listlookup_404", "GET", "lookupd:leader", "/listlookup"),
    http("lookup", "GET", "lookupd:leader", "/lookup", {"topic": "cn"}),
    http("lookup_v0", "GET", "lookupd:leader", "/lookup", {"topic": "cn"}, v1=False),
    http("lookup_unknown", "GET", "lookupd:leader", "/lookup", {"topic": "nope"}),
    http("lookup_missing_topic", "GET", "lookupd:leader", "/lookup"),
    http("topics", "GET", "lookupd:leader", "/topics"),
    http("channels", "GET", "lookupd:leader", "/channels", {"topic": "cn"}),
    http("nodes", "GET", "lookupd:leader", "/nodes"),
    http("nsqd_ping", "GET", "any", "/ping", v1=False),
    http("nsqd_info", "GET", "any", "/info"),
    http("nsqd_stats", "GET", "any", "/stats", {"format": "json", "topic": "cn"}, topic="cn",
         schema=True),
    http("nsqd_pub", "POST", "any", "/pub", {"topic": "cn"}, body=b"http"),
    http("nsqd_pub_defer", "POST", "any", "/pub", {"topic": "cn", "defer": "1000"}, body=b"d"),
    http("nsqd_pub_bad_topic", "POST", "any", "/pub", {"topic": "bad!name"}, body=b"x"),
    http("nsqd_pub_missing_topic", "POST", "any", "/pub", body=b"x"),
    http("nsqd_pub_empty_body", "POST", "any", "/pub", {"topic": "cn"}),
    http("nsqd_mpub", "POST", "any", "/mpub", {"topic": "cn"}, body=b"a\nb\n"),
    http("nsqd_mpub_binary_bad", "POST", "any", "/mpub", {"topic": "cn", "binary": "true"},
         body=b"\x00\x00"),
    http("nsqd_channel_create", "POST", "any", "/channel/create",
         {"topic": "cn", "channel": "hc"}),
    http("nsqd_topic_create", "POST", "any", "/topic/create", {"topic": "cn2"}),
    http("nsqd_unknown_path", "GET", "any", "/nosuch"),
    http("lookupd_topic_create", "POST", "lookupd:leader", "/topic/create", {"topic": "cn3"}),
    http("lookupd_topic_create_bad_name", "POST", "lookupd:leader", "/topic/create",
         {"topic": "bad!name"}),
    http("nsqd_info_v0", "GET", "any", "/info", v1=False),
    http("nsqd_stats_counts", "GET", "any", "/stats", {"format": "json", "topic": "cn"},
         topic="cn", keep=("health",)),
    http("nsqd_channel_pause", "POST", "any", "/channel/pause", {"topic": "cn", "channel": "hc"}),
    http("nsqd_channel_delete_unknown", "POST", "any", "/channel/delete",
         {"topic": "cn", "channel": "never"}),
    http("nsqd_topic_pause", "POST", "any", "/topic/pause", {"topic": "cn2"}),
    http("nsqd_topic_delete", "POST", "any", "/topic/delete", {"topic": "cn2"}),
    http("nsqd_topic_delete_unknown", "POST", "any", "/topic/delete", {"topic": "nope"}),
    http("nsqd_pub_unknown_partition_arg", "POST", "any", "/pub", {"topic": "cn", "partition": "3"},
         body=b"x"),
]

CLASSIC = CLASSIC_TCP + CLASSIC_HTTP


# -- the score ---------------------------------------------------------------------------------


@dataclass
class Score:
    """What a run of the differential found, for the closing note."""

    compared: int = 0
    equal: int = 0
    fixed: int = 0          # equal now, after a fix of the dev cluster
    deviations: int = 0     # documented, still different (xfail strict)
    different: list[str] = field(default_factory=list)   # undocumented differences
    seconds: float = 0.0

    def add(self, mode: str, exchange: Exchange, equal: bool) -> None:
        self.compared += 1
        if equal:
            self.equal += 1
            self.fixed += exchange.fixed is not None
        elif exchange.deviation is not None:
            self.deviations += 1
        else:
            self.different.append(f"{mode}/{exchange.name}")

    def line(self) -> str:
        text = (f"differential: {self.compared} exchanges compared, {self.equal} equal "
                f"({self.fixed} of them after fixes to the dev cluster), {self.deviations} "
                f"documented deviations, {len(self.different)} undocumented differences")
        if self.seconds:
            text += f" in {self.seconds:.1f} s"
        if self.different:
            text += ": " + ", ".join(self.different)
        return text


def exchanges(mode: str) -> list[Exchange]:
    return YOUZAN if mode == "youzan" else CLASSIC


def differences(dev: Any, real: Any, path: str = "") -> list[str]:
    """Where two transcripts differ, one line per differing leaf: ``path: dev X, real Y``."""
    if isinstance(dev, dict) and isinstance(real, dict):
        out: list[str] = []
        for key in sorted(set(dev) | set(real), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in dev or key not in real:
                out.append(f"{where}: dev {dev.get(key, '<absent>')!r:.200}, "
                           f"real {real.get(key, '<absent>')!r:.200}")
            else:
                out += differences(dev[key], real[key], where)
        return out
    if isinstance(dev, list) and isinstance(real, list) and len(dev) == len(real):
        out = []
        for i, (a, b) in enumerate(zip(dev, real, strict=True)):
            out += differences(a, b, f"{path}[{i}]")
        return out
    if dev != real:
        return [f"{path or '.'}: dev {dev!r:.300}, real {real!r:.300}"]
    return []
