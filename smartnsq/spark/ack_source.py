"""Acknowledging streaming source (``mode=ack``): classic clusters, or youzan when asked.

Classic nsqd has no queue offsets, so nothing can be replayed by position. This source keeps
one ``smartnsq.Consumer`` on the driver (in Spark's long-lived Python process that
plans the query's micro-batches) with ``auto_finish=False``, and numbers the messages it
receives: the offset is ``{"seq": n}``, the count of messages received so far.

* ``latestOffset`` is the newest sequence number (``maxMessagesPerTrigger`` caps the step);
* ``partitions(start, end)`` ships the messages ``(start, end]`` themselves to the executors
  inside the input partitions (so throughput is bounded by the driver);
* a message is FINed only once Spark has made its micro-batch durable. Until then it stays in
  flight, and a background task TOUCHes it every half ``msg_timeout`` so a long batch is not
  redelivered meanwhile;
* ``stop()`` requeues what was not committed; if the driver dies, its connections close and
  nsqd redelivers every message that was not FINed. Delivery is at least once.

When Spark says a batch is durable (MicroBatchExecution, Spark 4.x): it writes batch N's entry
in the checkpoint's commit log (``commits/N``, ``markMicroBatchEnd``) once the sink has its
output, but calls the source's ``commit(end of N)`` only when it plans batch N+1
(``cleanUpLastExecutedMicroBatch``, after writing ``offsets/N+1``): at a later trigger that has
new data, or never if the query stops first. Two earlier signals are used, ``commit`` stays:

* ``latestOffset(start, limit)``: Spark passes the end of the last batch it ran, and calls it
  only after that batch's commit log entry is written (a batch re-run after a restart is run
  before any ``latestOffset``). So every message up to ``start`` is FINed there, at the next
  trigger, with or without new data;
* at ``stop()``: a clean stop ends the query between triggers, after the last batch's commit
  log entry and before the next ``latestOffset`` (always so with ``Trigger.AvailableNow`` and
  ``once``), and Spark never tells the source. The Python reader is not given the checkpoint
  (``PythonScan.toMicroBatchStream`` drops it), so the user may hand it the query's
  ``checkpointLocation`` as a reader option: ``stop()`` then reads the last batch id in
  ``commits/``, this source's end offset in ``offsets/<id>``, and FINs what that batch held
  instead of requeueing it. Only a local (or ``file:``) checkpoint is read, only an end this
  process planned is trusted, and anything unclear falls back to requeueing (at least once).

Spark (4.x) ends the Python process holding a stream reader with SIGTERM when the query stops
(``PythonStreamingSourceRunner.stop`` destroys the worker), without calling ``stop()``:
unanswered messages would then wait out nsqd's ``msg_timeout`` before anyone else gets them.
So the reader, once its consumer runs, handles SIGTERM in that process: it runs ``stop()``
and then hands the signal on to the previous handler (by default, terminating the process as
before). Spark's ``stopSources`` runs after the query thread has ended, so the commit log is
final by then.

Checkpoints written before the ``latestOffset`` FIN may hold ``{"seq": n, "tick": k}`` offsets
(empty batches once used to make Spark commit the last one): they are read, and ``tick`` is
kept as it is, never moved.

Limits (also in docs/spark.md): every message passes through the driver; the messages of
one micro-batch must fit ``maxInFlight`` (the consumer's RDY budget: unacknowledged messages
stay in flight until commit) and a batch must be committed before the server's
``max_msg_timeout`` (TOUCH cannot extend a message beyond it). After a restart Spark re-runs
the micro-batch it had planned but not committed: its messages are gone with the old driver
(nsqd redelivers them), so the re-run takes as many messages as are buffered now, up to the
batch's size.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..consumer.core import Consumer
from ..errors import ClusterError
from ..message import Message
from ..observability.stats import LookupStats
from ..protocol import frames
from ..transport import loop_thread as _loop_thread
from .options import AckSourceOptions
from .schema import message_batch

__all__ = ["NSQAckPartition", "NSQAckStreamReader"]

log = logging.getLogger("smartnsq.spark")

_ROWS_PER_PARTITION = 10_000


@dataclass
class _Shipped:
    """The picklable part of a message: what the row needs."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes
    ext_version: int
    ext: bytes | None
    queue_offset: int | None
    raw_size: int | None
    youzan: bool
    node: str


# a lookupd in one of these states gave no answer at all (LookupdStatus.state)
_SILENT = {"refused": "connection refused", "timeout": "no answer in time",
           "malformed": "answers, but not as nsqlookupd", "tls": "TLS refused"}


def _silent_lookupds(lookup: LookupStats | None) -> str | None:
    """Why no nsqd was found, when the reason is that no lookupd answered: the consumer
    keeps asking them in the background, so only its lookup counters tell a dead or wrong
    lookupd address from a topic that no nsqd has."""
    if lookup is None or not lookup.lookupds:
        return None
    if any(h.state not in _SILENT for h in lookup.lookupds):
        return None  # one answered (or was not asked yet): the lookupds are not the reason
    return "; ".join(f"lookupd at {h.address} does not answer ({_SILENT[h.state]})"
                     for h in lookup.lookupds)


def _local_checkpoint(location: str) -> Path | None:
    """The checkpoint as a local folder, or None: this process reads files itself, without
    Hadoop, so an HDFS/S3/DBFS checkpoint cannot be read (the stop then requeues)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") and (parsed.scheme or not parsed.netloc):
        return Path(unquote(parsed.path) if parsed.scheme else location)
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return Path(location)
    return None


def _committed_seq(location: str) -> int | None:
    """The ``seq`` of this source's end offset in the last batch of the checkpoint's commit
    log, or None when that cannot be told for sure.

    Spark's logs (HDFSMetadataLog): ``commits/<id>`` exists once batch ``id`` is committed;
    ``offsets/<id>`` is ``v1``, a metadata line, then one line per source (its offset JSON,
    or ``-``). The sources are not named there, so only a query with exactly one offset of
    this source's shape is read; another format version is not read at all.
    """
    folder = _local_checkpoint(location)
    if folder is None:
        log.info("mode=ack: checkpoint %s is not local: the stop requeues the last batch",
                 location)
        return None
    try:
        ids = [int(f.name) for f in (folder / "commits").iterdir() if f.name.isdigit()]
        if not ids:
            return None
        lines = (folder / "offsets" / str(max(ids))).read_text("utf-8").splitlines()
    except (OSError, ValueError) as exc:
        log.info("mode=ack: checkpoint %s not readable (%s): the stop requeues the last "
                 "batch", location, exc)
        return None
    if not lines or lines[0].strip() != "v1":
        return None
    ours: list[int] = []
    for line in lines[2:]:
        with contextlib.suppress(ValueError):
            offset = json.loads(line)
            if isinstance(offset, dict) and set(offset) <= {"seq", "tick"} \
                    and isinstance(offset.get("seq"), int):
                ours.append(offset["seq"])
    return ours[0] if len(ours) == 1 else None


class NSQAckPartition(InputPartition):
    """A slice of one micro-batch's messages, carried to the executor."""

    def __init__(self, topic: str, messages: list[_Shipped]) -> None:
        super().__init__(len(messages))
        self.topic = topic
        self.messages = messages


class NSQAckStreamReader(DataSourceStreamReader):
    """See the module docstring."""

    def __init__(self, options: AckSourceOptions) -> None:
        self._options = options
        # reentrant: the SIGTERM handler runs stop() on the main thread, maybe inside a locked
        # section of that same thread
        self._lock = threading.RLock()
        self._buffer: list[Message] = []       # received, not yet numbered
        self._numbered: dict[int, Message] = {}  # seq -> message, until committed
        self._seq = 0                          # the highest number given
        self._loop_thread: _loop_thread.LoopThread | None = None
        self._consumer: Consumer | None = None
        self._tasks: list[concurrent.futures.Future[None]] = []
        self._previous_sigterm: Any = None  # the handler ours replaced, while ours is set
        self._terminating = False
        self._tick = 0  # kept from checkpoints of versions that asked for empty batches
        self._planned: set[int] = set()  # batch ends this process handed to Spark
        self._unconnected_since: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to call read() on executors: only the options travel
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    # -- the driver-held consumer ----------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._consumer is not None:
            return
        options = self._options
        kwargs: dict[str, Any] = {"max_in_flight": options.max_in_flight,
                                  "auto_finish": False, **options.cluster.connection.kwargs()}
        if options.cluster.lookupd:
            kwargs["lookupd"] = list(options.cluster.lookupd)
        else:
            kwargs["nsqd"] = list(options.cluster.nsqd)

        async def start() -> Consumer:
            consumer = Consumer(options.topic, options.channel, **kwargs)
            await consumer.start()
            return consumer

        # one shared-loop user per started consumer: a start that fails gives it back, or
        # every failed micro-batch planning would keep the loop thread alive for ever
        loop_thread = _loop_thread.shared()
        try:
            consumer = loop_thread.run(start(), timeout=30)
        except BaseException:
            _loop_thread.release_shared(loop_thread)
            raise
        self._loop_thread, self._consumer = loop_thread, consumer
        self._tasks.append(loop_thread.submit(self._pull(consumer)))
        self._tasks.append(loop_thread.submit(self._keep_alive()))
        self._handle_sigterm()

    def _handle_sigterm(self) -> None:
        """Requeue on SIGTERM, Spark's way of ending this process (see the module docstring)."""
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; stop() is then up to the caller
        try:
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # pragma: no cover - not the main interpreter
            return
        # None: a handler set outside Python, which cannot be put back; default is closest
        self._previous_sigterm = signal.SIG_DFL if previous is None else previous
        self._terminating = False

    def _release_sigterm(self) -> None:
        previous, self._previous_sigterm = self._previous_sigterm, None
        if previous is None or threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(ValueError):
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._terminating:
            return  # Spark may signal again while the first one is being handled
        self._terminating = True
        # stop() must leave our handler in place: a second SIGTERM under the default action
        # would end the process before the REQs are out
        previous, self._previous_sigterm = self._previous_sigterm, None
        try:
            self.stop()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:  # SIG_DFL (or unknown): terminate, as before
                os.kill(os.getpid(), signal.SIGTERM)

    async def _pull(self, consumer: Consumer) -> None:
        async for message in consumer:
            with self._lock:
                self._buffer.append(message)

    async def _keep_alive(self) -> None:
        interval = self._options.touch_interval
        while True:
            await asyncio.sleep(interval)
            with self._lock:
                waiting = [*self._numbered.values(), *self._buffer]
            for message in waiting:
                with contextlib.suppress(Exception):  # answered meanwhile, or link gone
                    message.touch()

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        return {"seq": 0}

    def latestOffset(self, start: dict | None = None,  # type: ignore[type-arg]
                     limit: Any = None) -> dict:  # type: ignore[type-arg]
        """Number what is buffered (up to the limit) as the next micro-batch, and FIN the
        batches up to ``start``.

        Spark asks with ``start`` the end of the last batch it ran, once that batch's commit
        log entry is written; its ``commit`` would come only with the next planned batch.
        FINing here frees the RDY budget at the next trigger even when the last batch took
        all of it and nothing new could arrive (before, empty "tick" batches were planned to
        get that ``commit``).
        """
        self._ensure_started()
        self._check_connected()
        base = int(start["seq"]) if start else self._seq
        if start:
            self._fin_through(base)
        cap = self._options.max_messages_per_trigger
        if limit is not None and hasattr(limit, "max_rows"):
            cap = int(limit.max_rows)
        elif limit is not None:
            cap = None  # ReadAllAvailable
        with self._lock:
            self._seq = max(self._seq, base)  # after a restart: continue from the checkpoint
            self._tick = max(self._tick, int(start.get("tick", 0)) if start else 0)
            available = len(self._buffer)
            take = available if cap is None else min(cap, available)
            for message in self._buffer[:take]:
                self._seq += 1
                self._numbered[self._seq] = message
            del self._buffer[:take]
            if self._tick:
                return {"seq": self._seq, "tick": self._tick}
            return {"seq": self._seq}

    def _check_connected(self) -> None:
        """Fail, past ``connectTimeout``, a query whose consumer never reaches an nsqd (a
        missing topic, a dead lookupd, wrong addresses) instead of waiting for ever."""
        consumer = self._consumer
        if consumer is None:
            return
        if consumer.error is not None:
            raise consumer.error
        if consumer.connection_count:
            self._unconnected_since = None
            return
        now = time.monotonic()
        if self._unconnected_since is None:
            self._unconnected_since = now
            return
        waited = now - self._unconnected_since
        if waited < self._options.connect_timeout:
            return
        stats = consumer.stats()
        errors = [sub.last_error for sub in stats.subscriptions if sub.last_error]
        where = ("lookupd " + ",".join(self._options.cluster.lookupd)
                 if self._options.cluster.lookupd
                 else "nsqd " + ",".join(self._options.cluster.nsqd))
        silent = _silent_lookupds(stats.lookup)
        reason = (f"last error: {errors[-1]}" if errors else silent if silent is not None
                  else "lookupd answers, but no nsqd has the topic"
                  if self._options.cluster.lookupd else "no nsqd has the topic")
        raise ClusterError(
            f"mode=ack: no nsqd connection for topic {self._options.topic!r} channel "
            f"{self._options.channel!r} in {waited:.0f}s from {where} ({reason}); fix: "
            "create the topic, check the lookupd/nsqd addresses, or raise connectTimeout")

    def getDefaultReadLimit(self) -> Any:
        limit = self._options.max_messages_per_trigger
        if limit:
            with contextlib.suppress(ImportError):
                from pyspark.sql.streaming.datasource import ReadMaxRows

                return ReadMaxRows(limit)
        return super().getDefaultReadLimit()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[type-arg]
        self._ensure_started()
        first, last = int(start["seq"]) + 1, int(end["seq"])
        with self._lock:
            self._planned.add(last)
        if first > last:
            return []  # an empty range: Spark's setLatestSeenOffset, or an old "tick" batch
        with self._lock:
            missing = [s for s in range(first, last + 1) if s not in self._numbered]
            if missing:
                # a batch planned by a driver that died: its messages were redelivered to
                # nsqd; stand in with what is buffered now (at least once)
                log.info("re-running batch (%d, %d]: %d of its messages are gone with the "
                         "old driver; taking buffered ones instead", first - 1, last,
                         len(missing))
                for seq in missing:
                    if not self._buffer:
                        break
                    self._numbered[seq] = self._buffer.pop(0)
                self._seq = max(self._seq, last)
            batch = [self._numbered[s] for s in range(first, last + 1) if s in self._numbered]
        shipped = [_Shipped(m.timestamp, m.attempts, m.id, m.body, m.ext_version, m.ext,
                            m.queue_offset, m.raw_size, m.youzan, m.node) for m in batch]
        return [NSQAckPartition(self._options.topic, shipped[i:i + _ROWS_PER_PARTITION])
                for i in range(0, len(shipped), _ROWS_PER_PARTITION)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQAckPartition)
        by_node: dict[str, list[frames.MessageFrame]] = {}
        for s in partition.messages:
            message = frames.MessageFrame(s.timestamp, s.attempts, s.id, s.body, s.ext_version,
                                          s.ext, s.queue_offset, s.raw_size, s.youzan)
            by_node.setdefault(s.node, []).append(message)
        for node, messages in by_node.items():
            yield message_batch(partition.topic, node, messages, "key")

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        self._fin_through(int(end["seq"]))

    def _fin_through(self, last: int) -> None:
        with self._lock:
            done = [seq for seq in self._numbered if seq <= last]
            messages = [self._numbered.pop(seq) for seq in done]
            # the commit log's last batch ends at ``last`` or later: older ends are not needed
            self._planned = {end for end in self._planned if end >= last}
        for message in messages:
            try:
                message.fin()
            except Exception as exc:  # the link closed: nsqd redelivers it (at least once)
                log.debug("FIN after commit failed: %s", exc)

    def _committed_at_stop(self) -> int | None:
        """The end of the last batch Spark committed, from the checkpoint the reader was
        given (see the module docstring), if it is a batch this process planned: a wrong or
        foreign checkpoint must not make it FIN what no commit covers."""
        location = self._options.checkpoint_location
        if not location:
            return None
        seq = _committed_seq(location)
        if seq is None or seq not in self._planned:
            if seq is not None:
                log.info("mode=ack: the checkpoint's last committed end (seq %d) is not a "
                         "batch this driver planned: not FINed at stop", seq)
            return None
        return seq

    def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        loop_thread, self._loop_thread = self._loop_thread, None
        tasks, self._tasks = self._tasks, []
        self._release_sigterm()
        if loop_thread is None:
            return
        try:
            for task in tasks:
                task.cancel()
            committed = self._committed_at_stop()
            if committed is not None:
                self._fin_through(committed)
            with self._lock:
                waiting = [*self._numbered.values(), *self._buffer]
                self._numbered.clear()
                self._buffer.clear()
            for message in waiting:
                with contextlib.suppress(Exception):
                    message.req(0, backoff=False)
            if consumer is not None:
                loop_thread.run(consumer.close(timeout=5), timeout=15)
        finally:
            _loop_thread.release_shared(loop_thread)
