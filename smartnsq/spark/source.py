"""Replayable reads of youzan topics: ``readStream.format("nsq")`` and bounded ``read``.

Offsets are queue positions per partition, ``{"topic": {"0": 8192, "1": 0}}`` (bytes in the
partition's queue, as the detail block of SUB_ADVANCED reports them). The offset of a
micro-batch's end is each partition leader's queue end at planning time (its
``backend_depth``), so the partition's log between two offsets never changes: a batch re-run
after a failure or a restart reads exactly the same messages. One Spark input partition reads
one NSQ partition's range on the executors (see ``ranges.read_range``); nothing is
acknowledged on any business channel unless ``commitChannel`` asks for it, in which case that
channel's cursor is moved to the committed end after Spark committed the batch.

``maxMessagesPerTrigger`` splits the limit across partitions in proportion to their backlog
(in bytes). Queue offsets must stay on message boundaries, and a byte count does not say where
the N-th message ends, so the driver asks each leader where the message after the share
starts, by its number (``limits.BatchEnds``: one HTTP call per partition and batch); the
executors then read the range.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from ..errors import (
    ClusterError,
    DataLoss,
    InvalidArgument,
    LookupFailed,
    NSQError,
    PartitionUnavailable,
    TopicNotFound,
)
from ..protocol.commands import StartPosition
from ..protocol.runs import MessageRun
from ..transport import loop_thread as _loop_thread
from .admission import MinTrigger, lag_metrics, new_messages, prorate
from .availability import ReadGate, resolved, starting_offsets, stream_offsets
from .cluster import ClusterClient, LeaderInfo, TopicLayout, temporary_channel
from .columns import run_batch
from .conditions import LeaderWait, condition_of, is_transient
from .limits import BatchEnds, counted
from .offsets import KAFKA_EARLIEST, OFFSET_EARLIEST, OFFSET_LATEST
from .options import SourceOptions
from .positions import Bounds, first_at_or_after, resolve
from .ranges import RangeReader, offset_at, read_range, read_range_batches
from .topics import TopicSet

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

__all__ = ["NSQBatchReader", "NSQRangePartition", "NSQStreamReader"]

log = logging.getLogger("smartnsq.spark")

Offsets = dict[str, dict[str, int]]

_ARROW_BATCH = 4096  # messages per Arrow record batch handed to Spark


@dataclass
class NSQRangePartition(InputPartition):
    """``[start, end)`` of one NSQ partition (picklable; sent to an executor).

    ``splits`` are message boundaries inside the range: the executor reads the pieces between
    them at once, each on a channel of its own (ordered topics keep one message in flight per
    channel), and yields them in queue order.
    """

    topic: str
    partition: int
    start: int
    end: int
    leader: LeaderInfo | None  # at planning time (a hint: the reader looks it up again)
    ordered: bool
    ext: bool
    splits: tuple[int, ...]

    def __init__(self, topic: str, partition: int, start: int, end: int,
                 leader: LeaderInfo | None, ordered: bool, ext: bool,
                 splits: tuple[int, ...] = ()) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.leader = leader
        self.ordered = ordered
        self.ext = ext
        self.splits = splits


class _Planner:
    """Driver-side view of the topics: layouts and queue bounds, refreshed on demand."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.client = ClusterClient(options.cluster)
        self.topics = TopicSet(options)
        self.layouts: dict[str, TopicLayout] = {}
        # partitions without a usable leader at the last refresh -> the condition seen
        self.down: dict[tuple[str, int], str] = {}
        self.bounds: Bounds = {}  # of the last refresh
        # (topic, partition) -> (queue end, message count there): sizes messages for splits
        self.counts: dict[tuple[str, int], tuple[int, int]] = {}
        self.gate = ReadGate(self.client, options)  # leaders asked before a range

    def close(self) -> None:
        self.client.close()

    def refresh(self) -> Bounds:
        """``{topic: {partition: (start, end)}}`` now, for the partitions with a usable leader.

        The others (no leader in lookup, a leader that refuses connections or no longer leads)
        are in ``self.down`` with the condition seen: a leader change, which callers wait out.
        """
        out: Bounds = {}
        self.down = {}
        for topic in self.topics.current():
            self.gate.started(topic)
            try:
                layout = self.client.layout(topic)
            except Exception as exc:
                known = self.layouts.get(topic)
                if isinstance(exc, TopicNotFound) and self.topics.pattern is not None:
                    continue  # a pattern's topic without nodes (yet, or any more)
                if known is None or not is_transient(exc):
                    raise
                for p in self.selected(known):  # no lookupd answers: nothing can move
                    self.down[(topic, p)] = condition_of(exc)
                out[topic] = {}
                continue
            self.layouts[topic] = layout
            parts: dict[int, tuple[int, int]] = {}
            for p in self.selected(layout):
                leader = layout.leaders.get(p)
                if leader is None:
                    self.down[(topic, p)] = "no leader in lookup"
                    continue
                self.gate.seen(topic, p, leader)
                try:
                    first, last, count = self.client.positions(topic, p, leader)
                    parts[p] = (first, last)
                    self.counts[(topic, p)] = (last, count)
                except ClusterError as exc:
                    if not exc.transient:
                        raise
                    self.down[(topic, p)] = condition_of(exc)
            if any(t == topic for t, _ in self.down):
                self.gate.unsettle(topic)
            out[topic] = parts
        self.bounds = out
        return out

    def selected(self, layout: TopicLayout) -> list[int]:
        """The topic's partitions this source reads (the ``partitions`` option)."""
        chosen = self.options.partitions
        if chosen is None:
            return list(layout.partitions)
        missing = chosen - set(layout.partitions)
        if missing:
            raise InvalidArgument("partitions", f"topic {layout.topic!r} has no partition(s) "
                                  f"{sorted(missing)} (it has {len(layout.partitions)})",
                                  sorted(missing))
        return sorted(chosen)

    def refresh_all(self) -> Bounds:
        """``refresh()`` until every partition has a usable leader, up to ``leaderTimeout``:
        initial offsets and bounded reads need every partition's bounds."""
        waits: dict[tuple[str, int | None], LeaderWait] = {}
        while True:
            try:
                bounds = self.refresh()
            except Exception as exc:
                topic = next((t for t in self.topics.current() if t not in self.layouts), None)
                if topic is None or isinstance(exc, LookupFailed):
                    # every layout was read, so refresh() raised what no wait for a leader
                    # clears (a partitions option the topic lacks...); or no lookupd answered
                    # a first lookup: a wrong address is likelier than an outage
                    raise
                wait = waits.setdefault((topic, None), LeaderWait(
                    topic, None, self.options.leader_timeout))
                wait.failed(exc)  # raises unless transient and within the timeout
                continue
            if not self.down:
                return bounds
            (topic, p), condition = next(iter(self.down.items()))
            waits.setdefault((topic, p), LeaderWait(topic, p, self.options.leader_timeout)) \
                .failed(ClusterError(condition, transient=True))

    def resolve(self, spec: Any, bounds: Bounds, name: str,
                missing: str = OFFSET_EARLIEST) -> Offsets:
        """``spec`` as complete offsets (``positions.resolve``, searching on the leaders)."""
        return resolve(spec, bounds, name, self, missing)

    def offset_at(self, topic: str, partition: int, unix_ms: int, end: int) -> int:
        """The first message published at or after ``unix_ms``: nsqd's search by the
        second, then, for a time inside a second, the messages of that second read past."""
        found = self._search(topic, partition, StartPosition.timestamp(unix_ms // 1000), end)
        if unix_ms % 1000 == 0 or found >= end:
            return found
        layout = self.layouts[topic]
        with _reading(self.options) as (loop_thread, client):
            return first_at_or_after(read_range(
                loop_thread, client, topic, partition, layout.leaders[partition], found, end,
                ordered=layout.ordered, ext=layout.ext, rdy=self.options.rdy,
                read_timeout=self.options.read_timeout, channel=None,
                channel_prefix=self.options.channel_prefix), unix_ms, end)

    def check_boundary(self, topic: str, partition: int, offset: int, end: int,
                       name: str) -> None:
        """Refuse an explicit offset inside a message before any task runs: nsqd moves a
        channel set there on to the next message, which a read would take for retention's
        gap and, with ``failOnDataLoss=false``, skip the message silently."""
        found = self._search(topic, partition, StartPosition.queue_offset(offset), end)
        if found != offset:
            where = (f"the next message starts at {found}" if found > offset
                     else f"the message there starts at {found}")
            raise InvalidArgument(name, f"offset {offset} of {topic}/{partition} is inside a "
                                  f"message ({where}): give a message's queue_offset, e.g. "
                                  f"{found}", offset)

    def _search(self, topic: str, partition: int, position: StartPosition, end: int) -> int:
        layout = self.layouts[topic]
        loop_thread = _loop_thread.shared()
        try:
            return offset_at(loop_thread, self.client, topic, partition,
                             layout.leaders[partition], position, end,
                             ordered=layout.ordered, ext=layout.ext,
                             read_timeout=self.options.read_timeout,
                             channel_prefix=self.options.channel_prefix)
        finally:
            _loop_thread.release_shared(loop_thread)

    def layout(self, topic: str) -> TopicLayout:
        """The last layout seen (a fresh one, waited for, when there is none yet)."""
        layout = self.layouts.get(topic)
        if layout is None:
            wait = LeaderWait(topic, None, self.options.leader_timeout)
            while layout is None:
                try:
                    layout = self.client.layout(topic)
                except Exception as exc:
                    wait.failed(exc)
            self.layouts[topic] = layout
        return layout

    def first_offset(self, topic: str, partition: int) -> int:
        """The earliest offset of a partition, its leader waited for (``leaderTimeout``)."""
        wait = LeaderWait(topic, partition, self.options.leader_timeout)
        while True:
            try:
                leader = self.client.layout(topic).leaders.get(partition)
                if leader is None:
                    raise ClusterError("no leader in lookup", transient=True)
                return self.client.bounds(topic, partition, leader)[0]
            except Exception as exc:
                wait.failed(exc)

    def partitions(self, start: Offsets, end: Offsets) -> list[NSQRangePartition]:
        """One range per partition that has messages in ``[start, end)``.

        A range's leader is only a hint (executors look it up again); a partition that has
        no leader now still gets its range, and the executor waits for a leader.
        """
        out = []
        for topic, ends in end.items():
            layout = self.layout(topic)
            starts = start.get(topic, {})
            for pid, stop in sorted(ends.items(), key=lambda kv: int(kv[0])):
                begin = starts.get(pid)
                if begin is not None and (begin < 0 or stop < 0):
                    continue  # not resolved yet (a partition down at the start): no range
                if begin is None:  # a partition added since the start offsets were taken
                    begin = self.first_offset(topic, int(pid))
                first = self.bounds.get(topic, {}).get(int(pid), (begin, stop))[0]
                if begin < first:  # retention removed what the range starts with
                    if self.options.fail_on_data_loss:
                        raise DataLoss(topic, int(pid), begin, first)
                    log.warning("%s/%s: offsets %d..%d are no longer in the queue; skipped "
                                "(failOnDataLoss=false)", topic, pid, begin, first)
                    begin = first
                if begin >= stop:
                    continue
                out.append(NSQRangePartition(topic, int(pid), begin, stop,
                                             layout.leaders.get(int(pid)),
                                             layout.ordered, layout.ext))
        return self.split(out)

    def split(self, ranges: list[NSQRangePartition]) -> list[NSQRangePartition]:
        """Ranges cut at message boundaries: into at least ``minPartitions`` tasks, and each
        ordered range into pieces its task reads at once (``orderedReadChannels``).

        Byte offsets do not say where messages start, but a ``msgcount:N`` position names
        a message: the split points are the offsets of estimated message counts, found by
        probes (see ``ranges.offset_at``). A count estimate that is off only makes the
        pieces uneven; a failed probe only leaves a split out.
        """
        options = self.options
        if options.channel is not None or not ranges:
            return ranges  # one fixed channel cannot be read at two positions at once
        tasks = {i: 1 for i in range(len(ranges))}
        if options.min_partitions and options.min_partitions > len(ranges):
            shares = prorate(options.min_partitions,
                             {(str(i), ""): r.end - r.start for i, r in enumerate(ranges)})
            tasks = {i: shares.get((str(i), ""), 1) for i in range(len(ranges))}
        wanted: dict[int, list[int]] = {}  # range index -> message counts to probe
        per_task: dict[int, int] = {}
        for i, r in enumerate(ranges):
            end_count = self.counts.get((r.topic, r.partition))
            if end_count is None or end_count[1] <= 0 or end_count[0] <= 0:
                continue
            per_byte = end_count[1] / end_count[0]
            first, last = int(r.start * per_byte), int(r.end * per_byte)
            messages = last - first
            pieces = min(tasks[i], max(1, messages))
            fan = 1
            if r.ordered and options.ordered_read_channels > 1:
                each = messages // pieces
                fan = max(1, min(options.ordered_read_channels, each // _MIN_PIECE))
                if fan > 1 and each > fan * _MAX_PIECE:  # bounds what a task buffers
                    fan = min(-(-each // _MAX_PIECE), 256)
            per_task[i] = fan
            total = min(pieces * fan, _MAX_CUTS + 1)  # bounds the probes of one planning
            if total > 1:
                wanted[i] = [first + messages * k // total for k in range(1, total)]
        if not wanted:
            return ranges
        found = self._probe(ranges, wanted)
        out: list[NSQRangePartition] = []
        for i, r in enumerate(ranges):
            cuts = sorted({b for b in found.get(i, ()) if r.start < b < r.end})
            if not cuts:
                out.append(r)
                continue
            bounds = [r.start, *cuts, r.end]
            pieces = len(bounds) - 1
            task_count = max(1, min(tasks[i], pieces))
            edges = [bounds[pieces * k // task_count] for k in range(task_count + 1)]
            for a, b in itertools.pairwise(edges):
                inner = tuple(x for x in cuts if a < x < b) if per_task.get(i, 1) > 1 else ()
                out.append(NSQRangePartition(r.topic, r.partition, a, b, r.leader, r.ordered,
                                             r.ext, inner))
        return out

    def _probe(self, ranges: list[NSQRangePartition],
               wanted: dict[int, list[int]]) -> dict[int, list[int]]:
        """The offsets of the messages at the given counts, asked at once (a few threads)."""
        def one(job: tuple[int, int]) -> tuple[int, int | None]:
            i, count = job
            r = ranges[i]
            leader = self.layout(r.topic).leaders.get(r.partition)
            if leader is None:
                return i, None
            try:
                return i, offset_at(loop_thread, self.client, r.topic, r.partition, leader,
                                    StartPosition.message_count(count), r.end,
                                    ordered=r.ordered, ext=r.ext,
                                    read_timeout=self.options.read_timeout,
                                    channel_prefix=self.options.channel_prefix)
            except NSQError as exc:  # a split left out: the range is only less even
                log.info("%s/%d: no split at message %d: %s", r.topic, r.partition, count,
                         condition_of(exc))
                return i, None

        jobs = [(i, c) for i, counts in wanted.items() for c in counts]
        found: dict[int, list[int]] = {}
        loop_thread = _loop_thread.shared()
        try:
            with ThreadPoolExecutor(max_workers=min(_PROBES, len(jobs)),
                                    thread_name_prefix="smartnsq-spark-probe") as pool:
                for i, offset in pool.map(one, jobs):
                    if offset is not None:
                        found.setdefault(i, []).append(offset)
        finally:
            _loop_thread.release_shared(loop_thread)
        return found


_MIN_PIECE = 256  # messages: smaller ordered ranges are not worth another channel
_MAX_PIECE = 20_000  # messages of an ordered piece, where the probes allow (evens the pieces)
_PROBES = 8  # split probes at once on the driver
_MAX_CUTS = 1024  # per range and planning (each cut is one probe)


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


def _current_leader(client: ClusterClient, part: NSQRangePartition) -> LeaderInfo:
    """The partition's leader now (it may have moved since planning: one GET)."""
    leader = client.layout(part.topic).leaders.get(part.partition)
    if leader is None:
        raise ClusterError("no leader in lookup", transient=True)
    return leader


def _read(options: SourceOptions, part: NSQRangePartition) -> Iterator[Any]:
    """Executor side: the rows of one range, in queue order.

    A range with ``splits`` is first read piece by piece at once (``_read_pieces``); if that
    meets a leader change, the rest is read as below from the end of the last row yielded.

    A leader that dies, moves or stalls mid-range is a condition to wait out, not a task
    failure (a local session has no task retries): the read resumes at the offset after the
    last message it got, from whichever node leads the partition then, for up to
    ``leaderTimeout`` without progress.
    """
    with _reading(options) as (loop_thread, client):
        position = part.start
        if part.splits:
            done = [part.start]
            try:
                yield from _read_pieces(loop_thread, client, options, part, done)
            except Exception as exc:  # a gap at a piece's start is judged by read_range
                if not (is_transient(exc) or isinstance(exc, DataLoss)):
                    raise
                log.warning("%s/%d: %s; reading the rest of [%d, %d) on one channel",
                            part.topic, part.partition, condition_of(exc), done[0], part.end)
            position = done[0]
        yield from _read_one(loop_thread, client, options, part, position)


def _read_one(loop_thread: _loop_thread.LoopThread, client: ClusterClient,
              options: SourceOptions, part: NSQRangePartition,
              position: int) -> Iterator[Any]:
    """``[position, part.end)`` over one channel, waiting out leader changes."""
    failed_at = position
    wait = LeaderWait(part.topic, part.partition, options.leader_timeout)
    pending: list[MessageRun] = []
    rows = 0
    node = ""
    while position < part.end:
        try:
            leader = _current_leader(client, part)
            if pending and leader.tcp_address != node:
                yield _rows(options, part.topic, node, pending)
                pending, rows = [], 0
            node = leader.tcp_address
            for batch in read_range_batches(loop_thread, client, part.topic, part.partition,
                                            leader, position, part.end, ordered=part.ordered,
                                            ext=part.ext, rdy=options.rdy,
                                            read_timeout=options.read_timeout,
                                            channel=options.channel,
                                            channel_prefix=options.channel_prefix,
                                            fail_on_data_loss=options.fail_on_data_loss):
                pending.append(batch)
                rows += len(batch)
                position = batch.end_offset
                if rows >= _ARROW_BATCH:
                    yield _rows(options, part.topic, node, pending)
                    pending, rows = [], 0
                    wait.progressed()
            break
        except Exception as exc:
            if position > failed_at:
                wait.progressed()  # it moved since the last failure: not stuck
            failed_at = position
            wait.failed(exc)
    if pending:
        yield _rows(options, part.topic, node, pending)


def _read_pieces(loop_thread: _loop_thread.LoopThread, client: ClusterClient,
                 options: SourceOptions, part: NSQRangePartition,
                 done: list[int]) -> Iterator[Any]:
    """The pieces of ``part`` (cut at its ``splits``), up to ``orderedReadChannels`` of them
    read at once, each on a temporary channel of its own, yielded in queue order.

    An ordered channel has one message in flight, so one channel reads a message per round
    trip; several channels at different offsets of the same partition keep several in flight.
    Pieces ahead of the one being yielded wait in their readers, each bounded by its
    ``max_buffered`` (``RangeReader``: past it the server's window fills with FINs held back),
    whatever the pieces' sizes. ``done[0]`` is the offset after the last row yielded.
    """
    leader = _current_leader(client, part)
    node = leader.tcp_address
    bounds = [part.start, *part.splits, part.end]
    waiting = deque(itertools.pairwise(bounds))
    reading: deque[tuple[RangeReader, str]] = deque()
    timeout = options.read_timeout

    def start_next() -> None:
        first, last = waiting.popleft()
        name = temporary_channel(options.channel_prefix)
        client.create_channel(part.topic, part.partition, leader, name)
        reader = RangeReader(part.topic, part.partition, leader, name, first, last,
                             ordered=part.ordered, ext=part.ext, rdy=options.rdy,
                             config=client.connection_config,
                             fail_on_data_loss=options.fail_on_data_loss)
        reading.append((reader, name))  # from here on, closed and deleted however it ends
        client.set_offset(part.topic, part.partition, leader, name, first)
        loop_thread.run(reader.open(), timeout=timeout + 5)

    def finish(reader: RangeReader, name: str) -> None:
        if loop_thread.running:
            with contextlib.suppress(Exception):
                loop_thread.run(reader.close(), timeout=10)
        try:
            client.delete_channel(part.topic, part.partition, leader, name)
        except NSQError as exc:
            log.warning("could not delete the temporary channel %s of %s/%d: %s", name,
                        part.topic, part.partition, exc)

    pending: list[MessageRun] = []
    rows = 0
    try:
        while waiting and len(reading) < options.ordered_read_channels:
            start_next()
        while reading:
            reader, name = reading[0]
            while True:
                # the head piece whole: its messages trickle in one per round trip
                batch = loop_thread.run(reader.next_batch(timeout, whole=True),
                                        timeout=None)
                if not batch:
                    break
                pending.append(batch)
                rows += len(batch)
                if rows >= _ARROW_BATCH:
                    done[0] = batch.end_offset
                    yield _rows(options, part.topic, node, pending)
                    pending, rows = [], 0
            reading.popleft()
            finish(reader, name)
            if waiting:
                start_next()
        if pending:
            done[0] = pending[-1].end_offset
            yield _rows(options, part.topic, node, pending)
    finally:
        while reading:
            finish(*reading.popleft())


def _rows(options: SourceOptions, topic: str, node: str, runs: list[MessageRun]) -> Any:
    """One Arrow batch of rows, the bodies their producers compressed decoded."""
    return run_batch(topic, node, MessageRun.join(runs), options.key_header,
                     options.max_decompressed_size)


class NSQStreamReader(DataSourceStreamReader, *_MIXINS):  # type: ignore[misc]
    """Micro-batch source; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._planner: _Planner | None = None
        self._ends: BatchEnds  # limited batches' ends; made with the planner
        self._last_end: Offsets | None = None  # for Spark < 4.2 (no start in latestOffset)
        self._available_now: Offsets | None = None
        self._down_since: dict[tuple[str, int], float] = {}
        self._latest_seen: Offsets | None = None
        self._min = (MinTrigger(options.min_messages_per_trigger, options.max_trigger_delay)
                     if options.min_messages_per_trigger else None)
        # (topic, partition) -> (offset, message count there): counts new messages exactly
        self._counted: dict[tuple[str, int], tuple[int, int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to call read() on executors: only the options travel
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    @property
    def planner(self) -> _Planner:
        if self._planner is None:
            self._planner = _Planner(self._options)
            self._ends = BatchEnds(self._planner.client, self._options)
        return self._planner

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        """The starting offsets, without waiting for partitions that have no usable leader
        now (``availability.starting_offsets``)."""
        offsets = starting_offsets(self.planner, self._options.starting)
        self._last_end = offsets
        self._remember_counts(offsets)
        return offsets

    def getDefaultReadLimit(self) -> Any:
        limit = self._options.max_messages_per_trigger
        if limit and ReadMaxRows is not None:
            return ReadMaxRows(limit)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        """The queue ends now; a partition without a usable leader now gets none."""
        planner = self.planner
        try:
            bounds = planner.refresh()
        except Exception:
            bounds = planner.refresh_all()
        self._available_now = planner.resolve(OFFSET_LATEST, bounds, "latest")

    def _latest(self, start: Offsets) -> Offsets:
        """Each partition's queue end now; a partition without a usable leader keeps its
        offset in ``start`` (never dropped: dropped, it would restart at the earliest)."""
        planner = self.planner
        bounds = planner.refresh()
        latest: Offsets = {t: {str(p): end for p, (_, end) in parts.items()}
                           for t, parts in bounds.items()}
        for topic, parts in start.items():
            row = latest.setdefault(topic, {})
            for pid, offset in parts.items():
                end = row.get(pid)
                if end is None:
                    row[pid] = offset
                elif offset < 0:  # down at the start: its starting offset, read from now on
                    row[pid] = bounds[topic][int(pid)][0] if offset == KAFKA_EARLIEST else end
                elif end < offset:  # a leader behind what was read: wait, never go back
                    planner.down[(topic, int(pid))] = (f"its leader's queue ends at {end}, "
                                                       f"before the offset read, {offset}")
                    row[pid] = offset
                elif end > offset:
                    first = bounds[topic][int(pid)][0]
                    refused = planner.gate.consumable(topic, int(pid), max(offset, first))
                    if refused is not None:  # not planned until its leader serves reads
                        planner.down[(topic, int(pid))] = refused
                        row[pid] = offset
        self._track_down(planner.down)
        return latest

    def _track_down(self, down: dict[tuple[str, int], str]) -> None:
        """Remember since when each partition is without a usable leader; past
        ``leaderTimeout`` the query fails with one error naming the partition."""
        now = time.monotonic()
        for key in list(self._down_since):
            if key not in down:
                log.info("%s/%d has a leader again", *key)
                del self._down_since[key]
        for (topic, pid), condition in down.items():
            since = self._down_since.setdefault((topic, pid), now)
            if since == now:
                log.warning("%s/%d: %s; the stream goes on with the other partitions and "
                            "waits for this one (up to %gs)", topic, pid, condition,
                            self._options.leader_timeout)
            elif now - since >= self._options.leader_timeout:
                raise PartitionUnavailable(topic, pid, condition, now - since)

    def latestOffset(self, start: dict | None = None,  # type: ignore[type-arg]
                     limit: Any = None) -> dict:  # type: ignore[type-arg]
        if start is None:
            start = self._last_end or {}
        start = stream_offsets(start, "start")
        latest = self._latest(start)
        if self._available_now is not None:
            latest = _min_offsets(latest, self._available_now)
        max_rows: int | None = None
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            max_rows = None
        elif limit is not None and hasattr(limit, "max_rows"):
            max_rows = int(limit.max_rows)
        elif limit is None:
            max_rows = self._options.max_messages_per_trigger
        self._latest_seen = latest
        everything = ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable)
        if self._min is not None and not everything and self._available_now is None \
                and self._min.hold(new_messages(resolved(start, latest), latest,
                                                self.planner.counts, self._counted)):
            return start  # Spark plans no batch: the same offsets as the start
        if max_rows:
            latest = self._limit(start, latest, max_rows)
        self._remember_counts(latest)
        return latest

    def _remember_counts(self, offsets: Offsets) -> None:
        """The message counts at ``offsets`` where they are known (the queue ends just seen,
        the limited ends found), so that ``minOffsetsPerTrigger`` counts the next batch's
        messages exactly."""
        counts = self.planner.counts
        self._counted = {**counted(self._ends.known, offsets), **counted(counts, offsets)}

    def reportLatestOffset(self) -> dict | None:  # type: ignore[type-arg]
        """The queue ends seen at the last planning (Spark 4.2+ shows them in the query
        progress as ``latestOffset``, beside ``endOffset``: the gap is the lag)."""
        return self._latest_seen

    def metrics(self, consumed: dict | None = None) -> dict[str, Any]:  # type: ignore[type-arg]
        """Lag behind the queue ends, as Kafka's source reports it (``min``/``max``/
        ``avgOffsetsBehindLatest``; ``admission.lag_metrics``).

        ``consumed`` defaults to the end of the last planned batch. Spark's Python source API
        has no hook that puts these in the query progress (pyspark 4.3); the same figures are
        in the progress as ``latestOffset`` minus ``endOffset``.
        """
        done = stream_offsets(consumed, "consumed") if consumed else (self._last_end or {})
        latest = self._latest_seen or {}
        return lag_metrics(latest, resolved(done, latest),
                           sorted(f"{t}/{p}" for t, p in self._down_since))

    def _limit(self, start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
        planner = self.planner
        backlog = {}
        for topic, parts in latest.items():
            for pid, end in parts.items():
                begin = start.get(topic, {}).get(pid, end)
                backlog[(topic, pid)] = max(0, end - begin) if begin >= 0 else 0
        shares = prorate(max_rows, backlog)
        out: Offsets = {t: dict(parts) for t, parts in latest.items()}
        for topic, parts in latest.items():
            for pid, end in parts.items():
                first = start.get(topic, {}).get(pid)
                if first is None or first < 0:
                    continue
                share = shares.get((topic, pid))
                if not share:
                    continue  # nothing waiting: the end is the start
                try:
                    out[topic][pid] = self._ends.end_after(
                        planner.layouts[topic], int(pid), first, end, share,
                        planner.counts.get((topic, int(pid))))
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    # its leader went away since refresh(): nothing from it in this batch
                    log.warning("%s/%s: %s; not read in this micro-batch", topic, pid,
                                condition_of(exc))
                    out[topic][pid] = first
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[type-arg]
        self._last_end = stream_offsets(end, "end")
        return self.planner.partitions(stream_offsets(start, "start"),
                                       stream_offsets(end, "end"))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQRangePartition)
        return _read(self._options, partition)

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        channel = self._options.commit_channel
        if channel is None:
            return
        planner = self.planner
        for topic, parts in stream_offsets(end, "end").items():
            layout = planner.layout(topic)
            for pid, offset in parts.items():
                if offset < 0:
                    continue  # not resolved yet: nothing read there
                leader = layout.leaders.get(int(pid))
                if leader is None:
                    log.warning("commit: %s/%s has no leader; %s not advanced", topic, pid,
                                channel)
                    continue
                try:
                    planner.client.set_offset(topic, int(pid), leader, channel, offset)
                except ClusterError as exc:
                    if not exc.transient:
                        raise
                    # the next commit moves it further: the channel only trails a little more
                    log.warning("commit: %s/%s: %s; %s not advanced this time", topic, pid,
                                condition_of(exc), channel)

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
            bounds = planner.refresh_all()
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
        if not isinstance(partition, NSQRangePartition):
            # pyspark plans one InputPartition(None) when partitions() returns none: a read
            # that selects nothing (an empty topic, start == end) is an empty DataFrame
            if partition.value is None:
                return iter(())
            raise TypeError(f"the nsq source cannot read {partition!r}")
        return _read(self._options, partition)

