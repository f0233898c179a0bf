"""Where a topic can be written: the route values every other part of routing passes around.

:class:`TopicRoutes` is one immutable snapshot of a topic (which node leads each partition, the
topic's meta, the partitions held on a leader lookup stopped listing); a :class:`RouteSource`
says where those snapshots come from (:class:`StaticRouteSource` for a fixed list of nsqd,
:class:`~smartnsq.discovery.route_source.LookupRouteSource` for nsqlookupd). Plain values, no I/O:
the pool, the producer's choosers and the compat layer all read the same type.

An :data:`Address` is ``(host, port)``, or ``(path, 0)`` for an nsqd listening on a unix
socket (classic nsqd 1.3's ``--tcp-address=/path``): the pair's shape stays the same so that
every part keyed by node address (the pool, routes, stats) takes a socket as it takes a
host, and port 0, which no TCP listener has, marks it. Write it ``/abs/path`` (nsqd's and
go-nsq's spelling) or ``unix:PATH``; :func:`address_text` gives it back as ``unix:PATH``.
``@name`` is a Linux abstract socket, as Go (and so nsqd) reads that spelling.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ..errors import InvalidArgument

__all__ = [
    "UNIX_PATH_MAX",
    "UNIX_PORT",
    "Address",
    "RouteSource",
    "RoutesCallback",
    "StaticRouteSource",
    "Target",
    "TopicRoutes",
    "address_list",
    "address_text",
    "describe",
    "is_unix",
    "parse_address",
    "sun_path",
]

Address = tuple[str, int]
Target = tuple["int | None", Address]  # (partition or None for "no partition token", node)


def address_list(value: object, what: str) -> list[Any]:
    """A client's ``lookupd=``/``nsqd=`` argument as a list: one address string or an
    iterable of them; anything else (a number, bytes, a mapping) is an ``InvalidArgument``
    naming ``what``, not a ``TypeError`` from deep inside."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable) or isinstance(value, bytes | bytearray | Mapping):
        raise InvalidArgument(what, "must be an address or a list of addresses", value)
    return list(value)


UNIX_PORT: Final = 0
"""The port of a unix socket :data:`Address` (``(path, 0)``)."""

UNIX_PATH_MAX: Final = (104 if sys.platform == "darwin" or "bsd" in sys.platform else 108) - 1
"""The longest socket path, in bytes: ``sun_path`` less its terminating NUL. A longer one
would fail in the kernel at every connect, so it is refused where it is written."""

_UNIX_PREFIX: Final = "unix:"


def is_unix(address: Address) -> bool:
    """Whether ``address`` is an nsqd's unix socket rather than a host and port."""
    return address[1] == UNIX_PORT


def sun_path(address: Address) -> str:
    """The path to connect a socket :data:`Address` to: ``@name`` becomes the abstract
    ``\\0name`` (Go's spelling, so the name nsqd was started with is the one given here)."""
    path = address[0]
    return "\0" + path[1:] if path.startswith("@") else path


def address_text(address: Address) -> str:
    """``host:port``, or ``unix:PATH`` for a socket: what messages name a node by, and a text
    :func:`parse_address` reads back."""
    host, port = address
    return f"{_UNIX_PREFIX}{host}" if port == UNIX_PORT else f"{host}:{port}"


def _socket_path(path: str, what: str, text: object) -> Address:
    if not path:
        raise InvalidArgument(what, "needs a socket path ('unix:PATH')", text)
    if "\0" in path:
        raise InvalidArgument(what, "a socket path cannot hold a NUL byte", text)
    if path.startswith("@") and not sys.platform.startswith("linux"):
        raise InvalidArgument(what, "abstract sockets (@name) are Linux's", text)
    size = len(os.fsencode(path))
    if size > UNIX_PATH_MAX:
        raise InvalidArgument(what, f"a socket path is at most {UNIX_PATH_MAX} bytes "
                              f"(sun_path), this one {size}", text)
    return path, UNIX_PORT


def parse_address(text: str | tuple[str, int], what: str = "address") -> Address:
    """``"host:port"``, a socket path (``"/run/nsqd.sock"``, ``"unix:nsqd.sock"``, an
    abstract ``"@name"``) or an already split pair as an :data:`Address`. A path is checked
    here (``sun_path``'s length, no NUL) so a bad one fails where it is written, not at every
    connect."""
    if isinstance(text, tuple):
        host, port = text
        if port == UNIX_PORT and isinstance(host, str):
            return _socket_path(host, what, text)
    elif isinstance(text, str) and text.startswith(_UNIX_PREFIX):
        return _socket_path(text[len(_UNIX_PREFIX):], what, text)
    elif isinstance(text, str) and text.startswith(("/", "@")):
        return _socket_path(text, what, text)
    else:
        if not isinstance(text, str) or ":" not in text:
            raise InvalidArgument(what, "must be 'host:port'", text)
        host, _, port_text = text.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text)
        except ValueError:
            raise InvalidArgument(what, "port must be a number", text) from None
    if not host or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidArgument(what, "must be 'host:port' with a port in 1..65535", text)
    return host, port


@dataclass(frozen=True, eq=False)
class TopicRoutes:
    """Where a topic can be written right now; an immutable snapshot.

    ``partition_num`` is the topic's partition count from lookup meta (0 when unknown: classic
    topics, standalone nodes). ``leaders`` maps each partition that has a writable leader now to
    that leader; a partition missing from it is normal for a while during a failover.
    ``nodes`` are nodes written without a partition token (classic nsqd, or nsqd given
    directly). ``youzan`` is true when the topic is known to live on youzan nodes (partitions or
    meta seen), false when known classic, ``None`` when only the connection will tell.
    ``held``: partitions of ``leaders`` that lookup no longer lists but whose leader is still
    connected (see the module docstring): pinned publishes go there, round-robin does not.
    """

    topic: str
    partition_num: int = 0
    ordered: bool = False
    ext: bool = False
    youzan: bool | None = None
    leaders: Mapping[int, Address] = field(default_factory=dict)
    nodes: tuple[Address, ...] = ()
    held: frozenset[int] = frozenset()
    targets: tuple[Target, ...] = field(init=False)

    def __post_init__(self) -> None:
        # unsharded round-robin order: partitions that have a leader, else the plain nodes
        if self.leaders:
            targets: tuple[Target, ...] = tuple((p, self.leaders[p]) for p in sorted(self.leaders)
                                                if p not in self.held)
        else:
            targets = tuple((None, a) for a in self.nodes)
        object.__setattr__(self, "targets", targets)

    @property
    def partitioned(self) -> bool:
        return self.partition_num > 0 or bool(self.leaders)

    def addresses(self) -> set[Address]:
        return {a for _, a in self.targets} | set(self.leaders.values())

    def same_routes(self, other: TopicRoutes | None) -> bool:
        return (other is not None and self.targets == other.targets
                and self.leaders == other.leaders and self.held == other.held
                and self.partition_num == other.partition_num
                and self.ordered == other.ordered and self.ext == other.ext
                and self.youzan == other.youzan)


RoutesCallback = Callable[[TopicRoutes], None]


class RouteSource(Protocol):
    """Where routes come from: the lookup manager, or a fixed list of nodes."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def routes(self, topic: str) -> TopicRoutes:
        """The topic's routes, looked up now if unknown (raises ``TopicNotFound`` etc.)."""
        ...

    def refresh(self, topic: str, *, now: bool = False) -> None:
        """Ask for fresh routes soon (coalesced; the answer arrives through ``subscribe``);
        ``now``: a round at once, past the source's spacing of rounds that find nothing new.
        (Optional: a source whose ``refresh`` takes no ``now`` gets spaced refreshes only.)"""
        ...

    def subscribe(self, callback: RoutesCallback) -> None:
        """Call ``callback(routes)`` whenever a topic's routes change."""
        ...


class StaticRouteSource:
    """Every topic is on every one of a fixed list of nsqd (``Producer(nsqd=[...])``).

    No partitions are named: each publish goes to the node's default partition, so this is for
    classic nodes and standalone youzan nodes.
    """

    def __init__(self, addresses: Iterable[str | Address]) -> None:
        self._nodes = tuple(dict.fromkeys(parse_address(a, "nsqd")
                                          for a in address_list(addresses, "nsqd")))
        if not self._nodes:
            raise InvalidArgument("nsqd", "needs at least one address", list(addresses))

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def routes(self, topic: str) -> TopicRoutes:
        return TopicRoutes(topic, nodes=self._nodes)

    def refresh(self, topic: str, *, now: bool = False) -> None:
        return None

    def subscribe(self, callback: RoutesCallback) -> None:
        return None


def describe(routes: TopicRoutes) -> str:
    """One line for the log: each partition's leader (and which are held), or the nodes."""
    if routes.leaders:
        parts = ", ".join(f"{p}->{address_text(a)}{' (held)' if p in routes.held else ''}"
                          for p, a in sorted(routes.leaders.items()))
        missing = ""
        if routes.partition_num:
            gone = sorted(set(range(routes.partition_num)) - set(routes.leaders))
            if gone:
                missing = f"; no leader for {gone}"
        return f"{parts}{missing}"
    if routes.nodes:
        return "nodes " + ", ".join(address_text(a) for a in routes.nodes)
    if routes.partition_num:
        return f"no leader for any of {routes.partition_num} partitions"
    return "no nodes"
