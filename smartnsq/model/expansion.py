"""Per-key order across a partition expansion: which partitions an ordered consumer holds, and
when it lets them go. Pure decisions, time and positions passed in.

Hash routing moves keys when a topic's partition count grows (a key goes to
``router(key, partition_num)``). A moved key's older messages wait on its old partition while
its newer ones land on a new partition, so an ordered consumer that lags keeps the key's order
only by finishing the old partitions up to the expansion point before it delivers from the
new ones. :class:`ExpansionHold` is that rule:

* :meth:`ExpansionHold.grow` (the partition count went from ``before`` to ``after``, seen
  after the first view) starts a *stage*: the new partitions are held;
* the stage's clock starts when some new partition is seen written to
  (:meth:`ExpansionHold.written`): a producer moves a key only at its own next lookup, and
  writes none of the key's messages to the old partition after it moved it, so the old
  partitions' ends read after the first write to a new one (:meth:`ExpansionHold.end`,
  bytes, the leader's ``/stats`` ``backend_depth``) are past every old message of a key
  whose producer moved it by then: the *expansion point*. Until then the new partitions are
  empty and holding them costs nothing;
* an old partition has reached its point when a message it delivered was answered with
  ``queue_offset + raw_size >= end`` (:meth:`ExpansionHold.progress`), or when its channel
  reported no backlog in a ``/stats`` read sent after its end was recorded
  (:meth:`ExpansionHold.drained`);
* :meth:`ExpansionHold.decide` releases a stage once every old partition reached its point,
  or at the bound (:data:`EXPANSION_HOLD_MAX` after the first write to a new partition was
  seen) whatever is left: an old partition without a leader (its end cannot be read) or one
  that cannot be consumed (a poison message) then no longer blocks its new partitions, and
  the release says order may not hold for the moved keys.

A further growth while a stage is held adds a stage whose old partitions include the held
ones (at their own ends); a partition stays held while any stage that made it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from ..protocol.numbers import check_number

__all__ = ["BY_BOUND", "BY_CONSUMED", "EXPANSION_HOLD_MAX", "ExpansionHold", "Release"]

EXPANSION_HOLD_MAX: Final = 60.0
"""The longest an ordered consumer holds new partitions once they are written to (seconds from
seeing the first write to one): then they deliver whatever the old ones still hold."""

BY_CONSUMED: Final = "consumed"
BY_BOUND: Final = "bound"


@dataclass(frozen=True)
class Release:
    """A stage let go: its new partitions may deliver now.

    ``why``: :data:`BY_CONSUMED` (every old partition reached its point) or :data:`BY_BOUND`
    (the bound passed first: ``late`` names the old partitions that had not, their end
    unknown or not reached). ``waited``: seconds from seeing the growth to the release."""

    new: frozenset[int]
    old: frozenset[int]
    why: str
    waited: float
    late: frozenset[int] = frozenset()


@dataclass
class _Stage:
    old: frozenset[int]
    new: frozenset[int]
    started: float
    ends: dict[int, int] = field(default_factory=dict)  # old partition -> its point
    ends_at: dict[int, float] = field(default_factory=dict)  # ... recorded when
    reached: set[int] = field(default_factory=set)
    written_at: float | None = None  # when a new partition was first seen written to

    def open(self) -> frozenset[int]:
        return self.old - self.reached


class ExpansionHold:
    """The stages of one ordered subscription's topic (see the module docstring)."""

    def __init__(self, bound: float = EXPANSION_HOLD_MAX) -> None:
        self.bound = check_number("bound", bound, low_open=True)
        self._stages: list[_Stage] = []
        self._positions: dict[int, int] = {}  # partition -> furthest answered position

    def grow(self, before: int, after: int, now: float) -> frozenset[int]:
        """The partition count went from ``before`` to ``after`` (``before`` > 0: an earlier
        view's, not the first): hold the new partitions. Returns them (empty when the count
        did not grow)."""
        if before <= 0 or after <= before:
            return frozenset()
        stage = _Stage(frozenset(range(before)), frozenset(range(before, after)), now)
        self._stages.append(stage)
        return stage.new

    @property
    def active(self) -> bool:
        """Some stage is held."""
        return bool(self._stages)

    def held(self, partition: int | None) -> bool:
        """Whether ``partition`` may not deliver now."""
        return partition is not None and any(partition in s.new for s in self._stages)

    def held_partitions(self) -> frozenset[int]:
        return frozenset().union(*(s.new for s in self._stages))

    def unwritten(self) -> frozenset[int]:
        """The new partitions of the stages no write was seen on yet (to watch)."""
        return frozenset().union(*(s.new for s in self._stages if s.written_at is None))

    def wanted_ends(self) -> frozenset[int]:
        """The old partitions whose end is still to be read (of the stages written to)."""
        return frozenset().union(*(s.old - s.ends.keys() for s in self._stages
                                   if s.written_at is not None))

    def open_partitions(self) -> frozenset[int]:
        """The old partitions some stage written to still waits for."""
        return frozenset().union(*(s.open() for s in self._stages
                                   if s.written_at is not None))

    def written(self, partition: int, now: float) -> None:
        """New ``partition`` was seen written to (or cannot be watched) at ``now``: its
        stage's ends may be read from now on, and its bound starts."""
        for stage in self._stages:
            if partition in stage.new and stage.written_at is None:
                stage.written_at = now

    def end(self, partition: int, end: int, now: float) -> None:
        """``partition``'s queue end (bytes), in a read sent at ``now``: the point of every
        stage written to by then that has none for it yet."""
        for stage in self._stages:
            if stage.written_at is None or stage.written_at > now:
                continue
            if partition in stage.old and partition not in stage.ends:
                stage.ends[partition] = end
                stage.ends_at[partition] = now
                if end <= self._positions.get(partition, -1) or end <= 0:
                    stage.reached.add(partition)  # nothing written: no point to wait for

    def progress(self, partition: int, position: int) -> None:
        """A message of ``partition`` was answered, ``position`` = its ``queue_offset +
        raw_size``: the partition is consumed up to there."""
        if position <= self._positions.get(partition, -1):
            return
        self._positions[partition] = position
        for stage in self._stages:
            end = stage.ends.get(partition)
            if end is not None and position >= end:
                stage.reached.add(partition)

    def drained(self, partition: int, asked_at: float) -> None:
        """``partition``'s channel had no backlog (nothing waiting, nothing in flight) in a
        ``/stats`` read sent at ``asked_at``: consumed to its end then, past every point
        recorded before."""
        for stage in self._stages:
            at = stage.ends_at.get(partition)
            if at is not None and at <= asked_at:
                stage.reached.add(partition)

    def decide(self, now: float) -> list[Release]:
        """The stages released at ``now``, in the order they started. A stage written to
        waits for the written stages before it (their new partitions are among its old
        ones), except at its own bound; a stage never written to stays held (its
        partitions are empty) and blocks nothing."""
        out: list[Release] = []
        keep: list[_Stage] = []
        blocked = False
        for stage in self._stages:
            if stage.written_at is None:
                keep.append(stage)
                continue
            waited = now - stage.started
            if not blocked and not stage.open():
                out.append(Release(stage.new, stage.old, BY_CONSUMED, waited))
            elif now - stage.written_at >= self.bound:
                out.append(Release(stage.new, stage.old, BY_BOUND, waited, stage.open()))
            else:
                keep.append(stage)
                blocked = True
        self._stages = keep
        return out

    def next_deadline(self) -> float | None:
        """When the first stage written to reaches its bound (``None``: none)."""
        return min((s.written_at + self.bound for s in self._stages
                    if s.written_at is not None), default=None)
