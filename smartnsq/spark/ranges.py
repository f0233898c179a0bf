"""One partition's range of queue offsets, read on an executor.

A :class:`RangeReader` reads the messages whose queue offset lies in
``[start, end)`` of one partition. It uses a channel of its own: created over HTTP, moved to
``start`` with ``/channel/setoffset`` and only then subscribed with a four-token
``SUB_ADVANCED`` (``SUB_ORDERED`` on ordered topics). Setting the offset over HTTP rather than
in the SUB line avoids the server quirk that ignores the partition when a start position is
given (docs/protocol.md §3.5), and works whether or not the channel already had a cursor. Every
message is FINed as it arrives: the channel is private, the log is what is replayed, so
acknowledging it only keeps the server from redelivering. The range is complete once a message
ends at or beyond ``end`` (queue offsets are contiguous: ``next = offset + raw_size``);
messages before ``start`` or repeated offsets are skipped, so a range yields the same rows every
time it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from ..config import ConnectionConfig
from ..errors import (
    ClusterError,
    ConnectionClosed,
    DataLoss,
    InvalidArgument,
    NSQError,
    ServerError,
    Timeout,
)
from ..message import CopyFins
from ..model.partitions import fin_at_once, rdy_ceiling, subscription
from ..protocol import commands
from ..protocol.commands import StartPosition
from ..protocol.frames import MessageFrame, MessageLayout
from ..protocol.runs import MessageRun
from ..transport.connection import Connection
from ..transport.loop_thread import LoopThread
from .cluster import ClusterClient, LeaderInfo, temporary_channel

__all__ = ["MAX_BUFFERED", "RangeReader", "offset_at", "read_range", "read_range_batches"]

log = logging.getLogger("smartnsq.spark")


MAX_BUFFERED = 8 * 1024 * 1024  # bytes a reader holds before it stops FINing
_MESSAGE_COST = 256  # bytes a buffered Message costs beside its body (the object, its id)


def _not_open(data: bytes) -> None:
    raise RuntimeError("the range reader is not open")


class RangeReader:
    """Reads ``[start, end)`` of one partition over one connection; lives on the event loop.

    ``limit`` stops after that many messages (used to find the end of a rate-limited range);
    ``next_end`` is then the queue offset just after the last message read.

    What it holds is bounded: past ``max_buffered`` bytes not yet taken by :meth:`next_batch`
    (bodies and a per-message cost), it keeps the FINs of what it reads until they are taken,
    and the server, whose in-flight window is then full (RDY messages; one on an ordered
    channel), sends no more; a held message the server redelivers after its ``msg_timeout``
    stays held. So a reader never holds more than ``max_buffered`` plus RDY messages, however
    slowly its task takes them (a piece read ahead of the one being yielded, a slow sink).
    """

    def __init__(self, topic: str, partition: int, leader: LeaderInfo, channel: str,
                 start: int, end: int, *, ordered: bool, ext: bool, rdy: int,
                 limit: int | None = None, config: ConnectionConfig | None = None,
                 exact_start: bool = True, fail_on_data_loss: bool = True,
                 max_buffered: int = MAX_BUFFERED) -> None:
        self.topic = topic
        self.partition = partition
        self.leader = leader
        self.channel = channel
        self.start = start
        self.end = end
        self.next_end = start
        self._ordered = ordered
        self._ext = ext
        self._rdy = rdy
        self._limit = limit
        self._count = 0
        self._config = config or ConnectionConfig()
        self._conn: Connection | None = None
        self._send_fin: Callable[[bytes], None] = _not_open  # (open() sets it)
        self._fins: list[bytes] = []  # a plain channel's FINs not written yet (_batch_fin)
        # what next_batch hands over: each chunk's columns appended, the chunk's run dropped
        # (runs kept one a chunk would be eight lists a message on an ordered channel)
        self._ready = MessageRun.empty(ext)
        self._buffered = 0  # what _ready costs: its bodies and _MESSAGE_COST each
        self._max_buffered = max_buffered
        self._held: dict[bytes, None] = {}  # ids of buffered messages not FINed yet, in order
        # copies of messages already read, FINed (see _on_message), whose FINs may be
        # answered E_FIN_FAILED
        self._copy_fins = CopyFins()
        self._read: MessageFrame | None = None  # the message read (kept) last: CopyFins.hold
        self._wake: asyncio.Event | None = None
        self._last = -1
        self._exact_start = exact_start
        self._fail_on_data_loss = fail_on_data_loss
        self._error: BaseException | None = None
        self.gap: int | None = None  # a first message past ``start`` (_check_first)
        self.done = start >= end

    async def open(self) -> None:
        self._wake = asyncio.Event()
        conn = await Connection.connect(self.leader.host, self.leader.tcp_port, self._config,
                                        on_message=self._on_message, on_error=self._on_error,
                                        extend_support=self._ext)
        self._conn = conn
        # the consumer's rule: an ordered FIN is written in the turn it is made
        self._send_fin = conn.send_now if fin_at_once(self._ordered) else self._batch_fin
        # the consumer's rules (smartnsq.model.partitions): SUB_ORDERED on ordered topics, else
        # SUB_ADVANCED for the queue offsets the range needs (the start was set over HTTP);
        # one message in flight on an ordered channel
        sub = subscription(self.topic, self.channel, self.partition, youzan=True,
                           ordered=self._ordered, detail=True)
        await conn.request(sub.data, sub.name)
        conn.layout = MessageLayout.for_subscription(youzan=conn.is_youzan,
                                                     extend_support=self._ext, command=sub.name)
        conn.on_run = self._on_run
        rdy = min(self._rdy, rdy_ceiling(self._ordered, conn.max_rdy_count, self._rdy))
        if self._limit is not None:
            rdy = max(1, min(rdy, self._limit))
        conn.send(commands.rdy(rdy))
        conn.closed.add_done_callback(lambda _: self._wake.set() if self._wake else None)

    def _on_run(self, run: MessageRun) -> None:
        """The messages of one received chunk. When they simply continue the range (after
        the first message, in order, before its end and the limit, within the buffer's
        bound: every chunk of a healthy read) they are taken as they are and FINed in one
        command; anything else goes message by message, as ``_on_message`` decides."""
        n = len(run)
        offsets = run.offsets
        end = run.end_offset
        count = self._count + n
        cost = run.body_bytes() + n * _MESSAGE_COST
        if self.done or self._last < 0 or offsets[0] <= self._last or end > self.end \
                or (self._limit is not None and count > self._limit) \
                or self._buffered + cost > self._max_buffered \
                or self._copy_fins.held is not None or not run.contiguous():
            for message in run.frames():
                self._on_message(message)
            return
        self._ready.extend(run)
        self._buffered += cost
        self._count = count
        self._last = offsets[-1]
        self.next_end = end
        self._read = run.frame(n - 1)
        if end >= self.end or count == self._limit:
            self.done = True
        assert self._wake is not None
        self._wake.set()
        conn = self._conn
        if conn is not None and not conn.is_closed:
            self._send_fin(commands.fins(run.ids))

    def _on_message(self, message: MessageFrame) -> None:
        if self._copy_fins.held is not None:
            self._judge(message)
        if self._keep(message):
            self._read = message
            if self._buffered > self._max_buffered:
                self._held[message.id] = None  # FINed when taken: the server's window fills
                return
        elif message.id in self._held:
            # held past the server's msg_timeout and redelivered: still held. (Or the real
            # server's duplicated first ordered delivery, come while its original is held,
            # unanswered: the server had the original in flight when it sent the copy, so
            # the copy is not in flight; the original's FIN, when it is taken, frees the
            # channel.)
            return
        elif message.queue_offset is not None and message.queue_offset <= self._last:
            # a message already read, again: a redelivery, or the real server's duplicated
            # first delivery on a fresh ordered channel (docs/devcluster.md; every read here
            # uses one). A copy sent after the original's FIN is in flight, and the ordered
            # channel sends nothing else until it is answered (a 60 s stall), so
            # it is FINed; one sent before that FIN was not in flight, and its FIN's
            # E_FIN_FAILED is expected (_on_error)
            self._copy_fins.expect(message.id)
        self._fin(message.id)

    def _on_error(self, error: ServerError) -> None:
        """Error frames that answer no request (the connection's own handling otherwise)."""
        if self._copy_fins.absorbs(error):
            log.debug("%s/%d: %s: the FIN of a message read already, which the server had not "
                      "counted in flight (expected)", self.topic, self.partition, error)
            return
        read = self._read
        if self._ordered and read is not None and self._copy_fins.hold(error, read.id):
            return  # the FIN of the message read last: the next delivery tells (_judge)
        self._report(error)

    def _judge(self, message: MessageFrame) -> None:
        """A delivery after a held refusal: a copy of the message read last (same attempts)
        forgives it, anything else reports it (CopyFins.hold)."""
        read = self._read
        if read is not None and message.id == read.id and message.attempts <= read.attempts \
                and self._copy_fins.forgive(message.id):
            log.debug("%s/%d: the refused FIN of %r was its duplicate delivery's (expected)",
                      self.topic, self.partition, message)
            return
        self._report(self._copy_fins.release())

    def _report(self, error: ServerError | None) -> None:
        if error is not None:
            conn = self._conn
            log.warning("%s: %s", conn.address_text if conn is not None else self.leader.host,
                        error)

    def _fin(self, message_id: bytes) -> None:
        conn = self._conn
        if conn is not None and not conn.is_closed:
            self._send_fin(commands.fin(message_id))

    def _batch_fin(self, fin: bytes) -> None:
        """A plain channel's FIN, written with the others made in the same turn (the
        messages of one received chunk): one write a chunk, not a queued command a message."""
        if not self._fins:
            asyncio.get_running_loop().call_soon(self._write_fins)
        self._fins.append(fin)

    def _write_fins(self) -> None:
        fins, self._fins = self._fins, []
        conn = self._conn
        if fins and conn is not None and not conn.is_closed:
            with contextlib.suppress(ConnectionClosed):  # closing: the channel goes with it
                conn.send_now(b"".join(fins))

    def _keep(self, message: MessageFrame) -> bool:
        """Take in one delivery: True when it joined the buffer."""
        if self.done:
            return False
        offset = message.queue_offset
        raw_size = message.raw_size
        if offset is None or raw_size is None:
            return False  # cannot happen after SUB_ADVANCED/SUB_ORDERED; never guess
        if self._last < 0 and self._exact_start and not self._check_first(offset, raw_size):
            return False
        if offset < self.start or offset <= self._last:
            return False  # before the range, or a redelivery
        if offset < self.end < offset + raw_size:
            self._refuse(InvalidArgument("endingOffsets", f"offset {self.end} of {self.topic}/"
                                         f"{self.partition} is inside the message at {offset} "
                                         f"({raw_size} bytes): give a message's queue_offset, "
                                         f"e.g. {offset} or {offset + raw_size}", self.end))
            return False
        kept = offset < self.end
        if not kept:
            self.done = True
        else:
            self._last = offset
            self._ready.add(message)
            self._buffered += len(message.body) + _MESSAGE_COST
            self._count += 1
            self.next_end = offset + raw_size
            if self.next_end >= self.end or \
                    (self._limit is not None and self._count >= self._limit):
                self.done = True
        assert self._wake is not None
        self._wake.set()
        return kept

    def _check_first(self, offset: int, raw_size: int) -> bool:
        """The first message must start at ``start``: one before it means ``start`` lies
        inside it (refused, never skipped); one after it is refused as ``DataLoss`` with
        ``gap`` set, and ``read_range`` asks the queue's start: retention (``failOnDataLoss``
        decides), or a stray first delivery of a fresh channel, read again. (nsqd moves a
        channel set inside a message on to the next one, which looks like retention here: the
        planner refuses such offsets before any read, ``_Planner.check_boundary``.)"""
        where = f"{self.topic}/{self.partition}"
        if offset < self.start < offset + raw_size:
            self._refuse(InvalidArgument("startingOffsets", f"offset {self.start} of {where} is "
                                         f"inside the message at {offset} ({raw_size} bytes): "
                                         "give a message's queue_offset, e.g. "
                                         f"{offset} or {offset + raw_size}", self.start))
            return False
        if offset > self.start:  # the caller asks the queue's start (read_range: a stray?)
            self.gap = offset
            self._refuse(DataLoss(self.topic, self.partition, self.start, offset))
            return False
        return True

    def _refuse(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self.done = True
        assert self._wake is not None
        self._wake.set()

    async def next_batch(self, timeout: float, *, whole: bool = False) -> MessageRun:
        """Messages read since the last call; waits up to ``timeout`` s for at least one.

        Returns an empty run once the range is complete; raises ``Timeout`` when nothing arrives in
        time and ``ConnectionClosed`` when the connection dies before the end. ``whole``
        waits for the whole range instead (``timeout`` then bounds each wait for the next
        message): one hand-over to the calling thread per range rather than one per message
        or two, which is what an ordered channel's one-in-flight delivery would cost; it
        returns early with what is buffered once that reaches ``max_buffered``.
        """
        assert self._wake is not None
        while (not self._ready.ids or (whole and self._buffered <= self._max_buffered)) \
                and not self.done:
            conn = self._conn
            if conn is not None and conn.is_closed:
                raise ConnectionClosed(
                    f"connection to {self.leader.tcp_address} closed while reading "
                    f"{self.topic}/{self.partition} [{self.start}, {self.end}) at "
                    f"{self.next_end}: {conn.close_reason}")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                raise Timeout(f"no message from {self.leader.tcp_address} for {timeout:g}s "
                              f"while reading {self.topic}/{self.partition} "
                              f"[{self.start}, {self.end}) at {self.next_end}") from None
        if self._error is not None:
            raise self._error
        batch, self._ready = self._ready, MessageRun.empty(self._ext)
        self._buffered = 0
        held, self._held = self._held, {}
        for message_id in held:  # taken: the server may send more
            self._fin(message_id)
        return batch

    async def close(self) -> None:
        self._write_fins()
        self._report(self._copy_fins.release())
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def read_range(loop_thread: LoopThread, client: ClusterClient, topic: str, partition: int,
               leader: LeaderInfo, start: int, end: int, *, ordered: bool, ext: bool,
               rdy: int, read_timeout: float, channel: str | None, channel_prefix: str,
               limit: int | None = None, on_end: Callable[[int], None] | None = None,
               fail_on_data_loss: bool = True) -> Iterator[MessageFrame]:
    """Yield the messages of ``[start, end)`` in queue order (blocking; see the module doc).

    ``channel`` names a fixed channel to read with (kept); ``None`` uses a temporary one,
    deleted when the read ends. ``on_end(next_end)`` receives the offset after the last
    message read (with ``limit``: where the limited range ends).
    """
    for batch in read_range_batches(loop_thread, client, topic, partition, leader, start, end,
                                    ordered=ordered, ext=ext, rdy=rdy,
                                    read_timeout=read_timeout, channel=channel,
                                    channel_prefix=channel_prefix, limit=limit, on_end=on_end,
                                    fail_on_data_loss=fail_on_data_loss):
        yield from batch.frames()


def read_range_batches(loop_thread: LoopThread, client: ClusterClient, topic: str,
                       partition: int, leader: LeaderInfo, start: int, end: int, *,
                       ordered: bool, ext: bool, rdy: int, read_timeout: float,
                       channel: str | None, channel_prefix: str, limit: int | None = None,
                       on_end: Callable[[int], None] | None = None,
                       fail_on_data_loss: bool = True) -> Iterator[MessageRun]:
    """:func:`read_range` as the non-empty runs :meth:`RangeReader.next_batch` hands over:
    a task's loop then costs per hand-over, not per message."""
    if start >= end:
        if on_end is not None:
            on_end(start)
        return
    name = channel or temporary_channel(channel_prefix)
    client.create_channel(topic, partition, leader, name)
    reader: RangeReader | None = None
    try:
        client.set_offset(topic, partition, leader, name, start)
        reader = RangeReader(topic, partition, leader, name, start, end, ordered=ordered,
                             ext=ext, rdy=rdy, limit=limit, config=client.connection_config,
                             fail_on_data_loss=fail_on_data_loss)
        loop_thread.run(reader.open(), timeout=read_timeout + 5)
        while True:
            try:
                batch = loop_thread.run(reader.next_batch(read_timeout),
                                        timeout=read_timeout + 5)
            except DataLoss:
                first = start if reader.gap is None else client.bounds(topic, partition,
                                                                       leader)[0]
                if first <= start:  # the queue has them: the delivery strayed, not the data
                    raise ClusterError(
                        f"{topic}/{partition}: the first message delivered was at {reader.gap}"
                        f", past the start {start}, although the queue starts at {first}: a "
                        "stray first delivery of a fresh channel; read again",
                        transient=True) from None
                if fail_on_data_loss:
                    raise
                log.warning("%s/%d: offsets %d..%d are no longer in the queue; skipped "
                            "(failOnDataLoss=false)", topic, partition, start, first)
                yield from read_range_batches(
                    loop_thread, client, topic, partition, leader, first, end,
                    ordered=ordered, ext=ext, rdy=rdy, read_timeout=read_timeout,
                    channel=channel, channel_prefix=channel_prefix, limit=limit,
                    on_end=on_end, fail_on_data_loss=True)
                return
            if not batch:
                break
            yield batch
        if on_end is not None:
            on_end(reader.next_end)
    finally:
        if reader is not None and loop_thread.running:
            with contextlib.suppress(Exception):
                loop_thread.run(reader.close(), timeout=10)
        if channel is None:
            try:
                client.delete_channel(topic, partition, leader, name)
            except NSQError as exc:
                log.warning("could not delete the temporary channel %s of %s/%d: %s", name,
                            topic, partition, exc)


def offset_at(loop_thread: LoopThread, client: ClusterClient, topic: str, partition: int,
              leader: LeaderInfo, position: StartPosition, end: int, *, ordered: bool,
              ext: bool, read_timeout: float, channel_prefix: str) -> int:
    """The queue offset of the message a start position names (``timestamp:T``,
    ``msgcount:N``): always a message boundary, or ``end`` when there is no such message
    before ``end``.

    ``/channel/setoffset`` with that position on a temporary channel, then the first message
    the channel delivers tells its offset.
    """
    name = temporary_channel(channel_prefix)
    client.create_channel(topic, partition, leader, name)
    reader: RangeReader | None = None
    try:
        client.set_position(topic, partition, leader, name, position)
        if client.channel_depth(topic, partition, leader, name) == 0:
            return end
        reader = RangeReader(topic, partition, leader, name, 0, end, ordered=ordered, ext=ext,
                             rdy=1, limit=1, config=client.connection_config,
                             exact_start=False)
        loop_thread.run(reader.open(), timeout=read_timeout + 5)
        batch = loop_thread.run(reader.next_batch(read_timeout), timeout=read_timeout + 5)
        return min(batch.offsets[0], end) if batch else end
    finally:
        if reader is not None and loop_thread.running:
            with contextlib.suppress(Exception):
                loop_thread.run(reader.close(), timeout=10)
        try:
            client.delete_channel(topic, partition, leader, name)
        except NSQError as exc:
            log.warning("could not delete the temporary channel %s of %s/%d: %s", name,
                        topic, partition, exc)
