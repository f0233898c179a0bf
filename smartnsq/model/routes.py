"""Where a topic can be written: the route values every other part of routing passes around.

:class:`TopicRoutes` is one immutable snapshot of a topic (which node leads each partition, the
topic's meta, the partitions held on a leader lookup stopped listing); a :class:`RouteSource`
says where those snapshots come from (:class:`StaticRouteSource` for a fixed list of nsqd,
:class:`~smartnsq.discovery.route_source.LookupRouteSource` for nsqlookupd). Plain values, no I/O:
the pool, the producer's choosers and the compat layer all read the same type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import InvalidArgument

__all__ = [
    "Address",
    "RouteSource",
    "RoutesCallback",
    "StaticRouteSource",
    "Target",
    "TopicRoutes",
    "address_list",
    "describe",
    "parse_address",
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


def parse_address(text: str | tuple[str, int], what: str = "address") -> Address:
    """``"host:port"`` (or an already split pair) as ``(host, port)``."""
    if isinstance(text, tuple):
        host, port = text
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
        parts = ", ".join(f"{p}->{a[0]}:{a[1]}{' (held)' if p in routes.held else ''}"
                          for p, a in sorted(routes.leaders.items()))
        missing = ""
        if routes.partition_num:
            gone = sorted(set(range(routes.partition_num)) - set(routes.leaders))
            if gone:
                missing = f"; no leader for {gone}"
        return f"{parts}{missing}"
    if routes.nodes:
        return "nodes " + ", ".join(f"{h}:{p}" for h, p in routes.nodes)
    if routes.partition_num:
        return f"no leader for any of {routes.partition_num} partitions"
    return "no nodes"
