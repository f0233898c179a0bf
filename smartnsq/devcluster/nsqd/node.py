"""nsqd of the dev cluster: a youzan 0.3.7-HA.1.13.0 node, or a classic nsqd 1.3.0.

``NsqdNode(state, classic=False, ...)`` listens on a TCP port (protocol V2) and an HTTP port,
on loopback, and serves what :class:`~smartnsq.devcluster.state.ClusterState` says it holds:

* youzan: the partitions whose ``replicas`` include it; it accepts writes and subscriptions
  only for those it leads (replicas answer ``E_FAILED_ON_NOT_LEADER``), never creates topics
  (``E_TOPIC_NOT_EXIST``), and drops the subscribers of a partition whose leadership moves
  away or whose topic is deleted;
* classic: its own topics, created on first use and recorded in the state as one pseudo
  partition per (topic, node), which is how lookupd lists classic producers.

Data lives in the state, not in the node: ``stop()`` closes the listeners and every client
connection as a crash would, ``start()`` brings the node back on the same ports with
everything it held. ::

    state = ClusterState()
    node = NsqdNode(state)                      # youzan; NsqdNode(state, classic=True)
    await node.start()
    state.create_topic("orders", partition_num=1)
    ...                                         # clients connect to node.tcp_address
    await node.stop()

``unix_path`` also serves the TCP protocol on a unix socket at that path (classic nsqd 1.3's
``--tcp-address=/path``), beside the TCP port that lookupd lists: the same handlers, TLS and
compression included. The socket file is made at ``start()`` and removed at ``stop()``.

Options: ``tls`` (an ``ssl.SSLContext``; IDENTIFY ``tls_v1`` then upgrades), ``tls_required``,
``auth`` (a secrets table, see :mod:`smartnsq.devcluster.nsqd.auth`) and any
:class:`NsqdOptions` field as a keyword (``msg_timeout=5000``, ``max_rdy_count=100``...).

Where a new channel starts: a youzan channel at the end of its partition (create channels
before publishing, as ``DevCluster.create_topic(channels=...)`` does, or rewind with
``SUB_ADVANCED``/``/channel/setoffset``); a classic topic's first channel gets what the topic
kept while it had none, later channels start at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any

from ..state import (
    CLASSIC_VERSION,
    YOUZAN_VERSION,
    ClusterState,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)
from .auth import AuthTable
from .channels import Channel
from .http import NsqdHTTP
from .identify import IdentifyLimits
from .options import NsqdOptions
from .tcp import NsqdConnection

__all__ = ["NsqdNode"]

log = logging.getLogger("smartnsq.devcluster.nsqd")

class NsqdNode:
    """One nsqd (see the module doc). Construct, ``await start()``, ``await stop()``."""

    def __init__(self, state: ClusterState, *, host: str = "127.0.0.1", tcp_port: int = 0,
                 http_port: int = 0, classic: bool = False,
                 tls: ssl.SSLContext | None = None,
                 auth: AuthTable | Mapping[str, Any] | None = None, name: str = "nsqd",
                 hostname: str | None = None, options: NsqdOptions | None = None,
                 unix_path: str | None = None, **settings: Any) -> None:
        base = options or NsqdOptions()
        known = {f.name for f in dataclasses.fields(NsqdOptions)}
        unknown = set(settings) - known
        if unknown:
            raise TypeError(f"unknown nsqd options: {sorted(unknown)}")
        if settings:
            base = dataclasses.replace(base, **settings)
        self.state = state
        self.host = host
        self.classic = classic
        self.name = name
        self.hostname = hostname or socket.gethostname()
        self.options = base.resolved(classic)
        self.tls_context = tls
        self.auth = AuthTable.build(auth)
        self.version = CLASSIC_VERSION if classic else YOUZAN_VERSION
        self.identify_limits = IdentifyLimits(
            max_heartbeat_interval=self.options.max_heartbeat_interval,
            max_output_buffer_size=self.options.max_output_buffer_size,
            min_output_buffer_timeout=self.options.min_output_buffer_timeout,
            max_output_buffer_timeout=self.options.max_output_buffer_timeout,
            max_msg_timeout=self.options.max_msg_timeout)
        self.connections: set[NsqdConnection] = set()
        self.info: NodeInfo | None = None
        self.start_time = int(time.time())
        self._tcp_port = tcp_port
        self._server: asyncio.Server | None = None
        self.unix_path = unix_path
        self._unix_server: asyncio.Server | None = None
        self.exiting = False  # a graceful leave is under way (see begin_exit)
        self.http = NsqdHTTP(self, http_port)

    def __repr__(self) -> str:
        kind = "classic nsqd" if self.classic else "nsqd"
        return f"<{kind} {self.name} tcp={self.tcp_address} http={self.http_address}>"

    # -- addresses ------------------------------------------------------------------------------

    @property
    def tcp_port(self) -> int:
        return self._tcp_port

    @property
    def http_port(self) -> int:
        return self.http.port

    @property
    def tcp_address(self) -> str:
        return f"{self.host}:{self._tcp_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http.port}"

    @property
    def unix_address(self) -> str | None:
        """``unix:PATH`` of the socket listener (what a client's ``nsqd=`` takes), if any."""
        return None if self.unix_path is None else f"unix:{self.unix_path}"

    @property
    def node_id(self) -> str:
        """youzan: ``ip:rpc_port:tcp_port:n`` (its distributed id); classic: ``ip:tcp_port``.

        Fixed at the first ``start()`` (the ports are known then) and kept across restarts.
        """
        if self.info is None:
            raise RuntimeError("the node has no id before its first start()")
        return self.info.node_id

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (again, on the same ports after a stop) and show up as alive."""
        if self._server is not None:
            return
        self.exiting = False
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: NsqdConnection(self), self.host,
                                                self._tcp_port, reuse_address=True)
        self._tcp_port = self._server.sockets[0].getsockname()[1]
        try:
            if self.unix_path is not None:
                self._unix_server = await loop.create_unix_server(
                    lambda: NsqdConnection(self), self.unix_path)
            await self.http.start()
        except BaseException:
            self._close_listeners()
            self._server = None
            raise
        if self.info is None:
            self.info = NodeInfo(self._make_id(), self.host, self._tcp_port, self.http.port,
                                 self.hostname, classic=self.classic)
            self.state.nodes[self.info.node_id] = self.info
        self.info.alive = True
        if self._on_event not in self.state.listeners:
            self.state.listeners.append(self._on_event)
        log.info("%s listening on tcp %s http %s%s", self.name, self.tcp_address,
                 self.http_address, "" if self.unix_path is None else f" {self.unix_address}")

    def _make_id(self) -> str:
        if self.classic:
            return f"{self.host}:{self._tcp_port}"
        return f"{self.host}:{self._tcp_port + 100}:{self._tcp_port}:" \
               f"{self.state.next_node_number()}"

    async def stop(self) -> None:
        """Close the listeners and drop every client connection; the data stays in the state."""
        server, self._server = self._server, None
        if server is None:
            return
        self._close_listeners(server)
        for conn in list(self.connections):
            conn.abort()
        self.connections.clear()
        await self.http.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._on_event in self.state.listeners:
            self.state.listeners.remove(self._on_event)
        if self.info is not None:
            self.info.alive = False
        log.info("%s stopped", self.name)

    def begin_exit(self) -> None:
        """Start a graceful leave (SIGTERM): stop accepting, drop the consumers, and answer
        PUB ``E_PUB_FAILED exiting`` until ``stop()`` (failover_sigterm_*.txt)."""
        self.exiting = True
        if self._server is not None:
            self._close_listeners()  # new connections are refused; open ones stay
        for conn in list(self.connections):
            if conn.channel is not None:
                conn.close()

    def _close_listeners(self, server: asyncio.Server | None = None) -> None:
        """Stop accepting on the TCP port and the socket. The socket's file goes with its
        listener, as a real nsqd's does when it exits (a SIGKILLed one leaves it behind, which
        refuses connections: a deviation docs/devcluster.md lists)."""
        for listener in (server or self._server, self._unix_server):
            if listener is not None:
                listener.close()
        if self._unix_server is not None and self.unix_path is not None:
            self._unix_server = None
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    # -- what this node serves ------------------------------------------------------------------

    def held_partition(self, topic: str, partition: int) -> PartitionInfo | None:
        """A youzan partition this node has a copy of (leader or replica), else None."""
        info = self.state.topics.get(topic)
        if info is None or info.classic or not 0 <= partition < len(info.partitions):
            return None
        p = info.partitions[partition]
        node_id = self.node_id
        return p if p.leader == node_id or node_id in p.replicas else None

    def default_partition(self, topic: str) -> int:
        """The partition a request without one gets: the lowest one this node leads, else -1."""
        if self.info is None:
            return -1
        led = self.state.led_by(self.node_id, topic)
        return min((p.partition for p in led), default=-1)

    def classic_partition(self, topic: str) -> PartitionInfo:
        """This classic node's copy of a topic, created on first use."""
        p = self.state.classic_partition(topic, self.node_id)
        assert p is not None
        return p

    def channel(self, p: PartitionInfo, info: TopicInfo | None, name: str) -> Channel:
        """The channel of a partition, created on first use."""
        existing = p.channels.get(name)
        if isinstance(existing, Channel) and not existing.closed:
            return existing
        channel = Channel(p, name, ordered_topic=bool(info and info.ordered),
                          ext=bool(info and info.ext), classic=self.classic,
                          first_twice=self.options.ordered_first_delivery_twice)
        p.channels[name] = channel
        return channel

    # -- reacting to the cluster ----------------------------------------------------------------

    def _on_event(self, event: str, details: dict[str, Any]) -> None:
        if event == "leader_moved" and self.info is not None \
                and details.get("old") == self.info.node_id:
            self._drop_subscribers(details["topic"], details.get("partition"))
        elif event == "topic_deleted":
            self._drop_subscribers(details["topic"], None, close_channels=True)

    def _drop_subscribers(self, topic: str, partition: int | None, *,
                          close_channels: bool = False) -> None:
        """The real server closes consumers of a partition it no longer serves."""
        for conn in list(self.connections):
            if conn.subscribed_to(topic, partition):
                channel = conn.channel
                conn.close()
                if close_channels and channel is not None:
                    channel.close()
