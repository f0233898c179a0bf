"""The admin endpoint of a running dev cluster: faults injected from another process.

A Spark job, a second program or a shell (``smartnsq dev-cluster fault ...``) reaches a running
``smartnsq dev-cluster`` here. It is plain HTTP on loopback only (no auth: anyone on the machine
could kill a node, which is the point of a dev cluster and why it never binds elsewhere).
Answers are JSON; an error is ``{"message": ...}`` with status 400 naming the bad argument.

=========================================  ==============================================
route                                      what it does
=========================================  ==============================================
``GET /status``                            profile, nodes (alive, id, addresses), lookupds,
                                           topics with leaders, the fault timeline's tail
``POST /fault/kill?node=N``                ``kill_node`` (SIGKILL on the profile's clock)
``POST /fault/leave?node=N``               ``leave_node`` (SIGTERM)
``POST /fault/stop?node=N``                ``stop_node`` (crash, no failover)
``POST /fault/start?node=N``               ``start_node``
``POST /fault/move_leader?topic=T&partition=P[&to=N]``
``POST /fault/writable?topic=T&partition=P&writable=true|false``
``POST /fault/stop_lookupd?lookupd=I``     and ``/fault/start_lookupd``
``POST /fault/cut|stall|resume[?node=N]``  connection faults (proxied clusters)
``POST /fault/settle[?timeout=S]``         answers once every fault sequence has ended
``POST /topic/create?topic=T&partitions=P&replicas=R[&ordered=true][&ext=true][&channel=C]``
=========================================  ==============================================

``node`` is an index into the cluster's nodes (as ``smartnsq dev-cluster`` prints them) or a
node id.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from types import TracebackType
from typing import Any

from .cluster import DevCluster
from .httpserver import PLAIN, V1, HTTPError, HTTPServer, Request

__all__ = ["AdminServer", "check_loopback", "cluster_status", "replicas_error"]

log = logging.getLogger("smartnsq.devcluster.admin")

TIMELINE_TAIL = 50
MAX_SETTLE = 600.0


def check_loopback(host: str) -> None:
    """Refuse any address outside 127.0.0.0/8 (the admin endpoint has no authentication)."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"admin host must be a loopback address, not {host!r}")


def cluster_status(cluster: DevCluster, timeline: int = TIMELINE_TAIL) -> dict[str, Any]:
    """What ``GET /status`` answers (and what ``smartnsq dev-cluster`` prints at start): the
    profile, the nodes (numbered as the fault commands take them), the lookupds, the topics
    with their leaders and replicas (node ids), and the fault timeline's tail (each event's
    ``ago``: seconds before this answer)."""
    c = cluster
    nodes = []
    for i, (node, tcp, http) in enumerate(zip(c.nodes, c.nsqd_tcp_addresses,
                                              c.nsqd_http_addresses, strict=True)):
        info = c.node_info(node)
        nodes.append({"index": i, "id": info.node_id, "tcp": tcp, "http": http,
                      "alive": info.alive, "classic": info.classic,
                      "exiting": bool(getattr(node, "exiting", False))})
    topics = {}
    for name, topic in c.state.topics.items():
        topics[name] = [{"partition": p.partition, "leader": p.leader,
                         "replicas": list(p.replicas), "writable": p.writable,
                         "leader_ready": p.leader_ready, "stalled": p.stalled()}
                        for p in topic.partitions]
    now = time.monotonic()
    events = [{"at": e.at, "ago": round(now - e.at, 3), "what": e.what, **e.details}
              for e in (c.faults.timeline[-timeline:] if timeline else [])]
    return {"mode": c.mode, "proxied": bool(c.proxied), "profile": c.profile.describe(),
            "nodes": nodes,
            "lookupds": [{"index": i, "http": lk.http_address, "running": lk.running,
                          "leader": lk.is_leader} for i, lk in enumerate(c.lookupds)],
            "topics": topics, "busy": c.faults.busy, "timeline": events}


def replicas_error(topic: str, partitions: int, replicas: int, nodes: int) -> str | None:
    """The sentence for a topic needing more nodes than the cluster has (the server's own
    answer is ``ErrType:9 ErrCode:1 : No node is available for topic``), else ``None``."""
    if replicas <= nodes:
        return None
    return (f"{partitions} partition{'s' if partitions != 1 else ''} x {replicas} replicas "
            f"need {replicas} nodes; the cluster has {nodes} (lower the replicas of "
            f"{topic!r}, or start the cluster with --nodes {replicas})")


class AdminServer:
    """The admin HTTP API of one started :class:`~smartnsq.devcluster.cluster.DevCluster`::

        async with DevCluster(...) as cluster, AdminServer(cluster, port=0) as admin:
            print(admin.address)
    """

    def __init__(self, cluster: DevCluster, host: str = "127.0.0.1", port: int = 0) -> None:
        check_loopback(host)
        self.cluster = cluster
        self.http = HTTPServer(host, port, name="devcluster-admin")
        r = self.http.route
        r("GET", "/ping", self._ping, PLAIN)
        r("GET", "/status", self._status, V1)
        for name in ("kill", "leave", "stop", "start"):
            r("POST", f"/fault/{name}", self._node_fault, V1)
        r("POST", "/fault/move_leader", self._move_leader, V1)
        r("POST", "/fault/writable", self._writable, V1)
        r("POST", "/fault/stop_lookupd", self._lookupd_fault, V1)
        r("POST", "/fault/start_lookupd", self._lookupd_fault, V1)
        for name in ("cut", "stall", "resume"):
            r("POST", f"/fault/{name}", self._connection_fault, V1)
        r("POST", "/fault/settle", self._settle, V1)
        r("POST", "/topic/create", self._topic_create, V1)

    @property
    def address(self) -> str:
        return self.http.address

    async def start(self) -> None:
        await self.http.start()
        log.info("dev cluster admin on http://%s", self.address)

    async def stop(self) -> None:
        await self.http.stop()

    async def __aenter__(self) -> AdminServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # -- arguments --------------------------------------------------------------------------

    def _node(self, req: Request, required: bool = True) -> Any:
        text = req.arg("node")
        if not text:
            if required:
                raise HTTPError(400, "missing argument: node")
            return None
        try:
            return self.cluster.node(int(text) if text.isdigit() else text)
        except (LookupError, IndexError):
            raise HTTPError(400, f"node: no node {text!r} (the cluster's nodes are "
                                 f"#0..#{len(self.cluster.nodes) - 1}: fault status lists "
                                 f"them)") from None

    @staticmethod
    def _int(req: Request, name: str, default: int | None = None) -> int:
        text = req.arg(name)
        if not text:
            if default is None:
                raise HTTPError(400, f"missing argument: {name}")
            return default
        try:
            return int(text)
        except ValueError:
            raise HTTPError(400, f"{name}: not an integer: {text!r}") from None

    @staticmethod
    def _bool(req: Request, name: str) -> bool:
        text = req.arg(name, "false").lower()
        if text not in ("true", "false", "1", "0"):
            raise HTTPError(400, f"{name}: expected true or false, not {text!r}")
        return text in ("true", "1")

    def _topic(self, req: Request) -> str:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "missing argument: topic")
        if topic not in self.cluster.state.topics:
            raise HTTPError(400, f"topic: no topic {topic!r}")
        return topic

    # -- routes -----------------------------------------------------------------------------

    async def _ping(self, req: Request) -> str:
        return "OK"

    async def _status(self, req: Request) -> dict[str, Any]:
        return cluster_status(self.cluster)

    def _node_index(self, node: Any) -> int | None:
        for i, candidate in enumerate(self.cluster.nodes):
            if candidate is node:
                return i
        return None

    async def _node_fault(self, req: Request) -> dict[str, Any]:
        node = self._node(req)
        action = req.path.rsplit("/", 1)[1]
        try:
            if action == "kill":
                await self.cluster.kill_node(node)
            elif action == "leave":
                await self.cluster.leave_node(node)
            elif action == "stop":
                await self.cluster.stop_node(node)
            else:
                await self.cluster.start_node(node)
        except RuntimeError as exc:
            raise HTTPError(400, str(exc)) from None
        return {"done": action, "node": self.cluster.node_info(node).node_id,
                "index": self._node_index(node)}

    async def _move_leader(self, req: Request) -> dict[str, Any]:
        topic = self._topic(req)
        partition = self._int(req, "partition")
        target = self._node_arg(req.arg("to")) if req.arg("to") else None
        try:
            new = self.cluster.move_leader(topic, partition, target)
        except KeyError:
            raise HTTPError(400, f"partition: no partition {topic}/{partition}") from None
        return {"topic": topic, "partition": partition,
                "leader": None if new is None else self.cluster.node_info(new).node_id,
                "index": None if new is None else self._node_index(new)}

    def _node_arg(self, text: str) -> Any:
        try:
            return self.cluster.node(int(text) if text.isdigit() else text)
        except (LookupError, IndexError):
            raise HTTPError(400, f"to: no node {text!r}") from None

    async def _writable(self, req: Request) -> dict[str, Any]:
        topic = self._topic(req)
        partition = self._int(req, "partition")
        writable = self._bool(req, "writable")
        try:
            self.cluster.set_writable(topic, partition, writable)
        except KeyError:
            raise HTTPError(400, f"partition: no partition {topic}/{partition}") from None
        return {"topic": topic, "partition": partition, "writable": writable}

    async def _lookupd_fault(self, req: Request) -> dict[str, Any]:
        index = self._int(req, "lookupd")
        if not 0 <= index < len(self.cluster.lookupds):
            raise HTTPError(400, f"lookupd: no lookupd {index}")
        if req.path.endswith("stop_lookupd"):
            await self.cluster.stop_lookupd(index)
        else:
            await self.cluster.start_lookupd(index)
        return {"lookupd": index}

    async def _connection_fault(self, req: Request) -> dict[str, Any]:
        node = self._node(req, required=False)
        action = req.path.rsplit("/", 1)[1]
        if not self.cluster.proxied:
            raise HTTPError(400, "connection faults need a proxied cluster: restart it with "
                                 "smartnsq dev-cluster --proxied")
        try:
            if action == "cut":
                return {"cut": self.cluster.cut_connections(node),
                        "index": None if node is None else self._node_index(node)}
            if action == "stall":
                self.cluster.stall(node)
            else:
                self.cluster.resume(node)
        except RuntimeError as exc:
            raise HTTPError(400, str(exc)) from None
        return {"done": action, "index": None if node is None else self._node_index(node)}

    async def _settle(self, req: Request) -> dict[str, Any]:
        timeout = float(self._int(req, "timeout", 60))
        try:
            await self.cluster.faults.settled(min(timeout, MAX_SETTLE))
        except asyncio.TimeoutError:
            raise HTTPError(400, f"timeout: faults still running after {timeout} s") from None
        return {"settled": True}

    async def _topic_create(self, req: Request) -> dict[str, Any]:
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "missing argument: topic")
        channels = req.query.get("channel") or ["default"]
        partitions, replicas = self._int(req, "partitions", 1), self._int(req, "replicas", 1)
        if self.cluster.mode != "classic":
            too_few = replicas_error(topic, partitions, replicas,
                                     len(self.cluster.state.youzan_nodes()))
            if too_few:
                raise HTTPError(400, f"topic {topic}: {too_few}")
        try:
            await self.cluster.create_topic(
                topic, partitions, replicas,
                ordered=self._bool(req, "ordered"), ext=self._bool(req, "ext"),
                channels=channels)
        except (RuntimeError, ValueError, asyncio.TimeoutError) as exc:
            raise HTTPError(400, f"topic: {exc}") from None
        return {"topic": topic, "partitions": partitions, "replicas": replicas}
