"""Where one attempt of a publish goes: plain functions of the topic's routes.

The selection rules are docs/protocol.md §6.2's:

* ``sharding_key``: ``router(key, partition_num)``. The key always goes to that partition:
  when it has no leader right now (normal for tens of seconds during a failover) the target
  has no address and the caller waits for one, never writing to another partition.
* ``partition``: that partition, same rules.
* neither: round-robin over the partitions that have a leader now (or the plain nodes of a
  classic topic). Ordered topics refuse this: their order only exists per partition.

A sharding key on a topic without partitions (classic nodes) is placed on a node by the
classic dialect. Nothing here does I/O or keeps state besides the round-robin counters the
caller passes in (constructing a route source opens nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import one_source
from ..discovery.route_source import LookupRouteSource
from ..errors import InvalidArgument
from ..model.dialect import ClassicDialect, RouteChooser
from ..model.partitions import partition_for
from ..model.routes import Address, RouteSource, StaticRouteSource, TopicRoutes
from ..model.sharding import Router, ShardingKey

__all__ = ["check_features", "choose_side", "choose_target", "route_source"]


def route_source(lookupd: Sequence[str] | str | None, nsqd: Sequence[str] | str | None,
                 source: RouteSource | None, lookup: Any,
                 lookup_options: Mapping[str, Any] | None) -> RouteSource:
    """Where a Producer's routes come from: exactly one of lookupd addresses, fixed nsqd
    addresses, a lookup manager or a route source."""
    one_source("Producer", lookupd=lookupd, nsqd=nsqd, lookup=lookup, source=source)
    if source is not None:
        return source
    if nsqd is not None:
        return StaticRouteSource([nsqd] if isinstance(nsqd, str) else nsqd)
    return LookupRouteSource([lookupd] if isinstance(lookupd, str) else lookupd,
                             lookup=lookup, options=dict(lookup_options or {}))


def choose_side(routes: TopicRoutes, sharding_key: ShardingKey | None,
                migration: RouteChooser | None) -> TopicRoutes:
    """The routes to write to: a topic on both a youzan and a classic cluster goes where the
    migration chooser says; any other topic's routes are returned as they are."""
    if migration is not None and routes.nodes and routes.partitioned:
        return migration.choose(routes, sharding_key)
    return routes


def choose_target(routes: TopicRoutes, sharding_key: ShardingKey | None,
                  partition: int | None, router: Router, classic: ClassicDialect,
                  rr: dict[str, int]) -> tuple[int | None, Address | None]:
    """(partition or None, leader address or None) for one attempt.

    ``partition`` wins over ``sharding_key``: a sharded message being retried is pinned to
    the partition its key chose first. ``rr`` holds the round-robin position per topic
    (advanced for unpinned publishes only).
    Raises ``InvalidArgument`` for what the routes say is wrong with the call.
    """
    # which partition: the rule the Spark sink and `smartnsq pub` share (model.partitions)
    target = partition_for(routes, router, partition=partition, sharding_key=sharding_key)
    if target is not None:
        return target, routes.leaders.get(target)
    if sharding_key is not None:  # classic (or partition-less) nodes: the same key, same node
        return None, classic.node_for_key(sharding_key, routes.nodes, routes.topic)
    targets = routes.targets
    if not targets:
        return None, None
    topic = routes.topic
    index = rr.get(topic, 0)
    rr[topic] = index + 1
    return targets[index % len(targets)]


def check_features(routes: TopicRoutes, has_headers: bool, delay_ms: int | None,
                   classic: ClassicDialect) -> None:
    """What the routes already tell is wrong with the call, before connecting anywhere.

    (Trace ids on classic nodes are fine: sent plain, logged client-side.)
    """
    if routes.youzan:
        if delay_ms is not None:
            raise InvalidArgument("delay", f"youzan nsqd has no deferred publish (DPUB); "
                                  f"topic {routes.topic!r} is on youzan nodes", delay_ms)
        if has_headers and not routes.ext and routes.partition_num:
            raise InvalidArgument("headers", f"topic {routes.topic!r} is not an ext topic "
                                  "(lookup meta extend_support is false)", "<headers>")
    elif routes.youzan is False and has_headers:
        classic.classic_headers(routes.topic)
