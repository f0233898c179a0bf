"""``DevCluster``: lookupds, nsqd nodes and fault injection, started and stopped together.

Everything is in-process and on loopback. All servers share one :class:`ClusterState` (what
etcd and the replicated partition logs hold in a real cluster), so a fault is a change of that
state or of a server's sockets, and every client-visible effect follows from the servers'
behaviour, as on a real cluster:

=============================  ======================================================
fault                          what a client sees
=============================  ======================================================
``stop_node``                  its TCP/HTTP ports refuse; open connections get EOF/RST;
                               its partitions vanish from lookups (no leader) until
                               ``start_node`` or a failover (``failover=True``)
``kill_node``                  SIGKILL on the profile's clock (``FaultProfile``): no
                               leader for the leaderless window, live leaders that lost a
                               replica stall then refuse writes until the ISR shrinks
``leave_node``                 SIGTERM: ``E_PUB_FAILED exiting``, leadership handed off
``move_leader``                the old leader answers PUB ``E_FAILED_ON_NOT_LEADER``,
                               lookups name the new leader
``set_writable(..., False)``   PUB ``E_FAILED_ON_NOT_WRITABLE``; ``access=w`` lookups
                               hide the partition, ``access=r`` still list it; with
                               ``refuse_sub=True`` a new SUB is refused the same way
``stop_lookupd``               that lookupd refuses connections; if it led, another
                               lookupd becomes leader (``/listlookup``)
``cut_connections``            (proxied) every open client connection closes at once
``stall``                      (proxied) connections stay open, nothing arrives
``slow``                       (proxied) every response arrives ``seconds`` late
=============================  ======================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..admin import AsyncAdmin
from ..errors import AdminError, Timeout
from .faults import FaultClock
from .lookupd import Lookupd
from .nsqd.node import NsqdNode
from .profile import OFF, FaultProfile
from .proxy import TCPProxy
from .state import ClusterState, NodeInfo, TopicInfo

__all__ = ["DevCluster", "NodeProxies"]

log = logging.getLogger("smartnsq.devcluster.cluster")

MODES = ("youzan", "classic", "mixed")

NodeRef = Any  # an index into ``cluster.nodes``, a node_id, a NodeInfo or a node object


@dataclass
class NodeProxies:
    """The two proxies standing in front of one nsqd when the cluster is ``proxied``."""

    tcp: TCPProxy
    http: TCPProxy

    def all(self) -> tuple[TCPProxy, TCPProxy]:
        return self.tcp, self.http


class DevCluster:
    """An embedded NSQ cluster; use as ``async with DevCluster(...) as cluster:``.

    ``mode``: ``"youzan"`` (``nodes`` youzan nsqd + ``lookupds`` youzan lookupds forming one
    cluster), ``"classic"`` (``nodes`` classic nsqd 1.3 + classic lookupds) or ``"mixed"``
    (youzan cluster with ``classic_nodes`` classic nsqd registered beside the youzan ones;
    ``classic_nodes > 0`` with ``mode="youzan"`` means the same). ``tls`` and ``auth`` are
    handed to every nsqd (``tls``: an ``ssl.SSLContext`` enabling IDENTIFY ``tls_v1``;
    ``auth``: the secrets table of ``smartnsq.devcluster.nsqd.auth``), and so are
    ``nsqd_options`` (``NsqdOptions`` fields such as ``msg_timeout=5000``). ``proxied=True`` puts a
    :class:`TCPProxy` in front of each nsqd's TCP and HTTP port and makes the lookupds
    advertise the proxies, enabling ``cut_connections``/``stall``/``slow``.
    ``unix_sockets=True`` has every nsqd also serve its TCP protocol on a unix socket in a
    temporary folder of the cluster's (``nsqd_unix_addresses``; lookupd lists the TCP ports,
    as a real classic nsqd on a socket cannot register).
    ``profile`` (a :class:`~smartnsq.devcluster.profile.FaultProfile`, default ``OFF``: no
    fault takes time) says how long ``kill_node``/``leave_node`` and topic creation take; its
    :class:`~smartnsq.devcluster.faults.FaultClock` is ``cluster.faults``.
    """

    def __init__(self, nodes: int = 3, lookupds: int = 2, classic_nodes: int = 0,
                 mode: str = "youzan", tls: Any = None, auth: Any = None, *,
                 proxied: bool = False, host: str = "127.0.0.1",
                 lookupd_http_ports: Sequence[int] = (),
                 nsqd_tcp_ports: Sequence[int] = (), nsqd_http_ports: Sequence[int] = (),
                 nsqd_options: Mapping[str, Any] | None = None,
                 node_factory: Callable[..., NsqdNode] = NsqdNode,
                 state: ClusterState | None = None,
                 profile: FaultProfile = OFF, unix_sockets: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if nodes < 0 or lookupds < 0 or classic_nodes < 0:
            raise ValueError("node and lookupd counts must be >= 0")
        if mode == "youzan" and classic_nodes:
            mode = "mixed"
        if mode == "mixed" and not classic_nodes:
            classic_nodes = 1
        if mode == "classic":
            classic_nodes, nodes = nodes + classic_nodes, 0
        self.mode = mode
        self.host = host
        self.tls = tls
        self.auth = auth
        self.proxied = proxied
        self.state = state if state is not None else ClusterState()
        self._youzan_count = nodes
        self._classic_count = classic_nodes
        self._lookupd_count = lookupds
        self._lookupd_ports = list(lookupd_http_ports)
        self._tcp_ports = list(nsqd_tcp_ports)
        self._http_ports = list(nsqd_http_ports)
        self._node_factory = node_factory
        self._nsqd_options = dict(nsqd_options or {})
        self._unix_sockets = unix_sockets
        self._socket_dir: str | None = None  # made at the first start, removed at stop
        self.lookupds: list[Lookupd] = []
        self.nodes: list[NsqdNode] = []
        self.proxies: dict[str, NodeProxies] = {}
        self.profile = profile
        self.faults = FaultClock(self.state, profile, self._crash_stop)
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> DevCluster:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            if self.lookupds or self.nodes:  # started before: bring the same servers back
                await self._restart()
            else:
                await self._start_lookupds()
                await self._start_nodes()
            self.faults.start()
        except BaseException:
            await self.stop()
            raise
        log.info("dev cluster up: lookupds %s, nsqd %s", self.lookupd_http_addresses,
                 self.nsqd_tcp_addresses)

    async def _restart(self) -> None:
        if self._socket_dir is not None:
            os.makedirs(self._socket_dir, exist_ok=True)  # stop() removed it
        for lookupd in self.lookupds:
            await lookupd.start()
        if self.mode != "classic" and self.leader_lookupd is None and self.lookupds:
            self.state.lookupd_leader = self.lookupds[0].node_id
        for node in self.nodes:
            await node.start()
            self.node_info(node).alive = True
        for proxies in self.proxies.values():
            for proxy in proxies.all():
                await proxy.start()

    async def _start_lookupds(self) -> None:
        classic = self.mode == "classic"
        for i in range(self._lookupd_count):
            port = self._lookupd_ports[i] if i < len(self._lookupd_ports) else 0
            lookupd = Lookupd(self.state, host=self.host, http_port=port, classic=classic,
                              name=f"nsqlookupd-{i + 1}", advertise=self._advertise)
            self.lookupds.append(lookupd)
            await lookupd.start()
        if not classic and self.lookupds:
            self.state.lookupd_leader = self.lookupds[0].node_id

    async def _start_nodes(self) -> None:
        options = {**self.profile.nsqd_options(), **self._nsqd_options}
        if self._unix_sockets:  # a short path: sun_path holds 107 bytes
            self._socket_dir = tempfile.mkdtemp(prefix="smartnsq-dev-")
        total = self._youzan_count + self._classic_count
        for i in range(total):
            classic = i >= self._youzan_count
            if self._socket_dir is not None:  # only then: a node_factory may not take it
                options["unix_path"] = os.path.join(self._socket_dir, f"nsqd-{i + 1}.sock")
            node = self._node_factory(
                self.state, host=self.host,
                tcp_port=self._tcp_ports[i] if i < len(self._tcp_ports) else 0,
                http_port=self._http_ports[i] if i < len(self._http_ports) else 0,
                classic=classic, tls=self.tls, auth=self.auth, name=f"nsqd-{i + 1}",
                **options)
            self.nodes.append(node)
            await node.start()
            if self.proxied:
                info = self.node_info(node)
                proxies = NodeProxies(
                    TCPProxy(self.host, info.tcp_port, host=self.host,
                             name=f"nsqd-{i + 1}-tcp-proxy"),
                    TCPProxy(self.host, info.http_port, host=self.host,
                             name=f"nsqd-{i + 1}-http-proxy"))
                for proxy in proxies.all():
                    await proxy.start()
                self.proxies[info.node_id] = proxies

    async def stop(self) -> None:
        """Stop everything: nodes, proxies, lookupds (in that order). Safe to call twice."""
        self.faults.stop()
        for proxies in self.proxies.values():
            for proxy in proxies.all():
                with contextlib.suppress(Exception):
                    await proxy.stop()
        for node in reversed(self.nodes):
            try:
                await node.stop()
            except Exception:
                log.exception("stopping %r failed", node)
        for lookupd in self.lookupds:
            await lookupd.stop()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._started = False

    # -- addresses ------------------------------------------------------------------------------

    def _advertise(self, info: NodeInfo) -> tuple[str, int, int]:
        proxies = self.proxies.get(info.node_id)
        if proxies is None:
            return info.broadcast_address, info.tcp_port, info.http_port
        return self.host, proxies.tcp.port, proxies.http.port

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """``host:port`` of every lookupd's HTTP API (stopped ones included)."""
        return [lookupd.http_address for lookupd in self.lookupds]

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        """``host:port`` clients connect to (the proxies when ``proxied``), in node order."""
        out = []
        for node in self.nodes:
            address, tcp_port, _ = self._advertise(self.node_info(node))
            out.append(f"{address}:{tcp_port}")
        return out

    @property
    def nsqd_unix_addresses(self) -> list[str]:
        """``unix:PATH`` of every nsqd's socket (``unix_sockets=True``), in node order."""
        return [node.unix_address for node in self.nodes if node.unix_address is not None]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        out = []
        for node in self.nodes:
            address, _, http_port = self._advertise(self.node_info(node))
            out.append(f"{address}:{http_port}")
        return out

    @property
    def youzan_nodes(self) -> list[Any]:
        return [n for n in self.nodes if not self.node_info(n).classic]

    @property
    def classic_nodes(self) -> list[Any]:
        return [n for n in self.nodes if self.node_info(n).classic]

    @property
    def leader_lookupd(self) -> Lookupd | None:
        for lookupd in self.lookupds:
            if lookupd.running and lookupd.is_leader:
                return lookupd
        return None

    # -- node references ------------------------------------------------------------------------

    def node_info(self, node: NodeRef) -> NodeInfo:
        """The NodeInfo of a node given as index, node_id, NodeInfo or node object."""
        if isinstance(node, NodeInfo):
            return node
        if isinstance(node, int):
            node = self.nodes[node]
        if isinstance(node, str):
            return self.state.nodes[node]
        info = getattr(node, "info", None)
        if isinstance(info, NodeInfo):
            return info
        node_id = getattr(node, "node_id", None)
        if isinstance(node_id, str) and node_id in self.state.nodes:
            return self.state.nodes[node_id]
        raise LookupError(f"not a node of this cluster: {node!r}")

    def node(self, ref: NodeRef) -> Any:
        """The node object for an index, node_id, NodeInfo or node object."""
        if isinstance(ref, int):
            return self.nodes[ref]
        node_id = self.node_info(ref).node_id
        for node in self.nodes:
            if self.node_info(node).node_id == node_id:
                return node
        raise LookupError(f"not a node of this cluster: {ref!r}")

    def leader_of(self, topic: str, partition: int = 0) -> Any | None:
        """The node object leading a partition (None while it has no leader)."""
        p = self.state.partition(topic, partition)
        if p is None:
            raise KeyError(f"{topic}/{partition}")
        return None if p.leader is None else self.node(p.leader)

    def _lookupd(self, ref: int | Lookupd) -> Lookupd:
        return self.lookupds[ref] if isinstance(ref, int) else ref

    # -- topics ---------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int = 1, replicas: int = 1, *,
                           ordered: bool = False, ext: bool = False,
                           multipart: bool | None = None,
                           disable_channel_auto_create: bool = False,
                           channels: Sequence[str] | None = ("default",),
                           timeout: float | None = None) -> TopicInfo:
        """Create a topic the way an operator does, and return once it is writable.

        The operator is :meth:`smartnsq.admin.AsyncAdmin.create_topic` (``wait=True``), so the
        dev cluster exercises the same workflow users run against a real cluster. Youzan/mixed:
        ``POST /topic/create`` on the leader lookupd, re-sent every ``create_resend`` of the
        profile until the topic is usable (with ``slow_creation`` partitions get leaders only
        from a cluster check, as on a real cluster); ``/channel/create`` on each
        partition's leader nsqd for every channel (``access=w`` lookups hide partitions without
        a channel), until an ``access=w`` lookup lists every partition; then until every
        leader serves (without channels a read lookup can name a leader that does not serve
        yet). ``multipart`` defaults to what the cluster needs (partitions x replicas > live
        youzan nodes). Classic: ``/topic/create`` and ``/channel/create`` on every nsqd the
        lookupds know. ``timeout`` (default: 10 s plus what the profile's creation can take)
        bounds it all (:class:`~smartnsq.errors.Timeout`). Raises ``RuntimeError`` with the
        server's message if a server refuses, ``InvalidArgument`` (naming the field) for
        arguments no server would take.
        """
        if timeout is None:
            timeout = 10.0 + 2 * sum(self.profile.longest(name) for name in (
                "create_resend", "check_min_spacing", "check_delay", "leader_ready_delay"))
        if self.mode != "classic" and self.leader_lookupd is None:
            raise RuntimeError("no lookupd is leading: start one with start_lookupd()")
        if multipart is None:
            alive = len(self.state.youzan_nodes())
            multipart = not ordered and partitions * replicas > alive
        deadline = time.monotonic() + timeout
        async with AsyncAdmin(self.lookupd_http_addresses, timeout=min(5.0, timeout)) as admin:
            try:
                await admin.create_topic(
                    name, partitions, replicas, ordered=ordered, ext=ext, multipart=multipart,
                    disable_channel_auto_create=disable_channel_auto_create,
                    channels=list(channels or ()), timeout=timeout,
                    resend_interval=max(self.profile.seconds("create_resend"), 0.05),
                    poll_interval=0.02)
            except AdminError as exc:
                raise RuntimeError(str(exc)) from exc
        info = self.state.topics[name]
        if self.mode != "classic":
            await self._until_serving(info, deadline)
        return info

    async def _until_serving(self, info: TopicInfo, deadline: float) -> None:
        """Until every partition's leader serves (it answers ``/channel/create``)."""
        while not all(p.leader is not None and p.leader_ready for p in info.partitions):
            if time.monotonic() >= deadline:
                raise Timeout(f"creating topic {info.name!r}: a leader does not serve yet")
            await asyncio.sleep(0.01)

    async def delete_topic(self, name: str) -> None:
        self.state.delete_topic(name)

    # -- faults: nodes and partitions -----------------------------------------------------------

    async def stop_node(self, ref: NodeRef, *, failover: bool = False) -> None:
        """Stop an nsqd as a crash would (sockets close, data kept in the state).

        Its partitions keep it as leader, so lookups list no leader for them, as a real
        cluster does until etcd's session expires; ``failover=True`` moves each one to an
        alive replica at once instead.
        """
        node = self.node(ref)
        info = self.node_info(node)
        proxies = self.proxies.get(info.node_id)
        if proxies is not None:
            for proxy in proxies.all():
                await proxy.refuse()
                proxy.cut()
        await node.stop()
        info.alive = False
        self.state.emit("node_down", node=info.node_id)
        if failover:
            for topic in list(self.state.topics.values()):
                for p in topic.partitions:
                    if p.leader == info.node_id:
                        self.state.move_leader(topic.name, p.partition)

    async def kill_node(self, ref: NodeRef) -> None:
        """Kill an nsqd as SIGKILL does, and let the cluster react on the profile's clock.

        Its connections drop at once and its ports refuse. The partitions it led have no leader
        for ``leaderless_window``, then a replica leads (``E_FAILED_ON_NOT_WRITABLE`` for
        ``elect_not_writable``). A partition whose live leader had a replica on it leaves PUBs
        unanswered for ``replica_stall``, then answers ``E_FAILED_ON_NOT_WRITABLE`` until
        ``isr_shrink``; below a write quorum it stays so until ``replica_catchup``. Every
        committed message is kept. Returns at once; ``await cluster.faults.settled()`` waits
        for the sequence to end.
        """
        info = self.node_info(ref)
        await self.stop_node(ref)
        self.faults.node_lost(info.node_id)

    async def leave_node(self, ref: NodeRef) -> None:
        """Stop an nsqd gracefully as SIGTERM does, on the profile's clock.

        At once: new connections are refused, consumers get EOF, PUB on an open connection
        answers ``E_PUB_FAILED exiting``. Each partition it led moves to a replica after
        ``leave_handoff`` (its second one after ``leave_slow_handoff``); one partition whose
        leader stays up leaves PUBs unanswered for ``leave_stall``. Then the node stops.
        Returns at once; ``await cluster.faults.settled()`` waits for the node to be gone.
        """
        node = self.node(ref)
        info = self.node_info(node)
        if not info.alive:
            raise RuntimeError(f"{info.node_id} is not running")
        proxies = self.proxies.get(info.node_id)
        if proxies is not None:
            await proxies.tcp.refuse()
        node.begin_exit()
        self.faults.node_leaving(info.node_id)

    async def _crash_stop(self, node_id: str) -> None:
        if self.state.nodes[node_id].alive:
            await self.stop_node(node_id)

    async def start_node(self, ref: NodeRef) -> None:
        """Restart a stopped nsqd on the same ports; it serves what it still leads."""
        node = self.node(ref)
        if getattr(node, "exiting", False) and getattr(node, "running", False):
            raise RuntimeError("the node is still leaving: await cluster.faults.settled()")
        await node.start()
        info = self.node_info(node)
        info.alive = True
        self.state.emit("node_up", node=info.node_id)
        self.faults.node_back(info.node_id)
        proxies = self.proxies.get(info.node_id)
        if proxies is not None:
            for proxy in proxies.all():
                await proxy.accept()

    def move_leader(self, topic: str, partition: int, to: NodeRef | None = None) -> Any:
        """Hand a partition's leadership to ``to`` (default: the next alive replica).

        Returns the new leader node. The old leader then answers ``E_FAILED_ON_NOT_LEADER``.
        """
        target = None if to is None else self.node_info(to).node_id
        new = self.state.move_leader(topic, partition, target)
        return None if new is None else self.node(new)

    def set_writable(self, topic: str, partition: int, writable: bool, *,
                     refuse_sub: bool = False) -> None:
        """Disable (or re-enable) writes on a partition, as during an ISR shortage.

        ``refuse_sub=True`` (with ``writable=False``) disables the leader's channels too, as
        the real leader does while below its write quorum or catching up: a new ``SUB`` is
        refused with ``E_FAILED_ON_NOT_WRITABLE`` (fatal) until writes come back; the
        consumers already subscribed keep theirs."""
        self.state.set_writable(topic, partition, writable, refuse_sub=refuse_sub)

    def tombstone(self, ref: NodeRef, tombstoned: bool = True) -> None:
        """Hide a node from ``access=w`` lookups (``/topic/tombstone``), or restore it."""
        self.node_info(ref).tombstoned = tombstoned

    # -- faults: lookupds -----------------------------------------------------------------------

    async def stop_lookupd(self, ref: int | Lookupd) -> None:
        """Stop a lookupd (its port refuses); if it led, the next alive one takes over."""
        lookupd = self._lookupd(ref)
        await lookupd.stop()
        if self.mode != "classic" and self.state.lookupd_leader == lookupd.node_id:
            alive = [lk for lk in self.lookupds if lk.running]
            self.state.lookupd_leader = alive[0].node_id if alive else None

    async def start_lookupd(self, ref: int | Lookupd) -> None:
        """Restart a lookupd on its old port; it follows (or leads, if none does)."""
        await self._lookupd(ref).start()

    # -- faults: connections (proxied clusters) -------------------------------------------------

    def _proxies(self, ref: NodeRef | None, which: str) -> list[TCPProxy]:
        if not self.proxied:
            raise RuntimeError("connection faults need DevCluster(proxied=True)")
        if which not in ("tcp", "http", "both"):
            raise ValueError("which must be 'tcp', 'http' or 'both'")
        selected = (list(self.proxies.values()) if ref is None
                    else [self.proxies[self.node_info(ref).node_id]])
        out: list[TCPProxy] = []
        for proxies in selected:
            if which in ("tcp", "both"):
                out.append(proxies.tcp)
            if which in ("http", "both"):
                out.append(proxies.http)
        return out

    def cut_connections(self, node: NodeRef | None = None, which: str = "tcp") -> int:
        """Close every open client connection to a node (all nodes if None); returns the count."""
        return sum(proxy.cut() for proxy in self._proxies(node, which))

    def stall(self, node: NodeRef | None = None, which: str = "tcp") -> None:
        """Stop forwarding to/from a node (all if None); connections stay open and silent."""
        for proxy in self._proxies(node, which):
            proxy.stall()

    def resume(self, node: NodeRef | None = None, which: str = "both") -> None:
        """Undo ``stall``; held bytes are delivered in order."""
        for proxy in self._proxies(node, which):
            proxy.resume()

    def slow(self, node: NodeRef | None = None, seconds: float = 0.5,
             which: str = "tcp") -> None:
        """Deliver every response from a node (all if None) ``seconds`` late (0 undoes it)."""
        for proxy in self._proxies(node, which):
            proxy.set_delay(response=seconds, request=proxy.request_delay)

    # -- presentation ---------------------------------------------------------------------------

    def describe(self) -> str:
        """A human summary of the addresses (what ``smartnsq dev-cluster`` prints)."""
        lines = [f"smartnsq dev cluster ({self.mode})"]
        for lookupd in self.lookupds:
            role = " (leader)" if lookupd.is_leader else ""
            lines.append(f"  nsqlookupd http://{lookupd.http_address}{role}")
        for node, tcp, http in zip(self.nodes, self.nsqd_tcp_addresses,
                                   self.nsqd_http_addresses, strict=True):
            kind = "classic nsqd" if self.node_info(node).classic else "nsqd"
            lines.append(f"  {kind} tcp {tcp} http http://{http}")
        return "\n".join(lines)
