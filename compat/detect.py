"""Which kind of server answered: youzan (redesigned, "HA") or classic NSQ.

Every predicate here decides from a fact the server gave (docs/protocol.md §2.4 and §6.5), never
from a port number or a host name, because both kinds run on the same default ports and a cluster
can change kind while running (a migration). The caller asks again on the next answer: a
verdict is only as fresh as the answer it came from.

The facts, most reliable first:

1. a ``/lookup`` answer carries the key ``partitions`` (even ``{}`` or ``null``) on youzan,
   never on classic (:func:`kind_of_lookup`);
2. a node's ``version`` contains ``-HA.`` on youzan (``0.3.7-HA.1.13.0``), not on classic
   (``1.3.0``): the version in a lookup peer, in ``/info``, or in IDENTIFY's answer
   (:func:`kind_of_version`, :func:`kind_of_peer`, :func:`kind_of_identify`);
3. ``GET /info`` of a youzan lookupd has ``ha_support``; classic only ``version``
   (:func:`kind_of_info`);
4. ``GET /listlookup`` is 404 on classic nsqlookupd (:func:`kind_of_listlookup`).

Sans-I/O: the functions take the HTTP status and the decoded JSON (or the IDENTIFY answer
already parsed by ``smartnsq.protocol.responses``), so they are tested against the captures
without a socket. :mod:`smartnsq.compat.probe` does the HTTP calls. Where the core already
decides (``smartnsq.protocol.lookup``: a ``TopicView``'s ``youzan``, ``Node.youzan`` and its
``-HA.`` mark; ``IdentifyResponse.is_youzan``), the functions here use its verdict rather than
a second implementation: :func:`kind_of_view`, :func:`kind_of_node`, :func:`kind_of_identify`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smartnsq.protocol.lookup import YOUZAN_VERSION_MARK, Node, TopicView
from smartnsq.protocol.numbers import is_int
from smartnsq.protocol.responses import IdentifyResponse

__all__ = [
    "Kind",
    "LookupKinds",
    "classic_nodes",
    "classify_lookup",
    "kind_of_identify",
    "kind_of_info",
    "kind_of_listlookup",
    "kind_of_lookup",
    "kind_of_node",
    "kind_of_peer",
    "kind_of_version",
    "kind_of_view",
    "unwrap",
]

HA_MARK = YOUZAN_VERSION_MARK  # "-HA.": the core's own mark, one definition


class Kind(str, enum.Enum):
    """The two dialects of NSQ."""

    YOUZAN = "youzan"
    CLASSIC = "classic"

    def __str__(self) -> str:
        return self.value


def unwrap(body: Any) -> Any:
    """The data of a youzan ``{"status_code", "status_txt", "data"}`` envelope, else ``body``.

    Youzan servers wrap answers to clients that did not send the v1 ``Accept`` header; classic
    1.x never does. Detection must see through the wrapper or it would call every wrapped
    youzan answer classic (no ``partitions`` at the top level).
    """
    if isinstance(body, Mapping) and "status_code" in body and "data" in body \
            and "status_txt" in body:
        return body["data"]
    return body


def kind_of_version(version: str | None) -> Kind | None:
    """A server version string's kind; ``None`` when there is no version to judge."""
    if not version:
        return None
    return Kind.YOUZAN if HA_MARK in version else Kind.CLASSIC


def kind_of_peer(peer: Mapping[str, Any]) -> Kind | None:
    """A lookup ``producers`` / ``partitions`` entry's kind, from its ``version``."""
    version = peer.get("version")
    return kind_of_version(version if isinstance(version, str) else None)


def kind_of_lookup(body: Any) -> Kind:
    """Which lookupd answered a ``/lookup``: ``partitions`` present means youzan.

    Youzan always sends the key (``{}`` when empty, ``null`` when writes are disabled);
    classic never does. One exception is known: youzan's migrate proxy leaves out an empty
    map, so a partition-less answer that lists ``-HA.`` nodes is still called youzan here.
    """
    data = unwrap(body)
    if not isinstance(data, Mapping):
        raise ValueError(f"a /lookup answer is a JSON object, not {type(data).__name__}")
    if "partitions" in data or "meta" in data:
        return Kind.YOUZAN
    producers = data.get("producers") or ()
    kinds = {kind_of_peer(p) for p in producers if isinstance(p, Mapping)}
    if Kind.YOUZAN in kinds and Kind.CLASSIC not in kinds:
        return Kind.YOUZAN
    return Kind.CLASSIC


def kind_of_info(body: Any) -> Kind | None:
    """Which lookupd (or nsqd) answered ``GET /info``: ``ha_support`` or a ``-HA.`` version."""
    data = unwrap(body)
    if not isinstance(data, Mapping):
        return None
    if "ha_support" in data:
        return Kind.YOUZAN
    version = data.get("version")
    return kind_of_version(version if isinstance(version, str) else None)


def kind_of_listlookup(status: int, body: Any = None) -> Kind | None:
    """Which lookupd answered ``GET /listlookup``: 404 means classic (no such route).

    A youzan lookupd answers 200 (its data is ``null`` without a coordinator, still youzan).
    Any other status (a 5xx, a proxy's 502) proves nothing: ``None``.
    """
    if status == 404:
        return Kind.CLASSIC
    if 200 <= status < 300:
        data = unwrap(body)
        if data is None or (isinstance(data, Mapping)
                            and ("lookupdnodes" in data or "lookupdleader" in data)):
            return Kind.YOUZAN
    return None


def kind_of_identify(answer: IdentifyResponse | Mapping[str, Any] | bytes | None) -> Kind | None:
    """A node's kind from its IDENTIFY answer (the JSON's ``version``).

    ``None`` when the node answered a plain ``OK`` (no feature negotiation: no version told).
    """
    if answer is None or isinstance(answer, bytes | bytearray):
        return None
    if isinstance(answer, IdentifyResponse):
        if not answer.version:
            return None
        return Kind.YOUZAN if answer.is_youzan else Kind.CLASSIC  # the connection's verdict
    version = answer.get("version")
    return kind_of_version(version if isinstance(version, str) else None)


def kind_of_node(node: Node) -> Kind | None:
    """A lookup :class:`~smartnsq.protocol.lookup.Node`'s kind (the core's ``Node.youzan``)."""
    if not node.version:
        return None
    return Kind.YOUZAN if node.youzan else Kind.CLASSIC


def kind_of_view(view: TopicView) -> Kind:
    """Which kind of lookupd answered, as the LookupManager's merged view records it.

    A view merged from lookupds of both kinds (a topic in migration) is youzan: it has
    partitions; its classic nodes are in ``view.unpartitioned`` (see :func:`classic_nodes`).
    """
    return Kind.YOUZAN if view.youzan else Kind.CLASSIC


def classic_nodes(view: TopicView) -> tuple[Node, ...]:
    """The classic nsqd serving a topic in a lookup view (no partition, no ``-HA.``)."""
    if not view.youzan:
        return tuple(n for n in view.producers if not n.youzan)
    return tuple(n for n in view.unpartitioned if not n.youzan)


@dataclass(frozen=True)
class LookupKinds:
    """One ``/lookup`` answer taken apart by kind.

    ``lookupd`` is the kind of the lookupd that answered. ``youzan_nodes`` and
    ``classic_nodes`` are ``"host:tcp_port"`` of the nodes it named, split by their versions:
    a youzan lookupd lists classic nodes registered beside youzan ones (partition ``-11``, in
    ``producers`` only), and a classic lookupd may list youzan nodes (a youzan topic seen by
    a classic lookupd during a migration). ``partitions`` maps each partition id to its
    leader (youzan only).
    """

    lookupd: Kind
    youzan_nodes: tuple[str, ...]
    classic_nodes: tuple[str, ...]
    unknown_nodes: tuple[str, ...]
    partitions: Mapping[int, str]

    @property
    def mixed(self) -> bool:
        """Both kinds of node serve the topic (a topic in migration behind one lookupd)."""
        return bool(self.youzan_nodes) and bool(self.classic_nodes)


def _address(peer: Mapping[str, Any]) -> str | None:
    host = peer.get("broadcast_address")
    port = peer.get("tcp_port")
    if not isinstance(host, str) or not host or not is_int(port):
        return None
    return f"{host}:{port}"


def classify_lookup(body: Any) -> LookupKinds:
    """Take a ``/lookup`` answer apart: the lookupd's kind and each node's (see LookupKinds)."""
    data = unwrap(body)
    kind = kind_of_lookup(data)
    youzan: dict[str, None] = {}
    classic: dict[str, None] = {}
    unknown: dict[str, None] = {}
    partitions: dict[int, str] = {}
    raw_parts = data.get("partitions") or {}
    peers: list[Mapping[str, Any]] = []
    if isinstance(raw_parts, Mapping):
        for pid_text, peer in raw_parts.items():
            if not isinstance(peer, Mapping):
                continue
            address = _address(peer)
            try:
                pid = int(pid_text)
            except (TypeError, ValueError):
                continue
            if address is not None and pid >= 0:
                partitions[pid] = address
            peers.append(peer)
    producers: Sequence[Any] = data.get("producers") or ()
    peers.extend(p for p in producers if isinstance(p, Mapping))
    for peer in peers:
        address = _address(peer)
        if address is None:
            continue
        node_kind = kind_of_peer(peer)
        if node_kind is Kind.YOUZAN:
            youzan[address] = None
        elif node_kind is Kind.CLASSIC:
            classic[address] = None
        else:
            unknown[address] = None
    return LookupKinds(kind, tuple(youzan), tuple(classic),
                       tuple(a for a in unknown if a not in youzan and a not in classic),
                       partitions)
