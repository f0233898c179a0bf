"""The shared truth of a dev cluster: what etcd and the replicated partition logs hold in reality.

Real youzan NSQ keeps topic metadata and partition leadership in etcd and replicates each
partition's log to its replicas. In the dev cluster one in-process ``ClusterState`` plays both
parts: nsqd nodes serve the partitions they lead from it, nsqlookupds answer lookups from it,
and fault injection changes it. Because a partition's log and channel cursors live here, not in
a node, moving a leader or restarting a node keeps every committed message, as replication
does in the real cluster.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

YOUZAN_VERSION = "0.3.7-HA.1.13.0"
CLASSIC_VERSION = "1.3.0"

# internal ids are (partition << 50) | sequence; a new partition's first id was seq 2 on the
# real server
FIRST_SEQUENCE = 2
# bytes a message occupies in youzan's disk queue beyond its body (tcp_14: 9-byte body -> 39)
RAW_OVERHEAD = 30


@dataclass
class NodeInfo:
    """One nsqd process as lookupd knows it."""

    node_id: str  # youzan distributed_id form: ip:rpcport:tcpport:<opaque>
    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str
    classic: bool = False
    alive: bool = True
    tombstoned: bool = False

    @property
    def version(self) -> str:
        return CLASSIC_VERSION if self.classic else YOUZAN_VERSION

    @property
    def tcp_address(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"


@dataclass
class LookupdInfo:
    node_id: str  # ip:rpcport:tcpport:nsqlookup
    address: str
    http_port: int
    tcp_port: int
    rpc_port: int
    classic: bool = False
    alive: bool = True


@dataclass(slots=True)
class StoredMessage:
    """A committed message in a partition log."""

    internal_id: int
    trace_id: int
    timestamp: int  # ns since epoch
    body: bytes
    ext: bytes | None  # JSON header text for ext topics, None otherwise
    queue_offset: int
    raw_size: int
    tag: str = ""  # the ext header's ##client_dispatch_tag (desired_tag dispatch)
    deliver_after: float = 0.0  # classic DPUB: time.monotonic() before which it is deferred


# one message of a batch append: (body, trace_id, ext JSON or None, dispatch tag)
BatchItem = tuple[bytes, int, "bytes | None", str]


@dataclass
class PartitionLog:
    """Append-only log of one partition: ids, queue offsets and raw sizes as youzan assigns them.

    ``watchers`` are called after every append (channels wake their consumers from it).
    ``claimed`` serves classic topics: messages below it were handed to channels; a topic
    without channels keeps the rest for its first channel, as classic nsqd's topic queue does.
    """

    partition: int
    messages: list[StoredMessage] = field(default_factory=list)
    next_sequence: int = FIRST_SEQUENCE
    end_offset: int = 0
    claimed: int = 0
    retained: int = 0  # index of the first message retention kept (``trim``)
    watchers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.messages)

    @property
    def start_offset(self) -> int:
        """The queue offset of the first retained message (``backend_start``)."""
        if self.retained < len(self.messages):
            return self.messages[self.retained].queue_offset
        return self.end_offset

    def trim(self, count: int) -> None:
        """Retention removes the ``count`` oldest messages (channels behind skip them)."""
        self.retained = min(len(self.messages), self.retained + count)

    def _new(self, body: bytes, trace_id: int, ext: bytes | None, timestamp: int | None,
             ext_topic: bool, tag: str, deliver_after: float) -> StoredMessage:
        # youzan's disk format: 4-byte size + 26-byte header + [ext version [+ length + JSON]]
        if ext is not None:
            raw_size = RAW_OVERHEAD + len(body) + len(ext) + 3
        else:
            raw_size = RAW_OVERHEAD + len(body) + (1 if ext_topic else 0)
        msg = StoredMessage(
            internal_id=(self.partition << 50) | self.next_sequence,
            trace_id=trace_id,
            timestamp=time.time_ns() if timestamp is None else timestamp,
            body=body,
            ext=ext,
            queue_offset=self.end_offset,
            raw_size=raw_size,
            tag=tag,
            deliver_after=deliver_after,
        )
        self.next_sequence += 1
        self.end_offset += raw_size
        self.messages.append(msg)
        return msg

    def append(self, body: bytes, trace_id: int = 0, ext: bytes | None = None,
               timestamp: int | None = None, *, ext_topic: bool = False, tag: str = "",
               deliver_after: float = 0.0) -> StoredMessage:
        """Commit one message. ``ext_topic``: the topic is ext (its messages carry an ext byte)."""
        msg = self._new(body, trace_id, ext, timestamp, ext_topic, tag, deliver_after)
        self.notify()
        return msg

    def append_batch(self, items: Iterable[BatchItem], *,
                     ext_topic: bool = False) -> list[StoredMessage]:
        """Commit several messages at once (MPUB): consecutive ids and offsets, one wake-up."""
        now = time.time_ns()
        out = [self._new(body, trace_id, ext, now, ext_topic, tag, 0.0)
               for body, trace_id, ext, tag in items]
        self.notify()
        return out

    def notify(self) -> None:
        for watcher in list(self.watchers):
            watcher()

    # -- searches (SUB_ADVANCED start positions, /channel/setoffset) -------------------------

    def index_at_offset(self, offset: int) -> int | None:
        """Index of the message holding queue ``offset`` (the end index at the end offset)."""
        if offset == self.end_offset:
            return len(self.messages)
        if not 0 <= offset < self.end_offset or not self.messages:
            return None
        i = bisect.bisect_right(self.messages, offset, key=lambda m: m.queue_offset) - 1
        return max(i, self.retained)

    def index_at_time(self, timestamp_ns: int) -> int:
        """Index of the first message stamped at or after ``timestamp_ns`` (else the end)."""
        for i, msg in enumerate(self.messages):
            if msg.timestamp >= timestamp_ns:
                return i
        return len(self.messages)

    def find(self, internal_id: int) -> StoredMessage | None:
        """The message with this internal id (ids are consecutive within a partition)."""
        if not self.messages:
            return None
        i = (internal_id & ((1 << 50) - 1)) - (self.messages[0].internal_id & ((1 << 50) - 1))
        if 0 <= i < len(self.messages) and self.messages[i].internal_id == internal_id:
            return self.messages[i]
        return None


@dataclass
class PartitionInfo:
    topic: str
    partition: int
    leader: str | None  # node_id, None while no leader is elected
    replicas: list[str]
    writable: bool = True
    # True while the leader's channels are disabled too (a leader below its write quorum or
    # catching up, youzan's DisableConsume): SUB is refused E_FAILED_ON_NOT_WRITABLE
    refuses_sub: bool = False
    # False between a cluster check naming the leader and that nsqd taking the lead (slow
    # topic creation): read lookups list the leader, the nsqd answers E_FAILED_ON_NOT_LEADER
    leader_ready: bool = True
    # time.monotonic() until which the leader leaves PUBs unanswered (a lost replica's write
    # timing out); lookups still list the partition as writable meanwhile
    stalled_until: float = 0.0
    log: PartitionLog = field(init=False)
    # channel name -> channel state; the nsqd implementation owns the value type
    channels: dict[str, Any] = field(default_factory=dict)
    # youzan /stats msg_size_stats: messages counted by body size as the leader accepts them
    # (an MPUB counts each message that passed its checks, even if a later one fails)
    size_stats: list[int] = field(default_factory=lambda: [0] * 16)

    def __post_init__(self) -> None:
        self.log = PartitionLog(self.partition)

    def count_size(self, size: int) -> None:
        """Count one accepted message body in ``size_stats`` (buckets as the real nsqd's,
        measured: below 100 bytes, below 1 KiB, then one per power of two from 1 KiB, the
        last from 512 KiB up)."""
        if size < 100:
            bucket = 0
        elif size < 1024:
            bucket = 1
        else:
            bucket = min(11, (size // 1024).bit_length() + 1)
        self.size_stats[bucket] += 1

    def stalled(self) -> bool:
        return self.stalled_until > time.monotonic()

    def serving(self, node_id: str) -> bool:
        """Whether ``node_id`` leads this partition and has taken the lead."""
        return self.leader == node_id and self.leader_ready


@dataclass
class TopicInfo:
    name: str
    partition_num: int
    replica: int
    ordered: bool = False
    ext: bool = False
    multipart: bool = False
    disable_channel_auto_create: bool = False
    classic: bool = False  # created on first use by a classic node; no partitions, no meta
    partitions: list[PartitionInfo] = field(default_factory=list)

    def meta(self) -> dict[str, Any]:
        return {
            "partition_num": self.partition_num,
            "replica": self.replica,
            "extend_support": self.ext,
            "ordered": self.ordered,
            "multi_part": self.multipart,
            "disable_channel_auto_create": self.disable_channel_auto_create,
        }


Listener = Callable[[str, dict[str, Any]], None]


class ClusterState:
    """Topics, partitions, nodes and lookupds of one dev cluster.

    ``listeners`` are called as ``listener(event, details)`` after each change (events:
    ``topic_created``, ``topic_deleted``, ``leader_moved``, ``writable_changed``, ``node_up``,
    ``node_down``), so servers can react, e.g. by dropping subscribers of a partition that moved.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.lookupds: dict[str, LookupdInfo] = {}
        self.lookupd_leader: str | None = None
        self.topics: dict[str, TopicInfo] = {}
        self.listeners: list[Listener] = []
        # slow topic creation (FaultProfile.slow_creation): a created topic waits for a cluster
        # check to get leaders; ``creation_check`` is called on every (re-sent) /topic/create
        self.slow_creation = False
        self.creation_check: Callable[[], None] | None = None
        # classic data whose topic name is taken by a youzan topic (mixed clusters):
        # kept for the classic node, invisible to lookupd
        self._classic_shadow: dict[tuple[str, str], PartitionInfo] = {}

    def emit(self, event: str, **details: Any) -> None:
        for listener in list(self.listeners):
            listener(event, details)

    # -- queries ---------------------------------------------------------------------------

    def youzan_nodes(self, alive_only: bool = True) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if not n.classic and (n.alive or not alive_only)]

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            return None
        return info.partitions[partition]

    def led_by(self, node_id: str, topic: str) -> list[PartitionInfo]:
        info = self.topics.get(topic)
        if info is None:
            return []
        return [p for p in info.partitions if p.leader == node_id]

    def held_by(self, node_id: str, topic: str) -> list[PartitionInfo]:
        """Partitions of a youzan topic this node has a copy of (leader or replica)."""
        info = self.topics.get(topic)
        if info is None or info.classic:
            return []
        return [p for p in info.partitions if node_id in p.replicas or p.leader == node_id]

    def next_node_number(self) -> int:
        """The sequence number a new youzan nsqd gets in its distributed id."""
        return len(self.youzan_nodes(alive_only=False)) + 1

    # -- classic topics ----------------------------------------------------------------------
    # A classic nsqd keeps its own topics; here each (topic, node) is one pseudo partition of
    # a TopicInfo(classic=True) led by that node, which is how lookupd lists classic producers.

    def classic_partition(self, topic: str, node_id: str, *,
                          create: bool = True) -> PartitionInfo | None:
        """The classic node's copy of ``topic``; created (topic too) on first use if asked."""
        info = self.topics.get(topic)
        if info is not None and not info.classic:
            shadow = self._classic_shadow.get((topic, node_id))
            if shadow is None and create:
                shadow = self._classic_shadow[(topic, node_id)] = PartitionInfo(
                    topic, 0, node_id, [node_id])
            return shadow
        if info is None:
            if not create:
                return None
            info = self.topics[topic] = TopicInfo(topic, 0, 0, classic=True)
            self.emit("topic_created", topic=topic)
        for p in info.partitions:
            if p.leader == node_id:
                return p
        if not create:
            return None
        number = max((p.partition for p in info.partitions), default=-1) + 1
        p = PartitionInfo(topic, number, node_id, [node_id])
        info.partitions.append(p)
        return p

    def classic_partitions(self, node_id: str) -> list[PartitionInfo]:
        """Every classic topic copy this node holds, in topic-name order."""
        out = [p for info in self.topics.values() if info.classic
               for p in info.partitions if p.leader == node_id]
        out.extend(p for (_, node), p in self._classic_shadow.items() if node == node_id)
        return sorted(out, key=lambda p: p.topic)

    def drop_classic_partition(self, topic: str, node_id: str) -> bool:
        """Delete a classic node's copy of a topic (the topic goes with its last copy)."""
        if self._classic_shadow.pop((topic, node_id), None) is not None:
            return True
        info = self.topics.get(topic)
        if info is None or not info.classic:
            return False
        kept = [p for p in info.partitions if p.leader != node_id]
        if len(kept) == len(info.partitions):
            return False
        info.partitions[:] = kept
        if not kept:
            self.delete_topic(topic)
        return True

    # -- changes ---------------------------------------------------------------------------

    def create_topic(self, name: str, partition_num: int = 1, replica: int = 1, *,
                     ordered: bool = False, ext: bool = False, multipart: bool = False,
                     disable_channel_auto_create: bool = False,
                     pending: bool = False) -> TopicInfo:
        """Create a youzan topic, spreading partition leaders over the live youzan nodes.

        ``pending``: the partitions get their replicas but no leader until
        :meth:`elect_pending` runs (what the lookupd's cluster check does).

        Raises ``ValueError`` with the real lookupd's message when it would refuse.
        """
        if name in self.topics:
            return self.topics[name]
        nodes = self.youzan_nodes()
        if not nodes:
            raise ValueError("No node is available for topic")
        spread = ordered or multipart
        if not spread and partition_num * replica > len(nodes):
            raise ValueError("No node is available for topic")
        if replica > len(nodes):
            raise ValueError("No node is available for topic")
        info = TopicInfo(name, partition_num, replica, ordered=ordered, ext=ext,
                         multipart=multipart or ordered,
                         disable_channel_auto_create=disable_channel_auto_create)
        for pid in range(partition_num):
            owners = [nodes[(pid * (1 if spread else replica) + r) % len(nodes)].node_id
                      for r in range(replica)]
            p = PartitionInfo(name, pid, None if pending else owners[0], owners)
            p.leader_ready = not pending
            info.partitions.append(p)
        self.topics[name] = info
        self.emit("topic_created", topic=name)
        return info

    def elect_pending(self) -> list[PartitionInfo]:
        """Name a leader (the first alive replica) for every partition created ``pending``.

        The leaders are not serving yet (``leader_ready`` False): the caller readies them.
        """
        out = []
        for info in self.topics.values():
            for p in info.partitions:
                if p.leader is not None or info.classic:
                    continue
                alive = [r for r in p.replicas if r in self.nodes and self.nodes[r].alive]
                if alive and not p.leader_ready:
                    p.leader = alive[0]
                    out.append(p)
                    self.emit("leader_moved", topic=info.name, partition=p.partition,
                              old=None, new=p.leader)
        return out

    def ready_leader(self, p: PartitionInfo) -> None:
        """The named leader takes the lead: it serves, and lookups list it for writes."""
        p.leader_ready = True
        self.emit("writable_changed", topic=p.topic, partition=p.partition,
                  writable=p.writable)

    def delete_topic(self, name: str) -> None:
        if self.topics.pop(name, None) is not None:
            self.emit("topic_deleted", topic=name)

    def move_leader(self, topic: str, partition: int, node_id: str | None = None) -> str | None:
        """Make ``node_id`` (default: the next replica) lead the partition; return it."""
        p = self.partition(topic, partition)
        if p is None:
            raise KeyError(f"{topic}/{partition}")
        if node_id is None:
            candidates = [r for r in p.replicas if r != p.leader and self.nodes[r].alive]
            if not candidates:
                candidates = [n.node_id for n in self.youzan_nodes() if n.node_id != p.leader]
            node_id = candidates[0] if candidates else None
        old = p.leader
        p.leader = node_id
        if node_id is not None and node_id not in p.replicas:
            p.replicas.append(node_id)
        self.emit("leader_moved", topic=topic, partition=partition, old=old, new=node_id)
        return node_id

    def set_writable(self, topic: str, partition: int, writable: bool, *,
                     refuse_sub: bool = False) -> None:
        p = self.partition(topic, partition)
        if p is None:
            raise KeyError(f"{topic}/{partition}")
        p.writable = writable
        p.refuses_sub = refuse_sub and not writable
        self.emit("writable_changed", topic=topic, partition=partition, writable=writable)
