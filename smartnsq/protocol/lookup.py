"""nsqlookupd's HTTP answers as typed, immutable views (sans-I/O: status + body in).

The same question gets several shapes of answer, and a client must read them all the same way
(docs/protocol.md §2):

* youzan lookupds wrap the data in ``{"status_code","status_txt","data"}`` unless asked with
  ``Accept: application/vnd.nsq; version=1.0``; wrapped errors arrive as HTTP 500 with the
  text in ``status_txt``. Classic lookupds never wrap. :func:`unwrap` folds both into
  ``(status, data, message)``.
* ``/lookup``: a youzan answer always carries ``partitions`` (possibly ``{}`` or ``null``),
  a classic one never does; that key, not the version string, says which kind answered.
* a missing topic is a 404 (``TOPIC_NOT_FOUND`` classic, ``Key not found`` youzan writers),
  a wrapped 500 ``Key not found``, or, for youzan readers, a 200 with nothing listed and a
  zeroed ``meta``. All of them become :class:`~smartnsq.errors.TopicNotFound`.

Several lookupds answer the same question; :func:`merge_views` folds their views into one, so
a lookupd that lags behind (or missed a registration) does not hide nodes the others know.

An answer is untrusted input: it may list 10^5 partitions or nodes with addresses no client
should dial. :class:`LookupLimits` bounds what :func:`parse_lookup` accepts, and every node's
``broadcast_address`` must be a host name or an IP address (:func:`valid_host`); anything else
is a :class:`~smartnsq.errors.ProtocolError` naming what was wrong.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ..errors import LookupdError, ProtocolError, TopicNotFound, TopicNotWritable
from .diagnose import first_line, is_html, lookupd_hint
from .numbers import is_int
from .validate import MAX_PARTITION, ascii_int

__all__ = [
    "ACCEPT_V1",
    "Access",
    "LookupLimits",
    "LookupdList",
    "Node",
    "Partition",
    "TopicMeta",
    "TopicView",
    "lookup_params",
    "merge_views",
    "parse_listlookup",
    "parse_lookup",
    "unwrap",
    "valid_host",
]

ACCEPT_V1 = "application/vnd.nsq; version=1.0"
"""The Accept header that makes youzan lookupds answer bare JSON with real status codes."""

Access = Literal["r", "w"]
YOUZAN_VERSION_MARK = "-HA."
MAX_LOOKUPDS = 64  # a /listlookup naming more is not a real cluster
OLD_VERSION_PID = -11  # pseudo partition of classic nsqd registered to a youzan lookupd

# 404/500 texts that mean "this topic does not exist" (classic, youzan etcd, youzan wrapped)
_NOT_FOUND_TEXTS = frozenset({"TOPIC_NOT_FOUND", "Key not found"})
_NO_CHANNEL_PREFIX = "Topic has no channel"
_NO_ROUTE_TEXT = "NOT_FOUND"  # nsqd's (and any Go NSQ daemon's) answer to an unknown path
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})"
                        r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62}))*\.?\Z")


def valid_host(host: str) -> bool:
    """A DNS name, an IPv4 address, or an IPv6 address (bare or in brackets): what may be
    dialled. Spaces, slashes, commas, ``@`` and the like never are."""
    if not isinstance(host, str) or not host:
        return False
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            return False
        return True
    return host is bare and _HOST_NAME.match(host) is not None


@dataclass(frozen=True)
class LookupLimits:
    """How much of a ``/lookup`` answer is believed (real clusters are far below these)."""

    max_partitions: int = MAX_PARTITION + 1
    """Most partitions listed, and partition ids below this (never above ``MAX_PARTITION``,
    the one partition limit: a message id carries its partition in 10 bits)."""
    max_nodes: int = 4096
    """Most producers listed."""


@dataclass(frozen=True)
class Node:
    """One nsqd as lookupd reports it; equal when it is the same server.

    ``remote_address``/``hostname``/``distributed_id`` are left out of equality: the first
    is nsqd's ephemeral outbound port as one lookupd saw it and differs between lookupds.
    """

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str = field(default="", compare=False)
    version: str = ""
    remote_address: str = field(default="", compare=False)
    distributed_id: str = field(default="", compare=False)

    @property
    def address(self) -> tuple[str, int]:
        """Where to connect: ``(broadcast_address, tcp_port)``."""
        return (self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        return f"{self.broadcast_address}:{self.http_port}"

    @property
    def youzan(self) -> bool:
        """A youzan ("HA") nsqd, judged by its version string as JV does."""
        return YOUZAN_VERSION_MARK in self.version

    def __str__(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"


@dataclass(frozen=True)
class TopicMeta:
    """The topic's settings as etcd holds them (``metainfo`` lookups on a youzan cluster).

    All zero/false for a topic etcd does not know.
    """

    partition_num: int
    replica: int
    ordered: bool
    extend_support: bool
    multi_part: bool = False
    disable_channel_auto_create: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def known(self) -> bool:
        return self.partition_num > 0

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (Spark ships views to executors)
        return (TopicMeta, (self.partition_num, self.replica, self.ordered, self.extend_support,
                            self.multi_part, self.disable_channel_auto_create, dict(self.raw)))


@dataclass(frozen=True)
class Partition:
    """One partition and its leader (``None`` while it has none, e.g. mid-failover)."""

    id: int
    leader: Node | None
    replicas: tuple[Node, ...] = ()


@dataclass(frozen=True)
class TopicView:
    """What the lookupds say about one topic for readers (``"r"``) or writers (``"w"``).

    ``youzan`` is true when a youzan lookupd answered (the answer had ``partitions``);
    ``partitions`` then maps each partition with a leader to it, while ``producers`` lists
    every node serving the topic (for a classic lookupd, the only information). ``lookupds``
    records who answered; it does not take part in equality.
    """

    topic: str
    access: str
    youzan: bool
    meta: TopicMeta | None
    partitions: Mapping[int, Partition]
    producers: tuple[Node, ...]
    channels: tuple[str, ...] = field(default=(), compare=False)
    lookupds: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, MappingProxyType):
            object.__setattr__(self, "partitions", MappingProxyType(dict(self.partitions)))

    def __hash__(self) -> int:
        return hash((self.topic, self.access, self.youzan, self.meta,
                     tuple(sorted(self.partitions.items())), self.producers))

    def __reduce__(self) -> tuple[Any, ...]:  # a mappingproxy does not pickle; a dict does
        return (TopicView, (self.topic, self.access, self.youzan, self.meta,
                            dict(self.partitions), self.producers, self.channels,
                            self.lookupds))

    @property
    def partition_num(self) -> int:
        """The partition count from meta (0 when unknown: classic, standalone)."""
        return self.meta.partition_num if self.meta is not None else 0

    @property
    def ordered(self) -> bool:
        return self.meta is not None and self.meta.ordered

    @property
    def extend_support(self) -> bool:
        return self.meta is not None and self.meta.extend_support

    def leader(self, partition: int) -> Node | None:
        p = self.partitions.get(partition)
        return None if p is None else p.leader

    def leaders(self) -> dict[int, Node]:
        """Partition id -> leader, for partitions that have one."""
        return {pid: p.leader for pid, p in sorted(self.partitions.items())
                if p.leader is not None}

    @property
    def unpartitioned(self) -> tuple[Node, ...]:
        """Producers leading no listed partition: classic nsqd (served without a partition)."""
        leading = {p.leader.address for p in self.partitions.values() if p.leader is not None}
        return tuple(n for n in self.producers if n.address not in leading)

    @property
    def empty(self) -> bool:
        return not self.partitions and not self.producers


@dataclass(frozen=True)
class LookupdList:
    """A ``/listlookup`` answer: every lookupd of the cluster (``"host:http_port"``).

    ``classic`` is true when the route does not exist (classic nsqlookupd, 404): the asked
    lookupd is then the only one. An empty ``nodes`` with ``classic`` false means a standalone
    youzan lookupd (no coordinator): likewise use the asked one.
    """

    nodes: tuple[str, ...]
    leader: str | None
    classic: bool = False


# -- envelope -----------------------------------------------------------------------------------

def _load_json(body: bytes | str, status: int) -> Any:
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    if not text.strip():
        return None  # an empty 200 body counts as no data (as GO reads it)
    try:
        return json.loads(text)
    except ValueError:
        if is_html(text) and status >= 500:  # a proxy's error page: the lookupd behind it
            return {"message": f"an HTML page ({first_line(text)!r})"}  # may come back
        if is_html(text):  # some other web server: say so, show no page
            raise ProtocolError(lookupd_hint(f"an HTML page (HTTP {status}, "
                                             f"{first_line(text)!r})")) from None
        if status >= 400:
            return {"message": first_line(text)}
        raise ProtocolError(f"lookupd answer is not JSON: {first_line(text)!r}") from None


def unwrap(status: int, body: bytes | str) -> tuple[int, Any, str]:
    """``(effective status, data, error message)`` from either envelope.

    The wrapped form's ``status_code``/``status_txt`` replace the HTTP status and the error
    text; a bare error is ``{"message": ...}``.
    """
    value = _load_json(body, status)
    if (isinstance(value, dict) and "status_code" in value and "data" in value
            and set(value) <= {"status_code", "status_txt", "data"}):
        code = value.get("status_code")
        text = value.get("status_txt")
        status = code if is_int(code) else status
        message = text if isinstance(text, str) else ""
        return status, value.get("data"), "" if status == 200 else message
    if status != 200:
        message = ""
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            message = value["message"]
        return status, None, message
    return status, value, ""


# -- /lookup ------------------------------------------------------------------------------------

def lookup_params(topic: str, access: str, *, partition: int | None = None,
                  metainfo: bool = True) -> dict[str, str]:
    """Query parameters of a ``/lookup``: meta is always asked for, it is cheap and decides
    sharding, ordering and ext."""
    params = {"topic": topic, "access": access}
    if metainfo:
        params["metainfo"] = "true"
    if partition is not None:
        params["partition"] = str(partition)
    return params


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _port(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool):
        raise ProtocolError(f"lookupd peer {key} is not a port: {value!r:.40}")
    if isinstance(value, str) and len(value) <= 5:
        value = ascii_int(value)
    low = 1 if key == "tcp_port" else 0  # a node is dialled on its tcp_port
    if not isinstance(value, int) or not low <= value < 65536:
        raise ProtocolError(f"lookupd peer {key} is not a port: {value!r:.40}")
    return value


def parse_node(obj: Any) -> Node:
    """One peer object (``producers[i]`` or ``partitions[pid]``)."""
    if not isinstance(obj, Mapping):
        raise ProtocolError(f"lookupd peer is not an object: {obj!r}")
    address = _str(obj, "broadcast_address")
    if not address:
        raise ProtocolError(f"lookupd peer has no broadcast_address: {obj!r:.120}")
    if not valid_host(address):
        raise ProtocolError(f"lookupd peer broadcast_address is not a host: {address!r:.80}")
    return Node(address, _port(obj, "tcp_port"), _port(obj, "http_port"),
                hostname=_str(obj, "hostname"), version=_str(obj, "version"),
                remote_address=_str(obj, "remote_address"),
                distributed_id=_str(obj, "distributed_id"))


def _bool(value: Any) -> bool:
    return value is True or value == "true"


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return ascii_int(value, signed=True) or 0
    return 0


def parse_meta(obj: Any) -> TopicMeta | None:
    if not isinstance(obj, Mapping):
        return None
    partition_num = max(_int(obj.get("partition_num")), 0)
    if partition_num > MAX_PARTITION + 1:
        raise ProtocolError(f"lookupd meta partition_num {partition_num} is over "
                            f"{MAX_PARTITION + 1} (partitions are 0..{MAX_PARTITION})")
    return TopicMeta(partition_num=partition_num,
                     replica=max(_int(obj.get("replica")), 0),
                     ordered=_bool(obj.get("ordered")),
                     extend_support=_bool(obj.get("extend_support")),
                     multi_part=_bool(obj.get("multi_part")),
                     disable_channel_auto_create=_bool(obj.get("disable_channel_auto_create")),
                     raw=MappingProxyType(dict(obj)))


def _dedupe(nodes: Iterable[Node]) -> tuple[Node, ...]:
    """Unique by address (first seen wins), sorted: lookupds list producers in any order, and
    a reordering is not a change."""
    seen: dict[tuple[str, int], Node] = {}
    for node in nodes:
        seen.setdefault(node.address, node)
    return tuple(seen[a] for a in sorted(seen))


def parse_lookup(topic: str, access: str, status: int, body: bytes | str, *,
                 lookupd: str = "", limits: LookupLimits = LookupLimits()) -> TopicView:
    """A ``/lookup`` answer as a :class:`TopicView`.

    Raises :class:`~smartnsq.errors.TopicNotFound` when the answer says the topic does not
    exist, :class:`TopicNotWritable` (a ``TopicNotFound``) when a youzan lookupd hides every
    partition for lack of a channel, :class:`LookupdError` for any other error status, and
    :class:`~smartnsq.errors.ProtocolError` for a body that is not a lookup answer or breaks
    ``limits``.
    """
    status, data, message = unwrap(status, body)
    if status != 200:
        if status in (404, 500) and message in _NOT_FOUND_TEXTS:
            raise TopicNotFound(topic)
        if status == 404 and message == _NO_ROUTE_TEXT:
            # /lookup is unknown here: nsqd's HTTP API answers so (lookupd has the route)
            raise LookupdError(404, lookupd_hint(f"nsqd's 404 {_NO_ROUTE_TEXT} to /lookup"),
                               retriable=False)
        if message.startswith(_NO_CHANNEL_PREFIX):
            raise TopicNotWritable(topic, message)
        raise LookupdError(status, message or f"HTTP {status}")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ProtocolError(f"lookupd /lookup answer is not an object: {data!r:.80}")
    youzan = "partitions" in data
    meta = parse_meta(data.get("meta"))
    partitions: dict[int, Partition] = {}
    raw_parts = data.get("partitions")
    if isinstance(raw_parts, Mapping):
        if len(raw_parts) > limits.max_partitions:
            raise ProtocolError(f"lookupd lists {len(raw_parts)} partitions, more than the "
                                f"{limits.max_partitions} believed (max_partitions)")
        for key, peer in raw_parts.items():
            try:
                pid = int(key)
            except (TypeError, ValueError):
                raise ProtocolError(f"lookupd partition id {key!r} is not a number") from None
            if pid < 0:  # the classic pseudo partition never names a real partition
                continue
            if pid > MAX_PARTITION:
                raise ProtocolError(f"lookupd partition id {pid} is outside 0..{MAX_PARTITION}"
                                    " (the partitions a message id can carry)")
            if pid >= limits.max_partitions:
                raise ProtocolError(f"lookupd partition id {pid} is not below "
                                    f"{limits.max_partitions} (max_partitions)")
            partitions[pid] = Partition(pid, parse_node(peer))
    elif raw_parts is not None:
        raise ProtocolError(f"lookupd partitions is not an object: {raw_parts!r:.80}")
    raw_producers = data.get("producers")
    if raw_producers is None:
        raw_producers = []  # youzan with writes disabled answers null
    if not isinstance(raw_producers, list):
        raise ProtocolError(f"lookupd producers is not a list: {raw_producers!r:.80}")
    if len(raw_producers) > limits.max_nodes:
        raise ProtocolError(f"lookupd lists {len(raw_producers)} producers, more than the "
                            f"{limits.max_nodes} believed (max_nodes)")
    producers = _dedupe(parse_node(p) for p in raw_producers)
    raw_channels = data.get("channels")
    channels = tuple(c for c in raw_channels if isinstance(c, str)) \
        if isinstance(raw_channels, list) else ()
    view = TopicView(topic, access, youzan, meta, dict(sorted(partitions.items())), producers,
                     channels, (lookupd,) if lookupd else ())
    if youzan and view.empty and meta is not None and not meta.known:
        # youzan readers get 200 with nothing listed and a zeroed meta for an unknown topic
        raise TopicNotFound(topic)
    return view


def merge_views(views: Iterable[TopicView]) -> TopicView:
    """One view from the answers of several lookupds (at least one).

    Producers are the union (keyed by ``broadcast_address:tcp_port``, first seen wins, sorted); each
    partition's leader is the one most lookupds name, ties going to the earlier answer (pass
    them healthiest lookupd first); meta is the first one that knows the topic.
    """
    views = list(views)
    if not views:
        raise ValueError("merge_views needs at least one view")
    if len(views) == 1:
        return views[0]
    first = views[0]
    votes: dict[int, Counter[Node]] = {}
    order: dict[int, list[Node]] = {}
    for view in views:
        for pid, part in view.partitions.items():
            if part.leader is None:
                continue
            votes.setdefault(pid, Counter())[part.leader] += 1
            order.setdefault(pid, [])
            if part.leader not in order[pid]:
                order[pid].append(part.leader)
    partitions: dict[int, Partition] = {}
    for pid in sorted(votes):
        counts = votes[pid]
        best = max(order[pid], key=lambda n: (counts[n], -order[pid].index(n)))
        partitions[pid] = Partition(pid, best)
    meta = next((v.meta for v in views if v.meta is not None and v.meta.known),
                next((v.meta for v in views if v.meta is not None), None))
    producers = _dedupe(n for v in views for n in v.producers)
    channels = tuple(dict.fromkeys(c for v in views for c in v.channels))
    lookupds = tuple(dict.fromkeys(a for v in views for a in v.lookupds))
    return TopicView(first.topic, first.access, any(v.youzan for v in views), meta, partitions,
                     producers, channels, lookupds)


# -- /listlookup --------------------------------------------------------------------------------

def _lookupd_address(obj: Any) -> str | None:
    if not isinstance(obj, Mapping):
        return None
    ip = obj.get("NodeIP", obj.get("NodeIp", obj.get("node_ip")))
    port = obj.get("HttpPort", obj.get("http_port"))
    if not isinstance(ip, str) or not ip or port in (None, ""):
        return None
    try:
        port_num = int(port)
    except (TypeError, ValueError):
        return None
    if not 0 < port_num < 65536:
        return None
    host = f"[{ip}]" if ":" in ip and not ip.startswith("[") else ip
    if not valid_host(host):
        return None
    return f"{host}:{port_num}"


def parse_listlookup(status: int, body: bytes | str) -> LookupdList:
    """A ``/listlookup`` answer; a 404 means a classic lookupd (:attr:`LookupdList.classic`)."""
    status, data, message = unwrap(status, body)
    if status == 404:
        return LookupdList((), None, classic=True)
    if status != 200:
        raise LookupdError(status, message or f"HTTP {status}")
    if data is None:
        return LookupdList((), None)  # standalone lookupd: no coordinator, no list
    if not isinstance(data, Mapping):
        raise ProtocolError(f"lookupd /listlookup answer is not an object: {data!r:.80}")
    raw_nodes = data.get("lookupdnodes")
    nodes: list[str] = []
    if isinstance(raw_nodes, list):
        for obj in raw_nodes:
            address = _lookupd_address(obj)
            if len(nodes) >= MAX_LOOKUPDS:
                raise ProtocolError(f"lookupd lists more than {MAX_LOOKUPDS} lookupds")
            if address is not None and address not in nodes:
                nodes.append(address)
    return LookupdList(tuple(nodes), _lookupd_address(data.get("lookupdleader")))
