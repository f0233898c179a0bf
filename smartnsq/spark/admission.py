"""How much a micro-batch takes: ``maxMessagesPerTrigger`` shares, ``minOffsetsPerTrigger``
with ``maxTriggerDelay``, and the lag the stream reports.

Apart from the source because these are decisions on numbers (offsets, message counts, the
time), tested without a cluster, while the source is the plumbing between Spark and the
queues. Queue offsets are bytes; Kafka's limits count messages, so do these: a partition's
message count comes from its leader (``message_count`` at the queue end), and where the count
at the start offset is not known (the first planning after a restart, a limited end found by
a read, ``limits.BatchEnds``) it is estimated from the partition's average message size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MinTrigger", "lag_metrics", "new_messages", "prorate"]

Offsets = dict[str, dict[str, int]]


def prorate(limit: int, backlog: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Split ``limit`` messages across partitions in proportion to their backlog (>= 1 each).

    Largest remainders get the leftover, so the shares add up to ``limit`` whenever there are
    at most ``limit`` partitions with a backlog.
    """
    waiting = {k: b for k, b in backlog.items() if b > 0}
    total = sum(waiting.values())
    if not waiting:
        return {}
    shares = {k: limit * b // total for k, b in waiting.items()}
    leftover = limit - sum(shares.values())
    by_remainder = sorted(waiting, key=lambda k: (-(limit * waiting[k] % total), k))
    for k in by_remainder[:max(leftover, 0)]:
        shares[k] += 1
    return {k: max(1, s) for k, s in shares.items()}


def new_messages(start: Offsets, latest: Offsets,
                 counts: Mapping[tuple[str, int], tuple[int, int]],
                 known: Mapping[tuple[str, int], tuple[int, int]]) -> int:
    """Messages between ``start`` and ``latest``, over every partition.

    ``counts``: (queue end, message count there) per partition, from the leaders; ``known``:
    (offset, message count there) remembered from earlier plannings. A partition new since
    ``start`` counts from its first message."""
    total = 0
    for topic, parts in latest.items():
        for pid, end in parts.items():
            begin = start.get(topic, {}).get(pid, 0)
            if end <= begin:
                continue
            at_end = counts.get((topic, int(pid)))
            before = known.get((topic, int(pid)))
            if at_end is not None and at_end[0] == end and before is not None \
                    and before[0] == begin:
                total += max(0, at_end[1] - before[1])
            elif at_end is not None and at_end[0] > 0 and at_end[1] > 0:
                total += max(1, round((end - begin) * at_end[1] / at_end[0]))
            else:
                total += 1  # no count known: at least one message waits
    return total


class MinTrigger:
    """``minOffsetsPerTrigger`` + ``maxTriggerDelay``: hold a micro-batch back until at least
    ``least`` new messages wait, or until ``delay`` seconds have passed since the last batch
    (since the first planning, for the first one) with at least one message waiting."""

    def __init__(self, least: int, delay: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._least = least
        self._delay = delay
        self._clock = clock
        self._since: float | None = None

    def hold(self, waiting: int) -> bool:
        """Whether to plan no batch now, given ``waiting`` new messages."""
        now = self._clock()
        if self._since is None:
            self._since = now
        if waiting <= 0:
            return True
        if waiting >= self._least or now - self._since >= self._delay:
            self._since = now
            return False
        return True


def lag_metrics(latest: Offsets, done: Offsets, without_leader: list[str]) -> dict[str, Any]:
    """Kafka's lag metrics, in Kafka's form (numbers as strings), over every partition:
    ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``, ``avgOffsetsBehindLatest``
    (queue bytes here, since offsets are bytes), plus each partition's gap and the partitions
    waiting for a leader."""
    gaps = {topic: {pid: max(0, end - done.get(topic, {}).get(pid, end))
                    for pid, end in parts.items()} for topic, parts in latest.items()}
    every = [gap for parts in gaps.values() for gap in parts.values()]
    out: dict[str, Any] = {"offsetsBehindLatest": gaps,
                           "partitionsWithoutLeader": without_leader}
    if every:
        out.update(minOffsetsBehindLatest=str(min(every)),
                   maxOffsetsBehindLatest=str(max(every)),
                   avgOffsetsBehindLatest=str(sum(every) / len(every)))
    return out
