"""Which partitions a stream can read now: the stream's side of a leader loss.

Two things keep one partition's outage from holding the others (``docs/spark.md``, "leader
loss"):

* :class:`ReadGate`: youzan's nsqd refuses consumption of a partition ("Consume is disabled
  currently", see ``conditions``) for minutes after a node's death or leave, on the new
  leader and on leaders whose replica set changes, although lookup and ``/stats`` name the
  leader. A range planned there holds its whole micro-batch until then. So while a topic is
  *unsettled* (its first ``leaderTimeout`` seconds in this query, and as long again after any
  of its partitions was without a usable leader or changed leader) each leader is asked
  first, with the first steps of a range read on a temporary channel; a leader that refuses
  is left out of the batch, its offset kept, like a partition without a leader.
* unresolved starting offsets: a stream started during an outage (no checkpoint yet) does not
  wait for the partition: it keeps Kafka's ``-2`` (earliest) or ``-1`` (latest), or the
  explicit offset, until a planning sees the partition led again, which resolves it to a
  queue offset (that batch reads nothing there; the next ones do).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ..errors import NSQError
from .cluster import ClusterClient, LeaderInfo, temporary_channel
from .conditions import condition_of, is_transient
from .offsets import KAFKA_EARLIEST, KAFKA_LATEST, OFFSET_EARLIEST, OFFSET_LATEST, Offsets
from .offsets import check_offsets as _check_offsets
from .options import SourceOptions
from .positions import Bounds

__all__ = ["ReadGate", "check_consumable", "resolved", "starting_offsets", "stream_offsets",
           "unresolved", "without"]

log = logging.getLogger("smartnsq.spark")


def check_consumable(client: ClusterClient, topic: str, partition: int, leader: LeaderInfo,
                     offset: int, prefix: str) -> None:
    """Raise what the leader answers to a range read's first steps: a temporary channel
    created and moved to ``offset`` (then deleted)."""
    name = temporary_channel(prefix)
    client.create_channel(topic, partition, leader, name)
    try:
        client.set_offset(topic, partition, leader, name, offset)
    finally:
        try:
            client.delete_channel(topic, partition, leader, name)
        except NSQError as exc:
            log.warning("could not delete the temporary channel %s of %s/%d: %s", name,
                        topic, partition, exc)


class ReadGate:
    """The planner's record of each topic's unsettled time, and its question to a leader
    before a range is planned on it (see the module docstring)."""

    def __init__(self, client: ClusterClient, options: SourceOptions) -> None:
        self.client = client
        self.options = options
        self.unsettled: dict[str, float] = {}  # topic -> until when (monotonic)
        self.leaders: dict[tuple[str, int], LeaderInfo] = {}  # the last seen
        self.moved: set[tuple[str, int]] = set()  # partitions whose leader changed

    def unsettle(self, topic: str) -> None:
        self.unsettled[topic] = time.monotonic() + self.options.leader_timeout

    def started(self, topic: str) -> None:
        """A topic's first planning in this query: its leaders are asked for a while."""
        if topic not in self.unsettled:
            self.unsettle(topic)

    def seen(self, topic: str, partition: int, leader: LeaderInfo) -> None:
        """The partition's leader in lookup now (a change unsettles the topic)."""
        before = self.leaders.get((topic, partition))
        if before is not None and before != leader:
            self.moved.add((topic, partition))
            self.unsettle(topic)
        self.leaders[(topic, partition)] = leader

    def consumable(self, topic: str, partition: int, offset: int) -> str | None:
        """``None`` when the partition's leader takes a range read at ``offset`` now (or the
        topic is settled: nobody is asked), else the condition that keeps it out."""
        if time.monotonic() >= self.unsettled.get(topic, 0.0):
            return None
        leader = self.leaders.get((topic, partition))
        if leader is None:
            return "no leader in lookup"
        try:
            check_consumable(self.client, topic, partition, leader, offset,
                             self.options.channel_prefix)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.unsettle(topic)
            return condition_of(exc, "its new leader" if (topic, partition) in self.moved
                                else "its leader")
        return None


def stream_offsets(value: Any, name: str) -> Offsets:
    """A stream's offsets as Spark hands them back: queue offsets, or Kafka's ``-2``/``-1``
    for a partition that had no usable leader when the stream started (not resolved yet)."""
    return _check_offsets(value, name, kafka=(KAFKA_EARLIEST, KAFKA_LATEST))


def resolved(offsets: Offsets, latest: Offsets) -> Offsets:
    """``offsets`` with the unresolved ones (negative) at ``latest``'s (nothing waits)."""
    return {t: {p: (latest.get(t, {}).get(p, 0) if o < 0 else o) for p, o in parts.items()}
            for t, parts in offsets.items()}


def unresolved(spec: Any, topic: str, partition: int) -> int | None:
    """The starting offset a partition without a usable leader keeps until it is back:
    Kafka's ``-2``/``-1`` for ``earliest``/``latest``, the explicit offset of JSON offsets
    (``-2`` for one they leave out); ``None`` for a time, which needs a search on the leader."""
    if spec == OFFSET_EARLIEST:
        return KAFKA_EARLIEST
    if spec == OFFSET_LATEST:
        return KAFKA_LATEST
    if isinstance(spec, dict):
        return int(spec.get(topic, {}).get(str(partition), KAFKA_EARLIEST))
    return None


def without(spec: Any, pending: dict[tuple[str, int], str]) -> Any:
    """Explicit offsets without the partitions that ``pending`` keeps for later."""
    if not isinstance(spec, dict) or not pending:
        return spec
    return {t: {p: o for p, o in parts.items() if (t, int(p)) not in pending}
            for t, parts in spec.items()}


class Planner(Protocol):
    """What :func:`starting_offsets` asks of the source's planner."""

    down: dict[tuple[str, int], str]

    def refresh(self) -> Bounds: ...

    def refresh_all(self) -> Bounds: ...

    def resolve(self, spec: Any, bounds: Bounds, name: str) -> Offsets: ...


def starting_offsets(planner: Planner, spec: Any) -> Offsets:
    """A stream's starting offsets, without waiting for partitions that have no usable
    leader now (a query started, or started again without a checkpoint, during a leader
    loss): those keep :func:`unresolved`'s offset until a planning sees them led again. Only
    a time-based start waits for every leader (``refresh_all``): its search needs them."""
    try:
        bounds: Bounds | None = planner.refresh()
    except Exception:
        bounds = None  # refresh_all() waits for it, or raises what cannot pass
    pending = dict(planner.down) if bounds is not None else {}
    if bounds is None or any(unresolved(spec, t, p) is None for t, p in pending):
        bounds, pending = planner.refresh_all(), {}
    offsets = planner.resolve(without(spec, pending), bounds, "startingOffsets")
    for (topic, p), condition in sorted(pending.items()):
        offset = unresolved(spec, topic, p)
        assert offset is not None
        offsets.setdefault(topic, {})[str(p)] = offset
        log.warning("%s/%d: %s; the stream starts without it (its starting offset, %s, is "
                    "taken once it has a usable leader)", topic, p, condition,
                    {KAFKA_EARLIEST: "earliest", KAFKA_LATEST: "latest"}.get(offset, offset))
    return offsets
