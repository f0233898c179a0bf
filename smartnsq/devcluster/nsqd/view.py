"""What the modules serving an nsqd's clients need from the node: :class:`NodeView`.

``tcp``, ``http`` and ``publish`` are written against this protocol, not
against :class:`~smartnsq.devcluster.nsqd.node.NsqdNode`, so that the node module imports them and
nothing imports the node module back.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

from ..state import ClusterState, PartitionInfo, TopicInfo
from .auth import AuthTable
from .channels import Channel
from .identify import IdentifyLimits
from .options import Settings

__all__ = ["NodeView", "start_index"]


class NodeView(Protocol):
    """One nsqd node as its connections and HTTP API see it (``NsqdNode`` is one)."""

    @property
    def state(self) -> ClusterState: ...
    @property
    def options(self) -> Settings: ...
    @property
    def classic(self) -> bool: ...
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def start_time(self) -> int: ...
    @property
    def tls_context(self) -> ssl.SSLContext | None: ...
    @property
    def auth(self) -> AuthTable | None: ...
    @property
    def identify_limits(self) -> IdentifyLimits: ...
    @property
    def exiting(self) -> bool: ...
    @property
    def node_id(self) -> str: ...
    @property
    def tcp_port(self) -> int: ...
    @property
    def http_port(self) -> int: ...
    @property
    def connections(self) -> set[Any]:
        """The open client connections (``NsqdConnection``), which add and remove themselves."""

    def held_partition(self, topic: str, partition: int) -> PartitionInfo | None: ...
    def default_partition(self, topic: str) -> int: ...
    def classic_partition(self, topic: str) -> PartitionInfo: ...
    def channel(self, p: PartitionInfo, info: TopicInfo | None, name: str) -> Channel: ...


def start_index(channel: Channel, kind: str, value: int) -> int:
    """The log index a ``SUB_ADVANCED`` / ``/channel/setoffset`` position names on
    ``channel`` (``ValueError`` with the reason when none).

    The real youzan nsqd counts ``msgcount:N`` from 1: it starts at the N-th message, so
    ``msgcount:0`` and ``msgcount:1`` both start at the first one and ``msgcount:2`` skips
    one (``consistence SearchLogByMsgCnt`` stops once ``N - 1`` messages are behind it;
    ``tests/both/test_wire_youzan.py`` pins it on both clusters).
    """
    if kind == "msgcount":
        value = max(value - 1, 0)
    return channel.search(kind, value)
