"""nsqd's and nsqlookupd's administrative HTTP answers as typed values (sans-I/O).

The clients in :mod:`smartnsq.admin` send the requests; what the servers answer is read here,
once, for every caller (the CLI, the demo, compat's probe, the dev cluster's helpers):

* write endpoints (``/topic/create``, ``/channel/create``, ``/channel/setoffset``, ...) answer
  an empty 200 or an error, bare ``{"message": ...}`` with the real status (the ``V1``
  decorator) or, from endpoints that negotiate, wrapped in ``{"status_code","status_txt"}``;
  :func:`parse_write` turns every error into one :class:`AdminError` whose ``code`` is the
  server's error token (``E_FAILED_ON_NOT_LEADER``, ``INVALID_ARG_TOPIC``...).
* ``/stats?format=json`` differs between kinds: youzan lists one entry per partition a node
  holds (``topic_partition`` is a string, ``is_leader`` says whether it leads it), classic
  one entry per topic; :func:`parse_stats` reads both into :class:`NodeStats`.
* ``/info``: youzan answers ``ha_support`` (and, on nsqd, its addresses); classic only
  ``version`` (docs/protocol.md §2.4).
* ``/lookup`` and ``/listlookup`` are :mod:`smartnsq.protocol.lookup`'s; they are re-exported
  here so an admin caller has one import.

The request side is built here too (query parameters and bodies), validated before anything
is sent, every error naming the field. :func:`creation_progress` is the pure decision of the
create-topic workflow: from what lookups say, which partitions still lack a leader or a
writable listing, and whether the create must be sent again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import AdminError, InvalidArgument, ProtocolError
from . import validate
from .commands import StartPosition
from .lookup import (
    ACCEPT_V1,
    Node,
    TopicView,
    parse_node,
    unwrap,
)
from .numbers import check_int, is_int
from .validate import ascii_int

__all__ = [
    "ACCEPT_V1",
    "MAX_PARTITION_NUM",
    "MAX_REPLICATOR",
    "ChannelStats",
    "CreationProgress",
    "NodeInfo",
    "NodeStats",
    "TopicStats",
    "channel_params",
    "creation_progress",
    "leaders_of",
    "parse_info",
    "parse_nodes",
    "parse_stats",
    "parse_write",
    "setoffset_body",
    "stats_params",
    "topic_create_params",
    "topic_delete_params",
]

MAX_PARTITION_NUM = 255
"""The largest ``partition_num`` a youzan lookupd accepts (``doCreateTopic``)."""
MAX_REPLICATOR = 5
"""The largest ``replicator`` a youzan lookupd accepts."""



# -- write endpoints ----------------------------------------------------------------------------

def parse_write(status: int, body: bytes | str, *, what: str = "",
                address: str = "") -> None:
    """Nothing for a success (any 2xx, whatever the body), :class:`AdminError` otherwise."""
    if 200 <= status < 300:
        return
    try:
        status, _, message = unwrap(status, body)
    except ProtocolError:
        message = ""
    if 200 <= status < 300:  # a wrapped success sent with another HTTP status
        return
    if not message:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else body
        message = " ".join(text.split())[:200]
    raise AdminError(status, message, what=what, address=address)


def _flag(params: dict[str, str], name: str, on: bool) -> None:
    if on:
        params[name] = "true"


def _int_in(name: str, value: object, low: int, high: int) -> int:
    return check_int(name, value, low, high)


def topic_create_params(topic: str, partition_num: int = 1, replicator: int = 1, *,
                        ordered: bool = False, ext: bool = False, multipart: bool = False,
                        disable_channel_auto_create: bool = False,
                        retention_days: int | None = None,
                        sync_every: int | None = None) -> dict[str, str]:
    """The query of a youzan ``POST /topic/create`` (lookupd leader), checked.

    ``ordered`` sends ``orderedmulti=true`` (an ordered topic's partitions may share nodes);
    ``multipart`` lets partitions x replicas exceed the number of nsqd (docs/protocol.md §10).
    """
    validate.check_topic(topic)
    params = {"topic": topic,
              "partition_num": str(_int_in("partition_num", partition_num, 1,
                                           MAX_PARTITION_NUM)),
              "replicator": str(_int_in("replicator", replicator, 1, MAX_REPLICATOR))}
    _flag(params, "orderedmulti", ordered)
    _flag(params, "extend", ext)
    _flag(params, "multipart", multipart)
    _flag(params, "disable_channel_auto_create", disable_channel_auto_create)
    if retention_days is not None:
        params["retention"] = str(_int_in("retention_days", retention_days, 1, 3650))
    if sync_every is not None:
        params["syncdisk"] = str(_int_in("sync_every", sync_every, 1, 1_000_000))
    return params


def topic_delete_params(topic: str, *, youzan: bool = True) -> dict[str, str]:
    """``/topic/delete``: youzan lookupds only delete every partition at once (``**``)."""
    validate.check_topic(topic)
    return {"topic": topic, "partition": "**"} if youzan else {"topic": topic}


def channel_params(topic: str, channel: str, partition: int | None = None) -> dict[str, str]:
    """The query of nsqd's ``/channel/*`` endpoints; without ``partition`` a youzan nsqd
    picks the partition it leads."""
    validate.check_topic(topic)
    validate.check_channel(channel)
    params = {"topic": topic, "channel": channel}
    if partition is not None:
        params["partition"] = str(validate.check_partition(partition))
    return params


def setoffset_body(position: StartPosition) -> bytes:
    """The body of ``POST /channel/setoffset``: the same ``kind:value`` token SUB_ADVANCED
    takes (``timestamp:``, ``virtual_queue:``, ``msgcount:``, ``special:-1``)."""
    if not isinstance(position, StartPosition):
        raise InvalidArgument("position", "must be a StartPosition", position)
    return position.token()


def stats_params(topic: str | None = None, channel: str | None = None,
                 partition: int | None = None, *, leader_only: bool = False) -> dict[str, str]:
    params = {"format": "json"}
    if topic is not None:
        params["topic"] = validate.check_topic(topic)
    if channel is not None:
        params["channel"] = validate.check_channel(channel)
    if partition is not None:
        params["partition"] = str(validate.check_partition(partition))
    _flag(params, "leaderOnly", leader_only)
    return params


# -- /stats -------------------------------------------------------------------------------------

def _opt_int(obj: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = obj.get(key)
        if is_int(value):
            return value
    return None


def _count(obj: Mapping[str, Any], *keys: str) -> int:
    value = _opt_int(obj, *keys)
    return 0 if value is None else value


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _opt_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class ChannelStats:
    """One channel of one topic (partition) on one nsqd, as its ``/stats`` reports it."""

    name: str
    depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    requeued: int = 0
    timed_out: int = 0
    message_count: int = 0
    clients: int = 0
    paused: bool = False
    skipped: bool = False
    backlogs: int | None = None  # youzan only


@dataclass(frozen=True)
class TopicStats:
    """One topic on one nsqd; on youzan nodes one partition of it.

    ``partition`` and ``leader`` are ``None`` on classic nodes. A youzan node also reports
    the partitions it only replicates (``leader`` false): their counters are not the ones
    consumers see. ``backend_start``/``backend_depth`` bound the partition's queue in bytes
    (youzan; where setoffset ``virtual_queue:`` positions are).
    """

    name: str
    partition: int | None
    leader: bool | None
    depth: int = 0
    message_count: int = 0
    backend_depth: int | None = None
    backend_start: int | None = None
    ordered: bool = False
    ext: bool = False
    paused: bool = False
    channels: tuple[ChannelStats, ...] = ()

    def channel(self, name: str) -> ChannelStats | None:
        return next((c for c in self.channels if c.name == name), None)

    @property
    def waiting(self) -> int | None:
        """Messages in the topic not yet given to a channel: classic's ``depth``. ``None`` on
        youzan, whose channels read the partition's queue themselves."""
        return self.depth if self.partition is None else None

    @property
    def queue_bytes(self) -> int | None:
        """youzan: the partition's queue in bytes, which its node reports as the topic's
        ``depth`` (240 for six messages in the capture); ``None`` on classic."""
        return self.depth if self.partition is not None else None


@dataclass(frozen=True)
class NodeStats:
    """An nsqd ``/stats?format=json`` answer."""

    version: str
    health: str
    start_time: int | None
    topics: tuple[TopicStats, ...] = field(default=())

    @property
    def youzan(self) -> bool:
        return "-HA." in self.version

    def topic(self, name: str, partition: int | None = None) -> TopicStats | None:
        """The entry of ``name`` (of ``partition`` on youzan nodes; the first otherwise)."""
        return next((t for t in self.topics if t.name == name
                     and (partition is None or t.partition == partition)), None)

    def partitions(self, name: str, *, leader: bool | None = None) -> tuple[TopicStats, ...]:
        """Every entry of ``name`` on this node (only those it leads, or only replicas)."""
        return tuple(t for t in self.topics if t.name == name
                     and (leader is None or t.leader is leader))


def _channel_stats(obj: Any) -> ChannelStats:
    if not isinstance(obj, Mapping):
        raise ProtocolError(f"nsqd /stats channel is not an object: {obj!r:.80}")
    clients = _opt_int(obj, "client_num", "client_count")
    if clients is None:
        raw = obj.get("clients")
        clients = len(raw) if isinstance(raw, list) else 0
    return ChannelStats(
        name=_text(obj, "channel_name"), depth=_count(obj, "depth"),
        in_flight=_count(obj, "in_flight_count"), deferred=_count(obj, "deferred_count"),
        requeued=_count(obj, "requeue_count"), timed_out=_count(obj, "timeout_count"),
        message_count=_count(obj, "message_count"), clients=clients,
        paused=obj.get("paused") is True, skipped=obj.get("skipped") is True,
        backlogs=_opt_int(obj, "backlogs"))


def _partition_of(value: object) -> int | None:
    if value is None or value == "":
        return None
    if is_int(value):
        return value
    number = ascii_int(value, signed=True) if isinstance(value, str) else None
    if number is not None:
        return number
    raise ProtocolError(f"nsqd /stats topic_partition is not a number: {value!r:.40}")


def _topic_stats(obj: Any) -> TopicStats:
    if not isinstance(obj, Mapping):
        raise ProtocolError(f"nsqd /stats topic is not an object: {obj!r:.80}")
    channels = obj.get("channels")
    if channels is not None and not isinstance(channels, list):
        raise ProtocolError(f"nsqd /stats channels is not a list: {channels!r:.80}")
    return TopicStats(
        name=_text(obj, "topic_name"), partition=_partition_of(obj.get("topic_partition")),
        leader=_opt_bool(obj.get("is_leader")), depth=_count(obj, "depth"),
        message_count=_count(obj, "message_count"),
        backend_depth=_opt_int(obj, "backend_depth"),
        backend_start=_opt_int(obj, "backend_start"),
        ordered=obj.get("is_multi_ordered") is True, ext=obj.get("is_ext") is True,
        paused=obj.get("paused") is True,
        channels=tuple(_channel_stats(c) for c in channels or ()))


def _data(status: int, body: bytes | str, what: str, address: str) -> Any:
    status, data, message = unwrap(status, body)
    if status != 200:
        raise AdminError(status, message or f"HTTP {status}", what=what, address=address)
    return data


def parse_stats(status: int, body: bytes | str, *, address: str = "") -> NodeStats:
    """An nsqd ``/stats?format=json`` answer (either envelope, either kind)."""
    data = _data(status, body, "nsqd /stats", address)
    if not isinstance(data, Mapping):
        raise ProtocolError(f"nsqd /stats answer is not an object: {data!r:.80}")
    topics = data.get("topics")
    if topics is not None and not isinstance(topics, list):
        raise ProtocolError(f"nsqd /stats topics is not a list: {topics!r:.80}")
    return NodeStats(version=_text(data, "version"), health=_text(data, "health"),
                     start_time=_opt_int(data, "start_time"),
                     topics=tuple(_topic_stats(t) for t in topics or ()))


# -- /info, /nodes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeInfo:
    """An nsqd or nsqlookupd ``/info`` answer.

    ``ha_support`` is ``None`` on classic servers (they do not send it), true on youzan ones
    running with a coordinator. The addresses are nsqd's (lookupds answer only the version).
    """

    version: str
    ha_support: bool | None = None
    broadcast_address: str = ""
    hostname: str = ""
    tcp_port: int | None = None
    http_port: int | None = None
    start_time: int | None = None

    @property
    def youzan(self) -> bool:
        return self.ha_support is not None or "-HA." in self.version


def parse_info(status: int, body: bytes | str, *, address: str = "") -> NodeInfo:
    data = _data(status, body, "/info", address)
    if not isinstance(data, Mapping):
        raise ProtocolError(f"/info answer is not an object: {data!r:.80}")
    return NodeInfo(version=_text(data, "version"), ha_support=_opt_bool(data.get("ha_support")),
                    broadcast_address=_text(data, "broadcast_address"),
                    hostname=_text(data, "hostname"), tcp_port=_opt_int(data, "tcp_port"),
                    http_port=_opt_int(data, "http_port"),
                    start_time=_opt_int(data, "start_time"))


def parse_nodes(status: int, body: bytes | str, *, address: str = "") -> tuple[Node, ...]:
    """A lookupd ``/nodes`` answer: every nsqd it knows (peers without usable addresses are
    left out: they cannot be asked anything)."""
    data = _data(status, body, "nsqlookupd /nodes", address)
    if data is None:
        return ()
    if not isinstance(data, Mapping):
        raise ProtocolError(f"nsqlookupd /nodes answer is not an object: {data!r:.80}")
    producers = data.get("producers")
    if producers is not None and not isinstance(producers, list):
        raise ProtocolError(f"nsqlookupd /nodes producers is not a list: {producers!r:.80}")
    out: dict[tuple[str, int], Node] = {}
    for peer in producers or ():
        try:
            node = parse_node(peer)
        except ProtocolError:
            continue
        out.setdefault(node.address, node)
    return tuple(out[a] for a in sorted(out))


# -- the create-topic workflow's decision -------------------------------------------------------

@dataclass(frozen=True)
class CreationProgress:
    """Where a topic's creation stands, from one round of lookups.

    ``leaders`` are the partitions a read lookup lists with a leader, ``writable`` those a
    write lookup lists (a youzan lookupd hides a partition from writers until it has a
    channel), ``channels_ready`` those whose leader accepted every wanted channel. ``done``
    when every partition has a leader and, when channels were asked for, every channel and a
    writable listing. ``resend`` says the create must be sent again: the
    partitions get leaders only when the leader lookupd's cluster check runs, and a re-sent
    create triggers one (docs/protocol.md §10.1).
    """

    topic: str
    partition_num: int
    leaders: frozenset[int]
    writable: frozenset[int]
    channels_ready: frozenset[int]
    want_channels: bool
    elapsed: float
    resend: bool

    @property
    def done(self) -> bool:
        every = frozenset(range(self.partition_num))
        if not every <= self.leaders:
            return False
        if self.want_channels:
            return every <= self.channels_ready and every <= self.writable
        return True

    @property
    def missing_leaders(self) -> tuple[int, ...]:
        return tuple(p for p in range(self.partition_num) if p not in self.leaders)

    def describe(self) -> str:
        n = self.partition_num
        text = (f"{self.topic}: {len(self.leaders & frozenset(range(n)))}/{n} partitions "
                f"have a leader")
        if self.want_channels:
            text += f", {len(self.writable & frozenset(range(n)))}/{n} writable"
        return f"{text} after {self.elapsed:.1f} s"


def creation_progress(topic: str, partition_num: int, *, read: TopicView | None,
                      write: TopicView | None, channels_ready: Iterable[int],
                      want_channels: bool, started: float, last_sent: float | None,
                      now: float, resend_interval: float) -> CreationProgress:
    """The create-topic decision for one round (time passed in, nothing asked here).

    ``read``/``write`` are the latest ``access=r``/``access=w`` views (``None`` while the
    lookupds do not know the topic or hide every partition). The create is (re)sent when it
    never went out, or when the topic is not usable yet and ``resend_interval`` passed since
    the last send: a real read lookup can name a leader before that node accepts the
    channel (docs/protocol.md §10.1), so a listed leader alone does not stop the re-sending.
    """
    leaders = frozenset(read.leaders()) if read is not None else frozenset()
    writable = frozenset(write.leaders()) if write is not None else frozenset()
    state = CreationProgress(topic, partition_num, leaders, writable, frozenset(channels_ready),
                             want_channels, max(0.0, now - started), False)
    if last_sent is None or (not state.done and now - last_sent >= resend_interval):
        return replace(state, resend=True)
    return state


def leaders_of(view: TopicView | None, partitions: Sequence[int]) -> dict[int, Node]:
    """The leaders ``view`` names for ``partitions`` (those without one left out)."""
    if view is None:
        return {}
    leaders = view.leaders()
    return {p: leaders[p] for p in partitions if p in leaders}
