"""nsqlookupd of the dev cluster: youzan (cluster mode, etcd-backed in real life) or classic 1.3.

A real lookupd answers from its registration DB (what nsqd nodes registered over TCP) and, in
youzan cluster mode, from etcd. Here both are views of the shared :class:`ClusterState`:

* a partition is *registered* when its leader is an alive node that has taken the lead
  (``leader_ready``) and the partition is writable (youzan nsqd unregisters a partition whose
  writes are disabled, e.g. during a leader change: ``failover_*.txt`` shows ``access=w``
  hiding it while ``access=r`` still names the leader) or is stalled (a leader waiting on a
  lost replica has not noticed yet: it stays registered until the stall ends);
* the *consume leader* (``access=r`` fallback, YS ``#tryFindRegsForConsumer``) is the leader
  when it is alive, writable or not;
* channels are registered by the leader, so a partition's channels count while its leader lives;
* classic nodes register their topics with the pseudo partition ``-11`` and are always treated
  as tombstoned by a youzan lookupd (YS ``registration_db.go#IsTombstoned``), so they appear in
  ``access=r`` producers only.

Every lookupd of a cluster reads the same state, so they agree, as lookupds reading one etcd
do; ``state.lookupd_leader`` names the one that accepts topic creation and expansion. A
``/topic/tombstone`` is the exception, as in real life: it lives in the registration DB of
the lookupd asked, so each lookupd keeps its own (topic, node) tombstones.
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from ..protocol.validate import check_channel, check_topic
from .httpserver import NEGOTIATE, PLAIN, V1, HTTPError, HTTPServer, Request
from .state import (
    CLASSIC_VERSION,
    YOUZAN_VERSION,
    ClusterState,
    LookupdInfo,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)

__all__ = ["OLD_VERSION_PID", "Advertise", "Lookupd"]

log = logging.getLogger("smartnsq.devcluster.lookupd")

OLD_VERSION_PID = -11  # the partition a classic nsqd's registrations get in a youzan lookupd
MAX_PARTITION_NUM = 255
MAX_REPLICATOR = 5
NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"
KEY_NOT_FOUND = "Key not found"
NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
COORD_TMP_ERR = "ErrType:9 ErrCode:1 : "  # how a CoordErr of type CoordTmpErr prints

# how a node's addresses are advertised: (broadcast_address, tcp_port, http_port)
Advertise = Callable[[NodeInfo], tuple[str, int, int]]


@dataclass
class _Reg:
    """One topic registration: a node serving a partition (or -11 for a classic node)."""

    pid: int
    node: NodeInfo
    partition: PartitionInfo | None


def _live_channels(p: PartitionInfo) -> list[str]:
    """Channel names nsqd has registered (a deleted channel may linger, marked closed)."""
    return [name for name, ch in p.channels.items() if not getattr(ch, "closed", False)]


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) so the advertised port is ours and connecting to it is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError:
        if port == 0:
            sock.close()
            raise
        sock.bind((host, 0))
    return sock


class Lookupd:
    """One nsqlookupd: an HTTP server over the shared state.

    ``classic=True`` behaves like nsqlookupd 1.3.0 (never wrapped, no ``/listlookup``, unknown
    topic 404 ``TOPIC_NOT_FOUND``); otherwise youzan 0.3.7-HA in cluster mode.
    """

    def __init__(self, state: ClusterState, *, host: str = "127.0.0.1", http_port: int = 0,
                 tcp_port: int = 0, rpc_port: int = 0, classic: bool = False,
                 name: str | None = None, advertise: Advertise | None = None) -> None:
        self.state = state
        self.host = host
        self.classic = classic
        self.advertise = advertise
        self._want = (http_port, tcp_port, rpc_port)
        self._reserved: list[socket.socket] = []
        self.http = HTTPServer(host, http_port, classic=classic, name=name or "nsqlookupd")
        self.info: LookupdInfo | None = None
        self._remote_ports: dict[str, int] = {}
        self._next_remote_port = random.randint(33000, 50000)
        self._tombstones: set[tuple[str, str]] = set()  # (topic, node_id), this lookupd's own
        self._install_routes()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        assert self.info is not None, "lookupd never started"
        return self.info.node_id

    @property
    def http_port(self) -> int:
        return self.http.port

    @property
    def http_address(self) -> str:
        return self.http.address

    @property
    def running(self) -> bool:
        return self.http.started

    @property
    def is_leader(self) -> bool:
        return self.info is not None and self.state.lookupd_leader == self.info.node_id

    async def start(self) -> None:
        """Listen (again, on the same ports after a stop) and register in the state."""
        if self.running:
            return
        http_port, tcp_port, rpc_port = self._want
        if self.info is not None:  # restart: keep the identity and ports
            http_port, tcp_port, rpc_port = (self.info.http_port, self.info.tcp_port,
                                             self.info.rpc_port)
        tcp_sock = _reserve_port(self.host, tcp_port)
        rpc_sock = _reserve_port(self.host, rpc_port)
        self._reserved = [tcp_sock, rpc_sock]
        self.http.port = http_port
        await self.http.start()
        tcp = tcp_sock.getsockname()[1]
        rpc = rpc_sock.getsockname()[1]
        if self.info is None or (self.info.tcp_port, self.info.rpc_port) != (tcp, rpc):
            self.info = LookupdInfo(
                node_id=f"{self.host}:{rpc}:{tcp}:nsqlookup",
                address=self.host, http_port=self.http.port, tcp_port=tcp, rpc_port=rpc,
                classic=self.classic)
        self.info.http_port = self.http.port
        self.info.alive = True
        self.state.lookupds[self.info.node_id] = self.info
        if not self.classic and self._leader() is None:
            self.state.lookupd_leader = self.info.node_id
        log.info("nsqlookupd %s up, http %s", self.info.node_id, self.http.address)

    async def stop(self) -> None:
        """Stop answering (the port refuses connections); registration kept, marked dead."""
        await self.http.stop()
        for sock in self._reserved:
            sock.close()
        self._reserved = []
        if self.info is not None:
            self.info.alive = False
            log.info("nsqlookupd %s down", self.info.node_id)

    # -- state views ----------------------------------------------------------------------------

    def _leader(self) -> LookupdInfo | None:
        leader = self.state.lookupds.get(self.state.lookupd_leader or "")
        return leader if leader is not None and leader.alive else None

    def _node(self, node_id: str | None) -> NodeInfo | None:
        if node_id is None:
            return None
        return self.state.nodes.get(node_id)

    def _alive(self, node_id: str | None) -> NodeInfo | None:
        node = self._node(node_id)
        return node if node is not None and node.alive else None

    def _topic_classic(self, info: TopicInfo) -> bool:
        return info.classic

    def _classic_regs(self, info: TopicInfo) -> list[_Reg]:
        """Where a classic topic lives: each alive node holding a copy (one pseudo partition
        per (topic, node), led by that node: ``ClusterState.classic_partition``)."""
        regs: list[_Reg] = []
        seen: set[str] = set()
        for p in info.partitions:
            node = self._alive(p.leader)
            if node is not None and node.node_id not in seen:
                seen.add(node.node_id)
                regs.append(_Reg(OLD_VERSION_PID, node, p))
        return regs

    def _registrations(self, topic: str, pid: str = "*") -> list[_Reg]:
        """The registration DB's ``FindTopicProducers(topic, pid)``."""
        info = self.state.topics.get(topic)
        if info is None:
            return []
        if self._topic_classic(info):
            regs = self._classic_regs(info)
        else:
            regs = []
            for p in info.partitions:
                node = self._alive(p.leader)
                # a stalled leader has not noticed yet that it cannot write: still registered
                if node is not None and p.leader_ready and (p.writable or p.stalled()):
                    regs.append(_Reg(p.partition, node, p))
        return [r for r in regs if pid == "*" or str(r.pid) == pid]

    def _consume_leaders(self, topic: str, pid: str, regs: list[_Reg]) -> list[_Reg]:
        info = self.state.topics.get(topic)
        if info is None or self._topic_classic(info) or self.classic:
            return regs
        have = {r.pid for r in regs}
        out = list(regs)
        for p in info.partitions:
            if p.partition in have or (pid != "*" and str(p.partition) != pid):
                continue
            node = self._alive(p.leader)
            if node is not None:
                out.append(_Reg(p.partition, node, p))
        return out

    def _etcd_leaders(self, topic: str, pid: str) -> list[_Reg]:
        """``access=w``, nothing registered: the leaders etcd names (#tryFindRegsFromRegister)."""
        info = self.state.topics.get(topic)
        if info is None or self._topic_classic(info):
            raise HTTPError(404, KEY_NOT_FOUND)
        regs = []
        for p in info.partitions:
            if pid != "*" and str(p.partition) != pid:
                continue
            node = self._alive(p.leader)
            if node is not None:
                regs.append(_Reg(p.partition, node, p))
        return regs

    def _channels(self, topic: str, pid: str = "*") -> list[str]:
        """``FindChannelRegs(topic, pid).Channels()``: registered by live leaders, de-duplicated."""
        info = self.state.topics.get(topic)
        if info is None:
            return []
        out: dict[str, None] = {}
        if self._topic_classic(info):
            if pid in ("*", str(OLD_VERSION_PID)):
                for reg in self._classic_regs(info):
                    if reg.partition is not None:
                        out.update(dict.fromkeys(_live_channels(reg.partition)))
            return list(out)
        for p in info.partitions:
            if pid != "*" and str(p.partition) != pid:
                continue
            if self._alive(p.leader) is not None:
                out.update(dict.fromkeys(_live_channels(p)))
        return list(out)

    def _is_tombstoned(self, node: NodeInfo, topic: str = "") -> bool:
        return (node.tombstoned or (node.classic and not self.classic)
                or (topic, node.node_id) in self._tombstones)

    def _remote_address(self, node: NodeInfo) -> str:
        """nsqd's outbound address as this lookupd saw it (an ephemeral port, stable per node)."""
        port = self._remote_ports.get(node.node_id)
        if port is None:
            port = self._remote_ports[node.node_id] = self._next_remote_port
            self._next_remote_port += 1
        return f"{node.broadcast_address}:{port}"

    def _addresses(self, node: NodeInfo) -> tuple[str, int, int]:
        if self.advertise is not None:
            return self.advertise(node)
        return node.broadcast_address, node.tcp_port, node.http_port

    def _peer(self, node: NodeInfo) -> dict[str, Any]:
        remote = self._remote_address(node)
        address, tcp_port, http_port = self._addresses(node)
        if self.classic:
            return {"remote_address": remote, "hostname": node.hostname,
                    "broadcast_address": address, "tcp_port": tcp_port,
                    "http_port": http_port, "version": node.version}
        return {"id": remote, "remote_address": remote, "hostname": node.hostname,
                "broadcast_address": address, "tcp_port": tcp_port, "http_port": http_port,
                "version": node.version,
                "distributed_id": "" if node.classic else node.node_id}

    @staticmethod
    def _meta(info: TopicInfo | None) -> dict[str, Any]:
        if info is None or info.classic:
            return {"disable_channel_auto_create": False, "extend_support": False,
                    "multi_part": False, "ordered": False, "partition_num": 0, "replica": 0}
        # state.create_topic folds ordered into multipart; the real meta keeps them apart
        # (http_lookup_ordered_w_metainfo_v1.txt: ordered true, multi_part false)
        return {"disable_channel_auto_create": info.disable_channel_auto_create,
                "extend_support": info.ext,
                "multi_part": info.multipart and not info.ordered,
                "ordered": info.ordered,
                "partition_num": info.partition_num,
                "replica": info.replica}

    # -- routes ---------------------------------------------------------------------------------

    def _install_routes(self) -> None:
        r = self.http.route
        r("GET", "/ping", self._ping, PLAIN)
        r("GET", "/info", self._info, NEGOTIATE)
        r("GET", "/lookup", self._lookup, NEGOTIATE)
        r("GET", "/topics", self._topics, NEGOTIATE)
        r("GET", "/channels", self._channels_route, NEGOTIATE)
        r("GET", "/nodes", self._nodes, NEGOTIATE)
        if self.classic:
            r("POST", "/topic/create", self._classic_topic_create, V1)
            r("POST", "/topic/delete", self._classic_topic_delete, V1)
            r("POST", "/topic/tombstone", self._tombstone, V1)
            return
        r("GET", "/listlookup", self._listlookup, NEGOTIATE)
        r(("POST", "PUT"), "/topic/create", self._topic_create, V1)
        r("POST", "/topic/delete", self._topic_delete, V1)
        r("POST", "/channel/create", self._channel_create, V1)
        r("POST", "/topic/tombstone", self._tombstone, V1)
        r("POST", "/topic/partition/expand", self._topic_expand, V1)
        r("POST", "/topic/meta/update", self._topic_meta_update, V1)

    async def _ping(self, req: Request) -> str:
        return "OK"

    async def _info(self, req: Request) -> dict[str, Any]:
        if self.classic:
            return {"version": CLASSIC_VERSION}
        return {"version": YOUZAN_VERSION, "ha_support": True}

    async def _listlookup(self, req: Request) -> dict[str, Any]:
        nodes = [self._lookupd_json(info) for info in self.state.lookupds.values()
                 if info.alive and not info.classic]
        leader = self._leader()
        leader_json = self._lookupd_json(leader) if leader is not None else {
            "ID": "", "NodeIP": "", "TcpPort": "", "HttpPort": "", "RpcPort": "", "Epoch": 0}
        return {"lookupdleader": leader_json, "lookupdnodes": nodes}

    @staticmethod
    def _lookupd_json(info: LookupdInfo) -> dict[str, Any]:
        return {"ID": info.node_id, "NodeIP": info.address, "TcpPort": str(info.tcp_port),
                "HttpPort": str(info.http_port), "RpcPort": str(info.rpc_port), "Epoch": 0}

    async def _lookup(self, req: Request) -> dict[str, Any]:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if self.classic:
            return self._classic_lookup(topic)
        pid = req.arg("partition") or "*"
        access = req.arg("access") or "r"
        if access not in ("r", "w"):
            raise HTTPError(400, "INVALID_ACCESS_MODE")
        regs = self._registrations(topic, pid)
        found_in_register = bool(regs)
        if not regs and access == "w":
            regs = self._etcd_leaders(topic, pid)
        if access == "r":
            regs = self._consume_leaders(topic, pid, regs)
        else:
            regs = [r for r in regs if not self._is_tombstoned(r.node, topic)]
        partitions: dict[str, Any] = {}
        producers: dict[str, dict[str, Any]] = {}
        empty_channel_filtered = False
        for reg in sorted(regs, key=lambda r: r.pid):
            if access == "w" and not self._channels(topic, str(reg.pid)):
                empty_channel_filtered = True
                continue
            peer = self._peer(reg.node)
            if reg.pid >= 0:
                partitions[str(reg.pid)] = peer
            producers.setdefault(peer["id"], peer)
        if found_in_register and empty_channel_filtered and not partitions and not producers:
            raise HTTPError(404, NO_CHANNEL)
        body: dict[str, Any] = {"channels": self._channels(topic, pid)}
        if req.arg("metainfo"):
            body["meta"] = self._meta(self.state.topics.get(topic))
        body["partitions"] = partitions
        body["producers"] = list(producers.values())
        return body

    def _classic_lookup(self, topic: str) -> dict[str, Any]:
        info = self.state.topics.get(topic)
        if info is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if info.classic:
            nodes = [r.node for r in self._classic_regs(info)]
        else:  # a youzan topic seen by a classic lookupd: every live leader, once
            nodes = []
            for p in info.partitions:
                node = self._alive(p.leader)
                if node is not None and node not in nodes:
                    nodes.append(node)
        producers = [self._peer(n) for n in nodes if not self._is_tombstoned(n, topic)]
        return {"channels": self._channels(topic), "producers": producers}

    def _topic_names(self) -> list[str]:
        return list(self.state.topics)

    async def _topics(self, req: Request) -> dict[str, Any]:
        names = self._topic_names()
        if self.classic or req.arg("metaInfo") != "true":
            return {"topics": names}
        meta_info = []
        for name in names:
            info = self.state.topics[name]
            meta = self._meta(info)
            meta_info.append({
                "topic_name": name,
                "extend_support": meta["extend_support"],
                "ordered": meta["ordered"],
                "multi_part": meta["multi_part"],
                "disable_channel_auto_create": meta["disable_channel_auto_create"],
                # a Go nil slice until a channel is registered
                "registered_channels": list(self._registered_channels(info)) or None,
            })
        return {"topics": names, "meta_info": meta_info}

    async def _channels_route(self, req: Request) -> dict[str, Any]:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return {"channels": self._channels(topic, req.arg("partition") or "*")}

    async def _nodes(self, req: Request) -> dict[str, Any]:
        producers = []
        for node in self.state.nodes.values():
            if not node.alive:
                continue
            topics: list[str] = []
            partitions: dict[str, list[str]] = {}
            for name in self.state.topics:
                pids = [str(r.pid) for r in self._registrations(name) if r.node is node]
                if pids:
                    topics.append(name)
                    partitions[name] = pids
            address, tcp_port, http_port = self._addresses(node)
            entry: dict[str, Any] = {
                "remote_address": self._remote_address(node), "hostname": node.hostname,
                "broadcast_address": address, "tcp_port": tcp_port, "http_port": http_port,
                "version": node.version,
                "tombstones": [self._is_tombstoned(node, t) for t in topics],
                "topics": topics,
            }
            if not self.classic:
                entry["partitions"] = dict(sorted(partitions.items()))
            producers.append(entry)
        return {"producers": producers}

    # -- youzan admin ---------------------------------------------------------------------------

    def _check_leader(self) -> None:
        if not self.is_leader:
            raise HTTPError(400, NOT_LEADER)

    @staticmethod
    def _int_arg(req: Request, name: str, low: int, high: int, missing: str,
                 invalid: str) -> int:
        text = req.arg(name)
        if text == "":
            raise HTTPError(400, missing)
        try:
            value = int(text)
        except ValueError:
            raise HTTPError(400, invalid) from None
        if not low <= value <= high:
            raise HTTPError(400, invalid)
        return value

    async def _topic_create(self, req: Request) -> None:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        try:
            check_topic(topic)
        except InvalidArgument:
            raise HTTPError(400, "INVALID_ARG_TOPIC") from None
        pnum = self._int_arg(req, "partition_num", 1, MAX_PARTITION_NUM,
                             "MISSING_ARG_TOPIC_PARTITION_NUM",
                             "INVALID_ARG_TOPIC_PARTITION_NUM")
        replica = self._int_arg(req, "replicator", 1, MAX_REPLICATOR,
                                "MISSING_ARG_TOPIC_REPLICATOR", "INVALID_ARG_TOPIC_REPLICATOR")
        for name, invalid in (("suggestload", "INVALID_ARG_TOPIC_LOAD_FACTOR"),
                              ("syncdisk", "INVALID_ARG_TOPIC_SYNC_DISK")):
            if req.arg(name):
                self._int_arg(req, name, 0 if name == "suggestload" else -(2**63),
                              10000 if name == "suggestload" else 2**63, invalid, invalid)
        self._check_leader()
        ordered = req.arg("orderedmulti") == "true"
        ext = req.arg("extend") == "true"
        multipart = req.arg("multipart") == "true"
        no_auto = req.arg("disable_channel_auto_create") == "true"
        existing = self.state.topics.get(topic)
        if existing is not None and not existing.classic and (
                (existing.partition_num, existing.replica, existing.ordered, existing.ext,
                 existing.multipart, existing.disable_channel_auto_create)
                != (pnum, replica, ordered, ext, multipart or ordered, no_auto)):
            # re-sending the same create is accepted (it asks for a cluster check); the
            # same topic with any other meta is refused, after the check for enough nodes
            nodes = len(self.state.youzan_nodes())
            if not nodes or replica > nodes or (
                    not (ordered or multipart) and pnum * replica > nodes):
                raise HTTPError(400, COORD_TMP_ERR + "No node is available for topic")
            raise HTTPError(400, "already exist")
        try:
            self.state.create_topic(
                topic, pnum, replica, ordered=ordered, ext=ext, multipart=multipart,
                disable_channel_auto_create=no_auto, pending=self.state.slow_creation)
        except ValueError as exc:
            raise HTTPError(400, COORD_TMP_ERR + str(exc)) from None
        if self.state.creation_check is not None:  # a create, new or re-sent, asks for a check
            self.state.creation_check()
        return None

    async def _topic_delete(self, req: Request) -> None:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        part = req.arg("partition")
        if not part:
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION")
        if part != "**":
            raise HTTPError(400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")
        if not self.is_leader:
            raise HTTPError(500, "Not nsqlookup leader")
        self.state.delete_topic(topic)
        return None

    @staticmethod
    def _registered_channels(info: TopicInfo) -> list[str]:
        """Channels allowed on a ``disable_channel_auto_create`` topic (etcd meta in real life).

        ClusterState has no field for them yet, so they ride on the TopicInfo as an extra
        attribute ``registered_channels`` (a list) that nsqd can read with ``getattr``.
        """
        channels = getattr(info, "registered_channels", None)
        if channels is None:
            channels = []
            setattr(info, "registered_channels", channels)  # noqa: B010
        return channels

    async def _channel_create(self, req: Request) -> None:
        topic, channel = req.arg("topic"), req.arg("channel")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        try:
            check_topic(topic)
        except InvalidArgument:
            raise HTTPError(400, "INVALID_ARG_TOPIC") from None
        if not channel:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        try:
            check_channel(channel)
        except InvalidArgument:
            raise HTTPError(400, "INVALID_ARG_CHANNEL") from None
        info = self.state.topics.get(topic)
        if info is None or info.classic:
            raise HTTPError(400, KEY_NOT_FOUND)
        if not info.disable_channel_auto_create:
            raise HTTPError(400, f"channel auto create NOT disabled in topic {topic}")
        registered = self._registered_channels(info)
        if channel in registered:
            raise HTTPError(400, f"channel {channel} already registered")
        registered.append(channel)
        return None

    async def _tombstone(self, req: Request) -> None:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        target = req.arg("node")
        if not target:
            raise HTTPError(400, "MISSING_ARG_NODE")
        restore = req.arg("restore") == "true"
        for reg in self._registrations(topic):  # only a node registered for the topic
            node = reg.node
            if f"{node.broadcast_address}:{node.http_port}" == target:
                key = (topic, node.node_id)
                (self._tombstones.discard if restore else self._tombstones.add)(key)
        return None

    async def _topic_expand(self, req: Request) -> None:
        """``/topic/partition/expand``: more partitions, placed like a new topic's; the
        real lookupd's refusals are 500s with its coordinator's text (measured)."""
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        pnum = self._int_arg(req, "partition_num", 1, MAX_PARTITION_NUM,
                             "MISSING_ARG_TOPIC_PARTITION_NUM",
                             "INVALID_ARG_TOPIC_PARTITION_NUM")
        if not self.is_leader:
            raise HTTPError(500, "Not nsqlookup leader")
        info = self.state.topics.get(topic)
        if info is None or info.classic:
            raise HTTPError(500, "topic is not created")
        if pnum < info.partition_num:
            raise HTTPError(500, "the partition number can not be reduced")
        nodes = self.state.youzan_nodes()
        spread = info.ordered or info.multipart
        if not nodes or (not spread and pnum * info.replica > len(nodes)):
            raise HTTPError(500, COORD_TMP_ERR + "No node is available for topic")
        pending = self.state.slow_creation
        for pid in range(info.partition_num, pnum):
            owners = [nodes[(pid * (1 if spread else info.replica) + r) % len(nodes)].node_id
                      for r in range(info.replica)]
            p = PartitionInfo(topic, pid, None if pending else owners[0], owners)
            p.leader_ready = not pending
            info.partitions.append(p)
        info.partition_num = pnum
        if self.state.creation_check is not None and pending:
            self.state.creation_check()

    async def _topic_meta_update(self, req: Request) -> None:
        """``/topic/meta/update``: no parameter is modelled; as on the real lookupd, the call
        (changing something or not) runs the topic check at once."""
        info = self.state.topics.get(req.arg("topic") or "")
        if not self.is_leader or info is None or info.classic:
            raise HTTPError(400, "Not nsqlookup leader" if not self.is_leader else
                            "topic is not created")
        if self.state.creation_check is not None:
            self.state.creation_check()

    # -- classic admin --------------------------------------------------------------------------

    async def _classic_topic_create(self, req: Request) -> None:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        try:
            check_topic(topic)
        except InvalidArgument:
            raise HTTPError(400, "INVALID_ARG_TOPIC") from None
        if topic not in self.state.topics:
            self.state.topics[topic] = TopicInfo(topic, 0, 0, classic=True)
            self.state.emit("topic_created", topic=topic)
        return None

    async def _classic_topic_delete(self, req: Request) -> None:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if topic not in self.state.topics:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        self.state.delete_topic(topic)
        return None
