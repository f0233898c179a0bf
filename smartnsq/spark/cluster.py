"""What the connector needs from a cluster: leaders, queue positions, private channels.

Driver side (blocking HTTP, a few calls per micro-batch): which node leads each partition
(``/lookup?access=r&metainfo=true`` on nsqlookupd, or ``/info`` + ``/stats`` on nsqd given
directly) and where each partition's queue starts and ends (the leader's
``/stats?format=json&topic=&partition=``: ``backend_start`` and ``backend_depth``, in queue
bytes; docs/protocol.md §7 and the capture ``http_nsqd_stats_json_topic_v1.txt``).

Executor side: ``spark.ranges`` reads the ranges, over the channels made here.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..admin import Admin
from ..config import ConnectionConfig
from ..errors import (
    AdminError,
    ClusterError,
    ConnectionFailed,
    InvalidArgument,
    LookupFailed,
    ProtocolError,
    Timeout,
    TopicNotFound,
)
from ..model.routes import parse_address
from ..protocol.admin import TopicStats
from ..protocol.commands import StartPosition
from ..protocol.lookup import Node, TopicView
from ..protocol.operations import StoredMessage
from .conditions import condition_of
from .options import ClusterOptions

__all__ = [
    "ClusterClient",
    "LeaderInfo",
    "TopicLayout",
    "temporary_channel",
]

log = logging.getLogger("smartnsq.spark")

T = TypeVar("T")


@dataclass(frozen=True)
class LeaderInfo:
    """The nsqd leading one partition."""

    host: str
    tcp_port: int
    http_port: int

    @classmethod
    def of(cls, node: Node) -> LeaderInfo:
        return cls(node.broadcast_address, node.tcp_port, node.http_port)

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def tcp_address(self) -> str:
        return f"{self.host}:{self.tcp_port}"


@dataclass(frozen=True)
class TopicLayout:
    """A topic as the source sees it: partitions, their leaders, ordering and ext flags.

    ``partitions`` is every partition the topic has, with a leader now or not: a partition
    between two leaders (23-27 s after a real node's death) is absent from ``leaders`` but
    still one of the topic's partitions, whose offsets the stream must keep.
    """

    topic: str
    ordered: bool
    ext: bool
    leaders: dict[int, LeaderInfo] = field(default_factory=dict)
    partitions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.partitions:
            object.__setattr__(self, "partitions", tuple(sorted(self.leaders)))

    @property
    def leaderless(self) -> tuple[int, ...]:
        return tuple(p for p in self.partitions if p not in self.leaders)

    @classmethod
    def of(cls, view: TopicView) -> TopicLayout:
        """The layout a lookupd's view gives; refuses a topic without partitions."""
        if view.empty and not view.partition_num:
            raise TopicNotFound(view.topic)
        leaders = {pid: LeaderInfo.of(node) for pid, node in view.leaders().items()}
        if not leaders and not view.partition_num:
            raise InvalidArgument("topic", f"{view.topic!r} has no partitions in lookup: the "
                                  "replayable source needs a youzan cluster", view.topic)
        count = max([view.partition_num, *(p + 1 for p in view.partitions)])
        return cls(view.topic, view.ordered, view.extend_support, leaders,
                   tuple(range(count)))


class ClusterClient:
    """Blocking HTTP calls to nsqlookupd / nsqd (driver and executors), through
    :class:`smartnsq.admin.Admin`; its errors become :class:`ClusterError` (``transient``
    when a leader change or a node's restart explains them)."""

    def __init__(self, options: ClusterOptions) -> None:
        self._options = options
        self._admin = Admin(options.lookupd or None, timeout=options.http_timeout)
        self._connection: ConnectionConfig | None = None

    @property
    def connection_config(self) -> ConnectionConfig:
        """TLS, AUTH and compression of the nsqd connections range reads open."""
        if self._connection is None:
            self._connection = self._options.connection.config()
        return self._connection

    def close(self) -> None:
        self._admin.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """One admin call; its failure as a ``ClusterError`` saying what was asked."""
        try:
            return call()
        except AdminError as exc:
            raise ClusterError(f"{what}: {exc}", transient=exc.retriable) from exc
        except (ConnectionFailed, Timeout) as exc:
            raise ClusterError(f"{what}: {exc}", transient=True) from exc
        except ProtocolError as exc:
            raise ClusterError(f"{what}: {exc}") from exc

    # -- discovery ------------------------------------------------------------------------

    def layout(self, topic: str) -> TopicLayout:
        """Partitions and leaders of ``topic``; raises ``TopicNotFound`` or ``LookupFailed``."""
        if self._options.lookupd:
            return self._lookup(topic)
        return self._from_nsqd(topic)

    def _lookup(self, topic: str) -> TopicLayout:
        try:
            view = self._admin.lookup(topic, "r")
        except TopicNotFound:
            raise
        except (AdminError, ConnectionFailed, Timeout, ProtocolError) as exc:
            where = ",".join(self._options.lookupd)
            if isinstance(exc, ProtocolError):  # it answered, as some other server
                raise LookupFailed(
                    f"lookupd at {where} does not answer as nsqlookupd ({condition_of(exc)}): "
                    "the lookupd option takes nsqlookupd's HTTP address (port 4161 by "
                    "default), not an nsqd port", retriable=False) from exc
            if isinstance(exc, AdminError):
                raise LookupFailed(f"lookupd at {where} refused the lookup of {topic!r} "
                                   f"({condition_of(exc)})", retriable=exc.retriable) from exc
            raise LookupFailed(f"lookupd at {where} does not answer the lookup of {topic!r} "
                               f"({condition_of(exc)})") from exc
        return TopicLayout.of(view)

    def _from_nsqd(self, topic: str) -> TopicLayout:
        leaders: dict[int, LeaderInfo] = {}
        ordered = ext = False
        down: list[ClusterError] = []
        for address in self._options.nsqd_http:
            try:
                info = self._call(f"GET {address}/info", functools.partial(self._admin.info,
                                                                           address))
            except ClusterError as exc:
                if not exc.transient:
                    raise
                down.append(exc)  # a node that is down leads nothing now; ask the others
                continue
            if info.tcp_port is None or info.http_port is None:
                raise ClusterError(f"{address}: its /info gives no tcp_port/http_port")
            host = info.broadcast_address or parse_address(address)[0]
            node = LeaderInfo(host, info.tcp_port, info.http_port)
            stats = self._call(f"GET {address}/stats", functools.partial(
                self._admin.stats, address, topic, leader_only=True))
            for entry in stats.partitions(topic):
                if entry.leader is False:
                    continue
                if entry.partition is None:
                    raise InvalidArgument("nsqdHttp", f"{address} is a classic nsqd: the "
                                          "replayable source needs a youzan cluster", address)
                leaders[entry.partition] = node
                ordered = ordered or entry.ordered
                ext = ext or entry.ext
        if not leaders:
            if down:
                raise ClusterError(f"no nsqd leads {topic!r} now: " + "; ".join(
                    condition_of(e) for e in down), transient=True)
            raise TopicNotFound(topic)
        return TopicLayout(topic, ordered, ext, leaders)

    # -- positions --------------------------------------------------------------------------

    def bounds(self, topic: str, partition: int, leader: LeaderInfo) -> tuple[int, int]:
        """``(start, end)`` of the partition's queue on its leader, in queue bytes."""
        start, end, _ = self.positions(topic, partition, leader)
        return start, end

    def positions(self, topic: str, partition: int,
                  leader: LeaderInfo) -> tuple[int, int, int]:
        """``(start, end, count)``: the queue's bounds in bytes and the message count at its
        end (``message_count``, the ``msgcount:`` index of the position ``end``), from one
        answer, so the pair ``(end, count)`` is consistent."""
        entry = self._partition_stats(topic, partition, leader)
        if entry.backend_depth is None:
            raise ClusterError(f"{leader.http_address} gives no queue end (backend_depth) for "
                               f"{topic}/{partition}: the replayable source needs youzan nodes")
        return entry.backend_start or 0, entry.backend_depth, entry.message_count

    def _partition_stats(self, topic: str, partition: int, leader: LeaderInfo,
                         channel: str | None = None) -> TopicStats:
        address = leader.http_address
        stats = self._call(f"GET {address}/stats of {topic}/{partition}",
                           lambda: self._admin.stats(address, topic, channel,
                                                     partition=partition, leader_only=True))
        entry = stats.topic(topic, partition)
        if entry is None:
            raise ClusterError(f"{address} does not lead {topic}/{partition} (its /stats do "
                               "not list the partition); the leader may have moved",
                               transient=True)
        if entry.leader is False:
            raise ClusterError(f"{address} does not lead {topic}/{partition} yet (its /stats "
                               "list the partition with is_leader false: an election or a "
                               "handoff is not finished)", transient=True)
        return entry

    def message_at(self, topic: str, partition: int, leader: LeaderInfo, *,
                   count: int | None = None, queue_offset: int | None = None) -> StoredMessage:
        """The stored message of 1-based number ``count`` or at ``queue_offset`` (the
        leader's ``/message/get``: one call, nothing read over TCP)."""
        return self._call(f"GET {leader.http_address}/message/get of {topic}/{partition}",
                          lambda: self._admin.get_message(topic, count=count,
                                                          queue_offset=queue_offset,
                                                          partition=partition,
                                                          address=leader.http_address))


    # -- channels ---------------------------------------------------------------------------

    def create_channel(self, topic: str, partition: int, leader: LeaderInfo,
                       channel: str) -> None:
        self._call(f"create channel {channel} of {topic}/{partition} on {leader.http_address}",
                   lambda: self._admin.create_channel(topic, channel, partition=partition,
                                                      address=leader.http_address))

    def set_offset(self, topic: str, partition: int, leader: LeaderInfo, channel: str,
                   offset: int) -> None:
        self.set_position(topic, partition, leader, channel, StartPosition.queue_offset(offset))

    def set_position(self, topic: str, partition: int, leader: LeaderInfo, channel: str,
                     position: StartPosition) -> None:
        """``/channel/setoffset`` with any start position."""
        self._call(f"set channel {channel} of {topic}/{partition} to "
                   f"{position.token().decode()} on {leader.http_address}",
                   lambda: self._admin.set_offset(topic, channel, position,
                                                  partition=partition,
                                                  address=leader.http_address))

    def channel_depth(self, topic: str, partition: int, leader: LeaderInfo,
                      channel: str) -> int:
        """Messages waiting on ``channel`` of the partition (from the leader's stats)."""
        found = self._partition_stats(topic, partition, leader, channel).channel(channel)
        if found is None:
            raise ClusterError(f"{leader.http_address} does not list channel {channel} of "
                               f"{topic}/{partition}")
        return found.depth

    def delete_channel(self, topic: str, partition: int, leader: LeaderInfo,
                       channel: str) -> None:
        self._call(f"delete channel {channel} of {topic}/{partition} on {leader.http_address}",
                   lambda: self._admin.delete_channel(topic, channel, partition=partition,
                                                      address=leader.http_address))


def temporary_channel(prefix: str) -> str:
    """A fresh channel name for one read (deleted afterwards)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"
