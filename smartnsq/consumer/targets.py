"""Where a consumer reads from and with which SUB: pure decisions, no I/O.

A *target* is one (nsqd, partition) to subscribe to. :func:`view_targets` derives them from a
lookup view (a youzan partition is read on its leader only; classic nodes get plain SUB),
:func:`static_targets` from ``nsqd=`` addresses. :func:`sub_command` says which SUB a target
gets: ``SUB`` (classic, or youzan with a partition), ``SUB_ORDERED``, or ``SUB_ADVANCED`` for
a start position (the first subscription of each partition only: :class:`Starts` remembers
which got it, since a reconnect must not rewind).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..model.partitions import SubCommand, subscription
from ..model.routes import Address
from ..protocol.commands import StartPosition

__all__ = ["Starts", "Target", "missing_leaders", "static_targets", "sub_command",
           "view_targets"]

log = logging.getLogger("smartnsq.consumer")


@dataclass(frozen=True)
class Target:
    """One place to read from: a node, a partition on it (``None``: no partition token), and
    what is known of the topic there (``None``: unknown, learnt from the server)."""

    address: Address
    partition: int | None
    youzan: bool | None = None
    ordered: bool | None = None
    ext: bool | None = None
    # SUB_ADVANCED with a start position only reaches the node's default partition (the
    # lowest it leads); for another one the start is set over HTTP (``http``) after SUB
    inline_start: bool = True
    http: str | None = None
    # the topic's partition count in lookup's meta (0: unknown): an ordered consumer holds
    # the new partitions when it grows (consumer.expansion)
    partition_num: int = 0

    @property
    def key(self) -> tuple[Address, int | None]:
        return self.address, self.partition


class Starts:
    """Which targets already got the start position. With ``nsqd=`` addresses each (node,
    partition) target (nodes given without ``partitions=`` all use partition None); with
    lookupd each partition, wherever its leader moves."""

    def __init__(self, start: StartPosition | None, *, by_node: bool) -> None:
        self.start = start
        self._by_node = by_node
        self._done: set[object] = set()

    def _key(self, target: Target) -> object:
        return target.key if self._by_node else target.partition

    def pending(self, target: Target) -> bool:
        return self.start is not None and self._key(target) not in self._done

    def applied(self, target: Target) -> None:
        if self.start is not None:
            self._done.add(self._key(target))


def sub_command(topic: str, channel: str, target: Target, *, youzan: bool, ordered: bool,
               start: StartPosition | None, start_pending: bool, name: str = "") -> SubCommand:
    """Which SUB ``target`` gets (``start_pending``: it has not had the start position yet);
    the rule itself is :func:`smartnsq.model.partitions.subscription`, shared with Spark's
    reader."""
    pending = start if start_pending else None
    if youzan and ordered and pending is not None:
        log.warning("%s: ordered topics refuse SUB_ADVANCED; start=%s ignored, "
                    "subscribing with SUB_ORDERED", name, pending.token().decode())
    # keep the detail block (queue offsets) on resubscriptions too, without rewinding
    return subscription(topic, channel, target.partition, youzan=youzan, ordered=ordered,
                        detail=start is not None, start=pending,
                        inline_start=target.inline_start or target.http is None)


def static_targets(nsqd: Iterable[Address], partitions: frozenset[int] | None) -> list[Target]:
    """``nsqd=`` addresses: each node, for each of ``partitions`` (or its default one)."""
    parts: list[int | None] = [*sorted(partitions)] if partitions is not None else [None]
    return [Target(a, p) for a in nsqd for p in parts]


def view_targets(view: Any, partitions: frozenset[int] | None) -> list[Target]:
    """A lookup view's targets: each wanted youzan partition on its leader (leaderless ones
    skipped: normal for a while during a failover), plus the topic's classic nodes."""
    targets: list[Target] = []
    meta = view.meta
    ordered = bool(meta.ordered) if meta is not None else None
    ext = bool(meta.extend_support) if meta is not None else None
    seen: set[Address] = set()
    count = view.partition_num or 0
    if view.youzan:
        lowest: dict[Address, int] = {}  # each node's default partition: the lowest it leads
        for pid, part in view.partitions.items():
            if part.leader is not None:
                address = part.leader.address
                lowest[address] = min(pid, lowest.get(address, pid))
        for pid, part in sorted(view.partitions.items()):
            if partitions is not None and pid not in partitions:
                continue
            leader = part.leader
            if leader is None:
                continue
            targets.append(Target(leader.address, pid, True, ordered, ext,
                                  inline_start=lowest[leader.address] == pid,
                                  http=leader.http_address, partition_num=count))
            seen.add(leader.address)
    for node in view.producers:
        # classic nodes (and a classic topic's only information): plain SUB
        if view.youzan and getattr(node, "youzan", True):
            continue
        if node.address in seen or (partitions is not None and view.youzan):
            continue
        targets.append(Target(node.address, None, False, False, False))
    return targets


def missing_leaders(view: Any, partitions: frozenset[int] | None) -> list[int]:
    """The wanted partitions of a youzan view that have no leader now."""
    if not view.youzan:
        return []
    wanted = (partitions if partitions is not None
              else range(view.partition_num) if view.partition_num else view.partitions)
    return [p for p in wanted if p not in view.partitions or view.partitions[p].leader is None]
