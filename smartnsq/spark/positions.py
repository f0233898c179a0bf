"""What a start or end spec means against the queues now: complete offsets per partition.

Apart from the planner because it is the one place where every way of naming a position
meets (``earliest``/``latest``, JSON offsets with Kafka's ``-2``/``-1``, ``timestamp:`` in
seconds, Kafka's timestamps in milliseconds), and where each is checked against the real
queue bounds before any task runs. The searches themselves (a temporary channel set to a
position on the leader) are the planner's: it knows the leaders and holds the loop thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ..errors import InvalidArgument
from ..protocol.frames import MessageFrame
from .offsets import (
    KAFKA_EARLIEST,
    KAFKA_LATEST,
    OFFSET_EARLIEST,
    OFFSET_LATEST,
    Offsets,
    timestamp_of_spec,
)

__all__ = ["Bounds", "Searcher", "first_at_or_after", "resolve"]

Bounds = dict[str, dict[int, tuple[int, int]]]


class Searcher(Protocol):
    """The planner's searches on a partition's leader."""

    def offset_at(self, topic: str, partition: int, unix_ms: int, end: int) -> int: ...

    def check_boundary(self, topic: str, partition: int, offset: int, end: int,
                       name: str) -> None: ...


def first_at_or_after(messages: Iterable[MessageFrame], unix_ms: int, end: int) -> int:
    """The offset of the first of ``messages`` published at or after ``unix_ms``, else
    ``end``.

    nsqd searches by whole seconds, so the messages of the second before ``unix_ms`` are
    read past here: Kafka's milliseconds select exactly, at the cost of reading at most one
    second of messages once."""
    floor_ns = unix_ms * 1_000_000
    for message in messages:
        if message.timestamp >= floor_ns:
            assert message.queue_offset is not None
            return message.queue_offset
    return end


def resolve(spec: Any, bounds: Bounds, name: str, search: Searcher,
            missing: str = OFFSET_EARLIEST) -> Offsets:
    """``earliest`` / ``latest`` / explicit offsets / times as complete offsets.

    Partitions explicit offsets (or per-partition times) leave out take ``missing``
    (earliest for starting offsets, latest for ending ones), as Kafka's ``-2``/``-1`` would
    name them.
    """
    times = timestamp_of_spec(spec)
    explicit = spec if isinstance(spec, dict) else {}
    if times is not None:
        explicit = times.partitions
    out: Offsets = {}
    for topic, parts in bounds.items():
        given = explicit.get(topic, {})
        unknown = set(given) - {str(p) for p in parts}
        if unknown:
            raise InvalidArgument(name, f"topic {topic!r} has no partition(s) "
                                  f"{sorted(unknown)}", sorted(unknown))
        row: dict[str, int] = {}
        for p, (first, last) in parts.items():
            default = last if spec == OFFSET_LATEST or (
                spec != OFFSET_EARLIEST and missing == OFFSET_LATEST) else first
            if times is not None:
                when = times.of(topic, str(p))
                # an empty queue has no message at any time: its end, without a search (the
                # real nsqd refuses one there: "commit log end of file")
                row[str(p)] = default if when is None else (
                    search.offset_at(topic, p, when, last) if first < last else last)
                continue
            offset = given.get(str(p))
            if offset is None:
                row[str(p)] = default
            elif offset in (KAFKA_EARLIEST, KAFKA_LATEST):
                row[str(p)] = first if offset == KAFKA_EARLIEST else last
            else:
                if not first <= offset <= last:
                    raise InvalidArgument(name, f"offset {offset} of {topic}/{p} is outside "
                                          f"the queue [{first}, {last}]", offset)
                if first < offset < last:  # the bounds are boundaries; others are asked
                    search.check_boundary(topic, p, offset, last, name)
                row[str(p)] = offset
        out[topic] = row
    return out
