"""Writing a topic that lives on both kinds of cluster during a migration.

Moving a topic from classic NSQ to youzan NSQ (or back) takes a while: producers are switched
over gradually, consumers read both clusters until the old one is drained. A Producer given
the lookupds of both clusters sees such a topic twice: youzan partitions with their leaders,
and classic nodes without partitions. :class:`MigrationPolicy` says where each publish goes;
:class:`MigrationChooser` applies it, and is the hook the Producer calls (``migration=``).

The policies are youzan's Java client's (its migration selector sends a configured percentage
of publishes to the previous cluster, the rest to the current one, chosen per publish):

* ``MigrationPolicy(prefer="youzan")`` (the default): everything to youzan while it has a
  writable partition, classic only while it has none;
* ``MigrationPolicy(prefer="classic")``: the reverse;
* ``MigrationPolicy(youzan_percent=30)``: about 30 % of publishes to youzan, the rest to
  classic. Unkeyed publishes draw at random; a publish with a sharding key is placed by a
  hash of the key, so every message of a key goes to the same side (and, there, to the same
  partition or node) for as long as the percentage stays the same. Raising the percentage
  only moves keys from classic to youzan, never back.

``topics={"orders": MigrationPolicy(youzan_percent=50)}`` sets a policy per topic.

A keyed publish never changes side because its side has no leader at the moment (that would
interleave a key's messages across clusters): it waits for the leader as any sharded publish
does. An unkeyed publish falls over to the other side when its side has no node right now.
"""

from __future__ import annotations

import logging
import random
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import mmh3

from smartnsq.config import doc
from smartnsq.errors import InvalidArgument
from smartnsq.model.dialect import key_for_hash
from smartnsq.model.routes import TopicRoutes
from smartnsq.model.sharding import ShardingKey
from smartnsq.protocol.numbers import check_number

__all__ = ["MigrationChooser", "MigrationPolicy", "Side", "split_routes"]

log = logging.getLogger("smartnsq.compat")

Side = Literal["youzan", "classic"]
_KEY_SEED = 0x6D696772  # keys' side hash must not correlate with their partition hash (seed 0)


@dataclass(frozen=True)
class MigrationPolicy:
    """Where publishes to a topic present on both kinds of cluster go (module docstring)."""

    prefer: Side = field(default="youzan", metadata=doc(
        "Where publishes to a topic found on both kinds of cluster go while that side has a "
        "writable node (the other side only while it has none); ignored when youzan_percent "
        "is set.", range='"youzan" or "classic"'))
    youzan_percent: float | None = field(default=None, metadata=doc(
        "Share of publishes sent to youzan, the rest to classic: unkeyed ones drawn at "
        "random, keyed ones by a hash of the key (a key stays on one side); None sends all "
        "to the preferred side.", unit="%", range="0..100 or None"))
    topics: Mapping[str, MigrationPolicy] = field(default_factory=dict, metadata=doc(
        "A policy per topic (topic name -> MigrationPolicy), used instead of this one for "
        "that topic."))

    def __post_init__(self) -> None:
        if self.prefer not in ("youzan", "classic"):
            raise InvalidArgument("prefer", "must be 'youzan' or 'classic'", self.prefer)
        pct = self.youzan_percent
        if pct is not None:
            check_number("youzan_percent", pct, 0, high=100, what="number")
        for topic, policy in self.topics.items():
            if not isinstance(policy, MigrationPolicy):
                raise InvalidArgument(f"topics[{topic!r}]", "must be a MigrationPolicy", policy)

    def chooser(self) -> MigrationChooser:
        """A chooser applying this policy (what ``Producer(migration=policy)`` builds)."""
        return MigrationChooser(self)

    def for_topic(self, topic: str) -> MigrationPolicy:
        return self.topics.get(topic, self)

    @property
    def share(self) -> float:
        """The fraction (0..1) of publishes that go to youzan."""
        if self.youzan_percent is not None:
            return self.youzan_percent / 100.0
        return 1.0 if self.prefer == "youzan" else 0.0


def split_routes(routes: TopicRoutes) -> tuple[TopicRoutes, TopicRoutes]:
    """A topic's mixed routes as (youzan only, classic only)."""
    youzan = TopicRoutes(routes.topic, partition_num=routes.partition_num,
                         ordered=routes.ordered, ext=routes.ext, youzan=True,
                         leaders=routes.leaders)
    classic = TopicRoutes(routes.topic, youzan=False, nodes=routes.nodes)
    return youzan, classic


def _on_both(routes: TopicRoutes) -> bool:
    return bool(routes.nodes) and (bool(routes.leaders) or routes.partition_num > 0)


class MigrationChooser:
    """Applies a :class:`MigrationPolicy`; the Producer's ``migration=`` hook.

    The Producer calls :meth:`choose` with a topic's routes before picking a target; routes
    naming both youzan partitions and classic nodes come back as one side's routes, others
    unchanged. ``counts`` tells how many publishes went to each side, per topic.
    """

    def __init__(self, policy: MigrationPolicy | None = None, *,
                 random_source: Callable[[], float] = random.random) -> None:
        self.policy = policy or MigrationPolicy()
        if not isinstance(self.policy, MigrationPolicy):
            raise InvalidArgument("migration", "must be a MigrationPolicy", policy)
        self._random = random_source
        self._splits: weakref.WeakKeyDictionary[TopicRoutes, tuple[TopicRoutes, TopicRoutes]] \
            = weakref.WeakKeyDictionary()
        self.counts: dict[tuple[str, Side], int] = {}

    def side_for(self, topic: str, key: ShardingKey | None = None) -> Side:
        """The side a publish would take, ignoring which side has a leader now."""
        share = self.policy.for_topic(topic).share
        if share >= 1.0:
            return "youzan"
        if share <= 0.0:
            return "classic"
        if key is None:
            draw = self._random()
        else:
            draw = mmh3.hash(key_for_hash(key), _KEY_SEED, signed=False) / 2**32
        return "youzan" if draw < share else "classic"

    def choose(self, routes: TopicRoutes, key: ShardingKey | None = None) -> TopicRoutes:
        """One side's routes for this publish (``routes`` itself when the topic is on one)."""
        if not _on_both(routes):
            return routes
        split = self._splits.get(routes)
        if split is None:
            split = self._splits[routes] = split_routes(routes)
        side = self.side_for(routes.topic, key)
        chosen = split[0] if side == "youzan" else split[1]
        if key is None and not chosen.targets:
            other: Side = "classic" if side == "youzan" else "youzan"
            if split[1 if other == "classic" else 0].targets:
                log.debug("%r: no %s node writable now; this publish goes to %s",
                          routes.topic, side, other)
                side = other
                chosen = split[0] if side == "youzan" else split[1]
        counter = (routes.topic, side)
        self.counts[counter] = self.counts.get(counter, 0) + 1
        return chosen

    def __reduce__(self) -> tuple[object, ...]:
        # shipped to other processes (Spark executors) as its policy: counts stay local
        return (MigrationChooser, (self.policy,))

    def __repr__(self) -> str:
        return f"<MigrationChooser {self.policy}>"
