"""The core's side of the classic boundary: the hooks it asks, and their default answers.

The core never imports ``smartnsq.compat``. It asks an object with the :class:`ClassicDialect`
hooks what a youzan feature becomes on a classic nsqd, and a :class:`RouteChooser` which
cluster a topic found on both kinds is written to. :class:`ClassicPolicy` is the default
dialect (``smartnsq.compat`` re-exports it as its public name); compat's ``MigrationPolicy``
is a :class:`ChooserFactory`.

What youzan-only features become on a classic nsqd: one policy object, asked by the clients.

Classic nsqd has no partitions, no traced publish, no ext headers, no ordered or positioned
subscription. A program written for youzan NSQ still runs against classic nodes (during a
migration, a topic may live on both); :class:`ClassicPolicy` says what happens to each feature
there. The defaults keep every guarantee honest: a feature classic cannot give either degrades
to something documented as weaker (sharding keys, trace ids) or fails with a clear
``InvalidArgument`` before anything is sent (headers, ordering, start positions), unless the
user opts into the weaker behaviour.

The clients call these hooks (the whole interface between the core and this module):

* the Producer: :meth:`ClassicPolicy.node_for_key` to place a sharding key on a topic
  without partitions, :meth:`ClassicPolicy.classic_headers` before publishing headers to a
  classic node (raises, or returns and the headers are dropped);
* the Consumer: :meth:`ClassicPolicy.classic_subscription` before subscribing to a classic
  node (raises, or returns the RDY cap to use).

* sharding key: the same key always goes to the same node of the topic (rendezvous hash over
  the topic's classic nodes); weaker than partition order;
* trace id: nothing traced is sent (plain PUB); the client-side trace line is still logged;
* headers: ``InvalidArgument``; with ``drop_headers=True`` sent without them;
* ordered consumption: ``InvalidArgument``; with ``best_effort_order=True`` RDY 1 per node;
* start position (SUB_ADVANCED): ``InvalidArgument`` always.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import mmh3

from smartnsq.config import doc
from smartnsq.errors import InvalidArgument
from smartnsq.model.sharding import ShardingKey, key_bytes

if TYPE_CHECKING:
    from smartnsq.model.routes import TopicRoutes

__all__ = [
    "DEFAULT_POLICY",
    "ChooserFactory",
    "ClassicDialect",
    "ClassicPolicy",
    "ClassicSubscription",
    "RouteChooser",
    "key_for_hash",
    "rendezvous",
]

log = logging.getLogger("smartnsq.compat")

Address = tuple[str, int]


class ClassicDialect(Protocol):
    """The three questions the clients ask before using a youzan feature on a classic nsqd."""

    def node_for_key(self, key: ShardingKey, nodes: Sequence[Address], topic: str = "") \
            -> Address | None:
        """The classic node a sharding key goes to (``None``: the topic has no node now)."""
        ...

    def classic_headers(self, topic: str, node: str = "") -> None:
        """Headers are about to go to a classic node: raise, or return to drop them."""
        ...

    def classic_subscription(self, topic: str, *, ordered: bool | None = None,
                             start: Any = None, node: str = "") -> ClassicSubscription:
        """A subscription to a classic node is about to start: raise, or say how."""
        ...


class RouteChooser(Protocol):
    """Picks the side (youzan or classic routes) a topic living on both kinds is written to."""

    def choose(self, routes: TopicRoutes, sharding_key: ShardingKey | None) -> TopicRoutes:
        ...


@runtime_checkable
class ChooserFactory(Protocol):
    """A migration policy: makes the :class:`RouteChooser` one Producer uses."""

    def chooser(self) -> RouteChooser:
        ...


def _node_key(node: Address) -> bytes:
    return f"{node[0]}:{node[1]}".encode()


def rendezvous(key: bytes, nodes: Sequence[Address]) -> Address:
    """The node with the highest murmur3(node, seeded by key) score (rendezvous hashing).

    Unlike ``hash % len(nodes)``, a node joining or leaving moves only the keys it wins or
    held (about 1/n of them), and the answer does not depend on the order lookupd listed the
    nodes in. Every producer using this function agrees, whatever its node list order.
    """
    if not nodes:
        raise ValueError("rendezvous hashing needs at least one node")
    seed = mmh3.hash(key, 0, signed=False)
    best = nodes[0]
    best_score = -1
    for node in nodes:
        score = mmh3.hash(_node_key(node), seed, signed=False)
        if score > best_score or (score == best_score and node < best):
            best, best_score = node, score
    return best


@dataclass(frozen=True)
class ClassicSubscription:
    """How to subscribe to a classic node: plain SUB, with ``rdy_cap`` when not ``None``."""

    rdy_cap: int | None = None
    best_effort_order: bool = False


@dataclass(frozen=True)
class ClassicPolicy:
    """What youzan features become on classic nodes (see the module docstring's table).

    ``drop_headers``: publish messages with ext headers to classic nodes without the headers
    (logged once per topic) instead of raising. ``best_effort_order``: accept ordered
    consumption of a classic topic as RDY 1 per node (each node delivers one message at a
    time, roughly in publish order; no order across nodes, and a requeue reorders) instead of
    raising. ``shard_over_nodes``: place sharding keys on a classic topic's nodes by
    rendezvous hash (``False``: raise ``InvalidArgument`` as youzan's own clients do).
    """

    drop_headers: bool = field(default=False, metadata=doc(
        "Publish messages with ext headers to a classic nsqd (which has none) without the "
        "headers, logged once per topic; False raises InvalidArgument before sending."))
    best_effort_order: bool = field(default=False, metadata=doc(
        "Accept ordered consumption of a topic on classic nodes as RDY 1 per node (roughly "
        "publish order per node, none across nodes, a requeue reorders); False raises "
        "InvalidArgument."))
    shard_over_nodes: bool = field(default=True, metadata=doc(
        "Place sharding keys on a classic topic's nodes, one node per key (rendezvous hash "
        "over the topic's nodes); False raises InvalidArgument as youzan's own clients do."))
    _warned: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("drop_headers", "best_effort_order", "shard_over_nodes"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(name, "must be a bool", getattr(self, name))

    # -- producer hooks -----------------------------------------------------------------------

    def node_for_key(self, key: ShardingKey, nodes: Sequence[Address], topic: str = "") \
            -> Address | None:
        """The classic node a sharding key goes to (``None``: the topic has no node now)."""
        if not self.shard_over_nodes:
            raise InvalidArgument("sharding_key", f"topic {topic!r} is on classic nodes, which "
                                  "have no partitions (ClassicPolicy(shard_over_nodes=True) "
                                  "places keys on nodes instead)", key)
        if not nodes:
            return None
        return rendezvous(key_for_hash(key), nodes)

    def classic_headers(self, topic: str, node: str = "") -> None:
        """Headers are about to go to a classic node: raise, or allow dropping them."""
        where = f" ({node})" if node else ""
        if not self.drop_headers:
            raise InvalidArgument("headers", f"classic nsqd{where} has no ext headers "
                                  f"(PUB_EXT); topic {topic!r} is on classic nodes. "
                                  "ClassicPolicy(drop_headers=True) sends such messages "
                                  "without their headers", "<headers>")
        if topic not in self._warned and len(self._warned) < 10_000:
            self._warned.add(topic)
            log.warning("topic %r is on classic nsqd%s: ext headers are dropped "
                        "(ClassicPolicy.drop_headers)", topic, where)

    # -- consumer hooks -----------------------------------------------------------------------

    def classic_subscription(self, topic: str, *, ordered: bool | None = None,
                             start: Any = None, node: str = "") -> ClassicSubscription:
        """A subscription to a classic node is about to start: raise, or say how."""
        where = f" ({node})" if node else ""
        if start is not None:
            raise InvalidArgument("start", f"classic nsqd{where} has no SUB_ADVANCED: a "
                                  f"subscription to {topic!r} cannot start at a position "
                                  "there", start)
        if ordered:
            if not self.best_effort_order:
                raise InvalidArgument("ordered", f"classic nsqd{where} has no ordered "
                                      f"consumption (SUB_ORDERED) for {topic!r}. "
                                      "ClassicPolicy(best_effort_order=True) accepts RDY 1 per "
                                      "node, with no order across nodes", ordered)
            return ClassicSubscription(rdy_cap=1, best_effort_order=True)
        return ClassicSubscription()


def key_for_hash(key: ShardingKey) -> bytes:
    """A sharding key's bytes for hashing (a key of a user-defined scheme: its repr)."""
    try:
        return key_bytes(key)
    except InvalidArgument:
        # a user-defined sharding scheme may accept other keys: their text is stable enough
        return repr(key).encode()


DEFAULT_POLICY = ClassicPolicy()
