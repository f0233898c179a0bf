"""The rules of a youzan topic's partitions, written once: pure decisions, no I/O.

Everything that writes to or reads from partitions asks these functions instead of restating
them, so a fix to a rule reaches every client of it at once:

* which partition a publish goes to (:func:`partition_for`): the Producer's routing
  (``producer.routing``), the Spark sink's row grouping and ``smartnsq pub``'s line grouping;
* which SUB line reads a partition (:func:`subscription`), how many messages it may have in
  flight (:func:`rdy_ceiling`) and whether its FIN is written at once (:func:`fin_at_once`):
  the Consumer (``consumer.targets``, ``consumer.flow``, ``consumer.link``) and the Spark range
  reader (``spark.cluster``).

The reasons are docs/protocol.md's: an ordered channel has one message in flight and sends the
next only once the previous one is answered (§10.1), SUB_ORDERED names its partition, the
detail block (queue offset, raw size) comes only with SUB_ORDERED or SUB_ADVANCED (§3.5), and a
key's order exists only within the partition its hash names (§6.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from ..errors import InvalidArgument
from ..protocol import commands
from ..protocol.commands import StartPosition
from .sharding import Router, ShardingKey

__all__ = ["DEFAULT_MAX_RDY", "NEVER_WRITTEN", "SubCommand", "TopicShape", "fin_at_once",
           "partition_for", "rdy_ceiling", "subscription"]

DEFAULT_MAX_RDY = 2500
"""nsqd's ``max_rdy_count`` when its IDENTIFY answer does not give one."""


class TopicShape(Protocol):
    """What the partition choice needs to know of a topic (``TopicRoutes`` has it)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition_num(self) -> int:
        """The partition count from lookup meta; 0 when unknown (classic, standalone)."""
        ...

    @property
    def partitioned(self) -> bool:
        """Whether the topic is written with a partition token (youzan partitions)."""
        ...

    @property
    def ordered(self) -> bool: ...


NEVER_WRITTEN: Final = "commit log end of file"
"""What youzan nsqd answers a start position (SUB_ADVANCED's, E_INVALID; setoffset's, HTTP 500)
on a partition no message was ever written to: it has no commit log to search yet. Such a
partition has nothing to skip, so the position is moot and reading starts where it is."""


def partition_for(shape: TopicShape, router: Router, *, partition: int | None = None,
                  sharding_key: ShardingKey | None = None) -> int | None:
    """The partition one publish must go to; ``None`` when any will do (round-robin) or when
    a topic without partitions places the key on a node (the classic dialect decides that).

    ``partition`` wins over ``sharding_key`` (a sharded message being retried stays on the
    partition its key chose first). A key goes to ``router(key, partition_num)`` and nowhere
    else, so every producer of the topic (Producer, Spark sink, ``smartnsq pub``) agrees.
    Raises ``InvalidArgument`` for a partition out of range or on a topic without partitions,
    a key on a partitioned topic of unknown size, and an unpinned publish to an ordered topic
    (its order only exists per partition).
    """
    topic = shape.topic
    if partition is not None:
        if not shape.partitioned:
            raise InvalidArgument("partition", f"topic {topic!r} has no partitions "
                                  "(classic or standalone nodes)", partition)
        count = shape.partition_num
        if count and partition >= count:
            raise InvalidArgument("partition", f"topic {topic!r} has {count} partitions "
                                  f"(0..{count - 1})", partition)
        return partition
    if sharding_key is not None:
        if not shape.partitioned:
            return None
        if shape.partition_num <= 0:
            raise InvalidArgument("sharding_key", f"topic {topic!r} has no partition count in "
                                  "lookup (standalone nodes); sharding needs one", sharding_key)
        return router(sharding_key, shape.partition_num)
    if shape.ordered:
        raise InvalidArgument("partition", f"topic {topic!r} is ordered: publish with a "
                              "sharding_key or a partition", None)
    return None


@dataclass(frozen=True)
class SubCommand:
    """The SUB to send: its name, its bytes, and whether the start is then set over HTTP."""

    name: str
    data: bytes
    set_offset: bool = False

    @property
    def detail(self) -> bool:
        """Whether messages carry the detail block (queue offset, raw size)."""
        return self.name != "SUB"


def subscription(topic: str, channel: str, partition: int | None, *, youzan: bool,
                 ordered: bool, detail: bool = False, start: StartPosition | None = None,
                 inline_start: bool = True) -> SubCommand:
    """The SUB line that reads ``partition`` of ``topic``.

    Classic nodes know only plain ``SUB``. On youzan nodes an ordered topic is read with
    ``SUB_ORDERED`` (which names its partition, and ignores a start position: the caller warns);
    a ``start`` position, or ``detail`` (the messages must carry their queue offsets), needs
    ``SUB_ADVANCED``; anything else is ``SUB`` with the partition. ``inline_start=False`` sends
    the start over HTTP after the SUB instead (``set_offset``): SUB_ADVANCED's start only
    reaches a node's default partition.
    """
    if not youzan:
        return SubCommand("SUB", commands.sub(topic, channel))
    if ordered:
        if partition is None:
            raise InvalidArgument("partitions", "ordered consumption from nsqd= addresses "
                                  "needs partitions=[...] (SUB_ORDERED names its partition)")
        return SubCommand("SUB_ORDERED", commands.sub_ordered(topic, channel, partition))
    if start is not None:
        if inline_start or partition is None:
            return SubCommand("SUB_ADVANCED",
                              commands.sub_advanced(topic, channel, partition, start))
        return SubCommand("SUB_ADVANCED", commands.sub_advanced(topic, channel, partition),
                          set_offset=True)
    if detail:
        return SubCommand("SUB_ADVANCED", commands.sub_advanced(topic, channel, partition))
    return SubCommand("SUB", commands.sub(topic, channel, partition))


def rdy_ceiling(ordered: bool, server_max: int | None, default: int = DEFAULT_MAX_RDY) -> int:
    """The most RDY a subscription may give: 1 on an ordered channel (the server would send no
    more, and a real one sent the first message twice with RDY > 1), else the server's
    ``max_rdy_count`` (``default`` when it gave none), at least 1."""
    return 1 if ordered else max(1, server_max or default)


def fin_at_once(ordered: bool) -> bool:
    """Whether a FIN is written in the turn it is made rather than with the turn's batch: on an
    ordered channel the next message waits for it, so nothing could join its write."""
    return ordered
