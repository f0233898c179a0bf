"""Replayable reads of youzan topics: ``readStream.format("nsq")`` and bounded ``read``.

Offsets are queue positions per partition, ``{"topic": {"0": 8192, "1": 0}}`` (bytes in the
partition's queue, as the detail block of SUB_ADVANCED reports them). The offset of a
micro-batch's end is each partition leader's queue end at planning time (its
``backend_depth``), so the partition's log between two offsets never changes: a batch re-run
after a failure or a restart reads exactly the same messages. One Spark input partition reads
one NSQ partition's range on the executors (see ``cluster.read_range``); nothing is
acknowledged on any business channel unless ``commitChannel`` asks for it, in which case that
channel's cursor is moved to the committed end after Spark committed the batch.

``maxMessagesPerTrigger`` splits the limit across partitions in proportion to their backlog
(in bytes). Queue offsets must stay on message boundaries, and a byte count does not say where
the N-th message ends, so the driver finds each limited end by reading the N messages'
positions once (a short private subscription); the executors then read the same range.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from .. import _loop_thread
from ..errors import InvalidArgument
from .cluster import ClusterClient, LeaderInfo, TopicLayout, offset_at_time, read_range
from .options import (
    OFFSET_EARLIEST,
    OFFSET_LATEST,
    SourceOptions,
    check_offsets,
    timestamp_of_spec,
)
from .schema import message_batch

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    _MIXINS: tuple[type, ...] = (SupportsTriggerAvailableNow,)
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    _MIXINS = ()

__all__ = ["NSQBatchReader", "NSQRangePartition", "NSQStreamReader", "prorate"]

log = logging.getLogger("smartnsq.spark")

Offsets = dict[str, dict[str, int]]

_ARROW_BATCH = 4096  # messages per Arrow record batch handed to Spark


@dataclass
class NSQRangePartition(InputPartition):
    """``[start, end)`` of one NSQ partition (picklable; sent to an executor)."""

    topic: str
    partition: int
    start: int
    end: int
    leader: LeaderInfo
    ordered: bool
    ext: bool

    def __init__(self, topic: str, partition: int, start: int, end: int, leader: LeaderInfo,
                 ordered: bool, ext: bool) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.leader = leader
        self.ordered = ordered
        self.ext = ext


class _Planner:
    """Driver-side view of the topics: layouts and queue bounds, refreshed on demand."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.client = ClusterClient(options.cluster)
        self.layouts: dict[str, TopicLayout] = {}

    def close(self) -> None:
        self.client.close()

    def refresh(self) -> dict[str, dict[int, tuple[int, int]]]:
        """``{topic: {partition: (start, end)}}`` now, from every partition's leader."""
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for topic in self.options.topics:
            layout = self.client.layout(topic)
            self.layouts[topic] = layout
            out[topic] = {p: self.client.bounds(topic, p, leader)
                          for p, leader in sorted(layout.leaders.items())}
        return out

    def resolve(self, spec: Any, bounds: dict[str, dict[int, tuple[int, int]]],
                name: str, missing: str = OFFSET_EARLIEST) -> Offsets:
        """``earliest`` / ``latest`` / explicit offsets as complete offsets.

        Partitions explicit offsets leave out start at ``missing`` (earliest for starting
        offsets, latest for ending ones).
        """
        out: Offsets = {}
        explicit = spec if isinstance(spec, dict) else {}
        when = timestamp_of_spec(spec)
        if when is not None:
            return {topic: {str(p): self.offset_at(topic, p, when, last)
                            for p, (_, last) in parts.items()}
                    for topic, parts in bounds.items()}
        for topic, parts in bounds.items():
            given = explicit.get(topic, {})
            unknown = set(given) - {str(p) for p in parts}
            if unknown:
                raise InvalidArgument(name, f"topic {topic!r} has no partition(s) "
                                      f"{sorted(unknown)}", sorted(unknown))
            row: dict[str, int] = {}
            for p, (first, last) in parts.items():
                if str(p) in given:
                    offset = given[str(p)]
                    if not first <= offset <= last:
                        raise InvalidArgument(name, f"offset {offset} of {topic}/{p} is "
                                              f"outside the queue [{first}, {last}]", offset)
                    row[str(p)] = offset
                elif spec == OFFSET_LATEST or (spec != OFFSET_EARLIEST
                                               and missing == OFFSET_LATEST):
                    row[str(p)] = last
                else:
                    row[str(p)] = first
            out[topic] = row
        return out

    def offset_at(self, topic: str, partition: int, unix_seconds: int, end: int) -> int:
        layout = self.layouts[topic]
        loop_thread = _loop_thread.shared()
        try:
            return offset_at_time(loop_thread, self.client, topic, partition,
                                  layout.leaders[partition], unix_seconds, end,
                                  ordered=layout.ordered, ext=layout.ext,
                                  read_timeout=self.options.read_timeout,
                                  channel_prefix=self.options.channel_prefix)
        finally:
            _loop_thread.release_shared(loop_thread)

    def partitions(self, start: Offsets, end: Offsets) -> list[NSQRangePartition]:
        out = []
        for topic, ends in end.items():
            layout = self.layouts.get(topic) or self.client.layout(topic)
            self.layouts[topic] = layout
            starts = start.get(topic, {})
            for pid, stop in sorted(ends.items(), key=lambda kv: int(kv[0])):
                leader = layout.leaders.get(int(pid))
                if leader is None:
                    raise InvalidArgument("topic", f"{topic}/{pid} has no leader now", pid)
                begin = starts.get(pid)
                if begin is None:  # a partition added since the start offsets were taken
                    begin = self.client.bounds(topic, int(pid), leader)[0]
                if begin >= stop:
                    continue
                out.append(NSQRangePartition(topic, int(pid), begin, stop, leader,
                                             layout.ordered, layout.ext))
        return out


@contextlib.contextmanager
def _reading(options: SourceOptions) -> Iterator[tuple[_loop_thread.LoopThread, ClusterClient]]:
    """The shared loop thread and an HTTP client for one read, both given back however it
    ends (a failure building the client included: a leaked loop-thread user never stops)."""
    loop_thread = _loop_thread.shared()
    try:
        with ClusterClient(options.cluster) as client:
            yield loop_thread, client
    finally:
        _loop_thread.release_shared(loop_thread)


def _read(options: SourceOptions, part: NSQRangePartition) -> Iterator[Any]:
    """Executor side: the rows of one range, in queue order."""
    with _reading(options) as (loop_thread, client):
        leader = part.leader
        if options.cluster.lookupd:
            # the leader may have moved since planning; a fresh lookup costs one GET
            with contextlib.suppress(Exception):
                leader = client.layout(part.topic).leaders.get(part.partition, leader)
        node = leader.tcp_address
        pending: list[Any] = []
        for message in read_range(loop_thread, client, part.topic, part.partition, leader,
                                  part.start, part.end, ordered=part.ordered, ext=part.ext,
                                  rdy=options.rdy, read_timeout=options.read_timeout,
                                  channel=options.channel,
                                  channel_prefix=options.channel_prefix):
            pending.append(message)
            if len(pending) >= _ARROW_BATCH:
                yield message_batch(part.topic, node, pending)
                pending = []
        if pending:
            yield message_batch(part.topic, node, pending)


def _limited_end(options: SourceOptions, layout: TopicLayout, partition: int, start: int,
                 end: int, count: int) -> int:
    """The queue offset after ``count`` messages from ``start`` (at most ``end``)."""
    found = [start]
    with _reading(options) as (loop_thread, client):
        for _ in read_range(loop_thread, client, layout.topic, partition,
                            layout.leaders[partition], start, end, ordered=layout.ordered,
                            ext=layout.ext, rdy=min(count, options.rdy),
                            read_timeout=options.read_timeout, channel=None,
                            channel_prefix=options.channel_prefix, limit=count,
                            on_end=lambda e: found.__setitem__(0, e)):
            pass
    return found[0]


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


class NSQStreamReader(DataSourceStreamReader, *_MIXINS):  # type: ignore[misc]
    """Micro-batch source; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._planner: _Planner | None = None
        self._last_end: Offsets | None = None  # for Spark < 4.2 (no start in latestOffset)
        self._available_now: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to call read() on executors: only the options travel
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    @property
    def planner(self) -> _Planner:
        if self._planner is None:
            self._planner = _Planner(self._options)
        return self._planner

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        planner = self.planner
        offsets = planner.resolve(self._options.starting, planner.refresh(), "startingOffsets")
        self._last_end = offsets
        return offsets

    def getDefaultReadLimit(self) -> Any:
        limit = self._options.max_messages_per_trigger
        if limit and ReadMaxRows is not None:
            return ReadMaxRows(limit)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        planner = self.planner
        self._available_now = planner.resolve(OFFSET_LATEST, planner.refresh(), "latest")

    def latestOffset(self, start: dict | None = None,  # type: ignore[type-arg]
                     limit: Any = None) -> dict:  # type: ignore[type-arg]
        planner = self.planner
        latest = planner.resolve(OFFSET_LATEST, planner.refresh(), "latest")
        if self._available_now is not None:
            latest = _min_offsets(latest, self._available_now)
        if start is None:
            start = self._last_end or latest
        start = check_offsets(start, "start")
        max_rows: int | None = None
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            max_rows = None
        elif limit is not None and hasattr(limit, "max_rows"):
            max_rows = int(limit.max_rows)
        elif limit is None and start is not None:
            max_rows = self._options.max_messages_per_trigger
        if max_rows:
            latest = self._limit(start, latest, max_rows)
        return latest

    def _limit(self, start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
        planner = self.planner
        backlog = {}
        for topic, parts in latest.items():
            for pid, end in parts.items():
                begin = start.get(topic, {}).get(pid, end)
                backlog[(topic, pid)] = max(0, end - begin)
        shares = prorate(max_rows, backlog)
        out: Offsets = {t: dict(parts) for t, parts in latest.items()}
        for topic, parts in latest.items():
            for pid, end in parts.items():
                first = start.get(topic, {}).get(pid)
                if first is None:
                    continue
                share = shares.get((topic, pid))
                if not share:
                    continue  # nothing waiting: the end is the start
                out[topic][pid] = _limited_end(self._options, planner.layouts[topic],
                                               int(pid), first, end, share)
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[type-arg]
        self._last_end = end
        return self.planner.partitions(check_offsets(start, "start"), check_offsets(end, "end"))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQRangePartition)
        return _read(self._options, partition)

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        channel = self._options.commit_channel
        if channel is None:
            return
        planner = self.planner
        for topic, parts in check_offsets(end, "end").items():
            layout = planner.layouts.get(topic) or planner.client.layout(topic)
            for pid, offset in parts.items():
                leader = layout.leaders.get(int(pid))
                if leader is None:
                    log.warning("commit: %s/%s has no leader; %s not advanced", topic, pid,
                                channel)
                    continue
                planner.client.set_offset(topic, int(pid), leader, channel, offset)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None


def _min_offsets(a: Offsets, b: Offsets) -> Offsets:
    return {t: {p: min(o, b.get(t, {}).get(p, o)) for p, o in parts.items()}
            for t, parts in a.items()}


class NSQBatchReader(DataSourceReader):
    """Bounded read of ``[startingOffsets, endingOffsets)`` (backfills)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = _Planner(self._options)
        try:
            bounds = planner.refresh()
            start = planner.resolve(self._options.starting, bounds, "startingOffsets")
            end = planner.resolve(self._options.ending, bounds, "endingOffsets",
                                  OFFSET_LATEST)
            for topic, parts in start.items():
                for pid, offset in parts.items():
                    if end[topic][pid] < offset:
                        raise InvalidArgument("endingOffsets", f"{topic}/{pid} ends at "
                                              f"{end[topic][pid]}, before its start {offset}",
                                              end[topic][pid])
            ranges: Sequence[InputPartition] = planner.partitions(start, end)
        finally:
            planner.close()
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQRangePartition)
        return _read(self._options, partition)

