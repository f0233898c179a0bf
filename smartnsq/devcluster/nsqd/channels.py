"""Channels of the dev cluster's nsqd: cursors over a partition log, in-flight messages, requeues.

A channel lives in the shared :class:`~smartnsq.devcluster.state.PartitionInfo` (its
``channels`` dict), not in a node, so it survives a leader move or a node restart as the real
cluster's replicated channel offsets do. Consumers are the subscribed connections of whichever
node serves the partition now.

What is delivered, and when (docs/protocol.md §3.5, §3.6, §4.4 and the captures):

* a channel reads its partition log from a cursor; requeued messages (REQ, timeouts, a
  youzan consumer that went away) go out before the cursor moves on;
* each consumer gets at most RDY messages in flight; youzan lowers the effective RDY of a
  consumer whose FIN/REQ failures and timeouts pile up (``RDY - score + 5`` from a score of 5);
* an ordered channel (ordered topic, or ``SUB_ORDERED``) has one message in flight across all
  its consumers, whatever their RDY;
* with ``first_twice`` (``NsqdOptions.ordered_first_delivery_twice``) the first ``SUB_ORDERED``
  of a channel with a backlog delivers its first message twice, as the real server does
  (:mod:`smartnsq.devcluster.nsqd.first_twice`: where the copy falls is the mode);
* every in-flight message expires ``msg_timeout`` after delivery (TOUCH restarts the clock)
  and is redelivered with ``attempts + 1``;
* on ext topics a message tagged ``##client_dispatch_tag = T`` goes to consumers with
  ``desired_tag = T`` while any is subscribed; tagged consumers get only their tag;
* a consumer's ``ext_filter`` and ``sample_rate`` drop messages it is not sent: they count as
  consumed.

Nothing runs per message but the dispatch itself: one wake-up per event-loop iteration
(``schedule_pump``), one expiry timer per consumer (its in-flight dict is in deadline order,
so only the front is ever checked) and one timer per channel for deferred messages.
"""

from __future__ import annotations

import asyncio
import fnmatch
import heapq
import itertools
import json
import logging
import random
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from ..state import PartitionInfo, StoredMessage
from .first_twice import FirstTwice
from .options import first_twice_mode

__all__ = ["Channel", "Consumer", "Entry", "ExtFilter"]

log = logging.getLogger("smartnsq.devcluster.channels")

SLOW_DOWN_THRESHOLD = 5  # youzan's client error score from which RDY is lowered
MAX_PARKED = 1000  # messages read ahead for other dispatch groups before a group waits


class Entry:
    """One delivery candidate: a stored message and how often it was delivered already."""

    __slots__ = ("attempts", "deadline", "msg")

    def __init__(self, msg: StoredMessage, attempts: int = 0) -> None:
        self.msg = msg
        self.attempts = attempts
        self.deadline = 0.0


class ExtFilter:
    """youzan's per-consumer ext header filter (``IDENTIFY ext_filter``, ``nsqd/ext_filter.go``).

    Types: 1 exact, 2 regexp, 3 glob, 4 multi-exact (``filter_ext_key`` ``any`` or ``all``
    over ``filter_data_list``); ``inverse`` flips the result.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.kind = int(spec.get("type", 0))
        self.inverse = bool(spec.get("inverse", False))
        self.key = str(spec.get("filter_ext_key", ""))
        self.data = str(spec.get("filter_data", ""))
        self.pairs = [(str(item.get("filter_ext_key", "")), str(item.get("filter_data", "")))
                      for item in spec.get("filter_data_list") or () if isinstance(item, dict)]
        if self.kind not in (1, 2, 3, 4):
            raise ValueError(f"unknown ext filter type {self.kind}")
        self._regex = re.compile(self.data) if self.kind == 2 else None
        if self.kind == 4 and self.key not in ("any", "all"):
            raise ValueError("multi filter needs filter_ext_key any or all")

    def matches(self, msg: StoredMessage) -> bool:
        headers = _headers(msg)
        matched = self._match(headers)
        return not matched if self.inverse else matched

    def _match(self, headers: dict[str, Any]) -> bool:
        if self.kind == 4:
            results = (str(headers[k]) == v if k in headers else False for k, v in self.pairs)
            return any(results) if self.key == "any" else all(results)
        if self.key not in headers:
            return False
        value = str(headers[self.key])
        if self.kind == 1:
            return value == self.data
        if self.kind == 2:
            assert self._regex is not None
            return self._regex.search(value) is not None
        return fnmatch.fnmatchcase(value, self.data)


def _headers(msg: StoredMessage) -> dict[str, Any]:
    if not msg.ext:
        return {}
    try:
        value = json.loads(msg.ext)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Consumer:
    """One subscribed connection as its channel sees it.

    ``deliver(entry)`` writes the message frame (the connection's business); everything about
    in-flight bookkeeping stays here so that a classic consumer's messages can keep timing
    out after its connection is gone, as on classic nsqd.
    """

    __slots__ = ("_timer", "channel", "closing", "deliver", "err_score", "ext_filter", "gone",
                 "in_flight", "msg_timeout", "rdy", "sample_rate", "stats", "tag", "youzan")

    def __init__(self, deliver: Callable[[Entry], None], *, msg_timeout: float,
                 tag: str = "", youzan: bool = True, ext_filter: ExtFilter | None = None,
                 sample_rate: int = 0) -> None:
        self.deliver = deliver
        self.msg_timeout = msg_timeout  # seconds
        self.tag = tag
        self.youzan = youzan
        self.ext_filter = ext_filter
        self.sample_rate = sample_rate
        self.rdy = 0
        self.closing = False
        self.gone = False
        self.err_score = 0
        self.in_flight: dict[int, Entry] = {}  # internal id -> entry, in deadline order
        self.channel: Channel | None = None
        self._timer: asyncio.TimerHandle | None = None
        # message_count, finish_count, requeue_count, timeout_count
        self.stats = [0, 0, 0, 0]

    def ready(self) -> bool:
        if self.closing or self.gone:
            return False
        rdy = self.rdy
        if rdy > 1 and self.err_score >= SLOW_DOWN_THRESHOLD:
            rdy = max(1, rdy - self.err_score + SLOW_DOWN_THRESHOLD)
        return len(self.in_flight) < rdy

    def failed(self) -> None:
        """A FIN/REQ that found nothing in flight, or a timeout: youzan slows the client down."""
        if self.youzan:
            self.err_score += 1

    def succeeded(self) -> None:
        if self.youzan and self.err_score > 0:
            self.err_score = max(0, self.err_score - 2)

    def skips(self, msg: StoredMessage, ext_topic: bool) -> bool:
        """Dropped for this consumer by its ext filter or sample rate (auto-acknowledged)."""
        if self.sample_rate > 0 and random.randrange(100) > self.sample_rate:
            return True
        return self.ext_filter is not None and ext_topic and not self.ext_filter.matches(msg)

    # -- expiry ---------------------------------------------------------------------------------

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is None and self.in_flight:
            first = next(iter(self.in_flight.values()))
            self._timer = loop.call_at(first.deadline, self._expire, loop)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        channel = self.channel
        if channel is None:
            return
        now = loop.time()
        expired = []
        for key, entry in self.in_flight.items():
            if entry.deadline > now:
                break
            expired.append(key)
        for key in expired:
            channel.timed_out(self, key)
        self.arm(loop)


class Channel:
    """One channel of one partition (or of a classic node's topic).

    ``start`` is the log index consumption begins at; by default youzan channels start at
    the log's end and a classic topic's first channel takes the messages the topic kept
    while it had none.
    """

    def __init__(self, partition: PartitionInfo, name: str, *, ordered_topic: bool = False,
                 ext: bool = False, classic: bool = False, start: int | None = None,
                 first_twice: bool | str = False) -> None:
        self.partition = partition
        self.log = partition.log
        self.name = name
        self.topic_ordered = ordered_topic
        self.ordered = ordered_topic
        self.ext = ext
        self.classic = classic
        self.ephemeral = name.endswith("#ephemeral")
        # the real server's duplicate first ordered delivery: "" (off) or FIRST_TWICE_MODES
        self.twice = FirstTwice(self, first_twice_mode(first_twice))
        if start is None:
            fresh = classic and not partition.channels
            start = self.log.claimed if fresh else len(self.log)
        self.cursor = start
        self.queues: dict[str, deque[Entry]] = {}  # requeued / read-ahead, by dispatch group
        self.queued = 0
        self.deferred: list[tuple[float, int, Entry]] = []
        self._seq = itertools.count()
        self.consumers: list[Consumer] = []
        self.lingering: set[Consumer] = set()  # classic: gone, messages still in flight
        self.tag_counts: dict[str, int] = {}
        self.in_flight = 0
        self.paused = False
        self.closed = False
        # counters as /stats reports them
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.finish_count = 0
        self._rr = 0
        self._pump_scheduled = False
        self._deferred_timer: asyncio.TimerHandle | None = None
        self._deferred_at = 0.0
        if classic:
            self.log.claimed = len(self.log)
        self.log.watchers.append(self._on_append)

    def __repr__(self) -> str:
        return (f"<Channel {self.partition.topic}/{self.partition.partition}/{self.name} "
                f"cursor={self.cursor}/{len(self.log)} in_flight={self.in_flight}>")

    # -- shape ----------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages waiting: unread, requeued and deferred (in-flight ones not included)."""
        return max(0, len(self.log) - self.cursor) + self.queued + len(self.deferred)

    @property
    def deferred_count(self) -> int:
        return len(self.deferred)

    def close(self) -> None:
        """The channel is deleted: stop its timers and forget its consumers' messages."""
        self.closed = True
        self.twice.clear()
        if self._on_append in self.log.watchers:
            self.log.watchers.remove(self._on_append)
        if self._deferred_timer is not None:
            self._deferred_timer.cancel()
        for consumer in [*self.consumers, *self.lingering]:
            consumer.disarm()
            consumer.in_flight.clear()
            consumer.channel = None
        self.consumers.clear()
        self.lingering.clear()

    def set_ordered(self, ordered: bool) -> None:
        if ordered:
            self.twice.sub_ordered(self.depth > 0)
        self.ordered = ordered or self.topic_ordered

    # -- consumers ------------------------------------------------------------------------------

    def add(self, consumer: Consumer) -> None:
        consumer.channel = self
        self.consumers.append(consumer)
        if consumer.tag:
            self.tag_counts[consumer.tag] = self.tag_counts.get(consumer.tag, 0) + 1

    def remove(self, consumer: Consumer, *, requeue: bool) -> None:
        """The consumer's connection is gone.

        youzan requeues its in-flight messages at once (``RequeueClientMessages``); classic
        nsqd leaves them in flight until they time out (``requeue=False``).
        """
        consumer.gone = True
        self.twice.gone(consumer)
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if consumer.tag:
                left = self.tag_counts.get(consumer.tag, 1) - 1
                if left > 0:
                    self.tag_counts[consumer.tag] = left
                else:
                    self.tag_counts.pop(consumer.tag, None)
                    self._ungroup(consumer.tag)
        if requeue or self.closed:
            consumer.disarm()
            for entry in consumer.in_flight.values():
                self.in_flight -= 1
                self._requeue(entry)
            consumer.in_flight.clear()
            consumer.channel = None
        elif consumer.in_flight:
            self.lingering.add(consumer)
        else:
            consumer.disarm()
            consumer.channel = None
        if self.ephemeral and not self.consumers and not self.lingering and not self.closed:
            self.partition.channels.pop(self.name, None)
            self.close()
            return
        self.schedule_pump()

    def _ungroup(self, tag: str) -> None:
        """The last consumer of a tag left: its waiting messages go to the untagged pool."""
        waiting = self.queues.pop(tag, None)
        if waiting:
            self.queues.setdefault("", deque()).extendleft(reversed(waiting))

    # -- dispatch -------------------------------------------------------------------------------

    def _on_append(self) -> None:
        if self.classic:
            self.log.claimed = len(self.log)
        self.schedule_pump()

    def schedule_pump(self) -> None:
        """Dispatch at the end of this event-loop iteration (coalesces bursts of changes)."""
        if self._pump_scheduled or self.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, hence no connected consumer to wake
        self._pump_scheduled = True
        loop.call_soon(self.pump)

    def pump(self) -> None:
        """Hand waiting messages to ready consumers, round robin."""
        self._pump_scheduled = False
        if self.paused or self.closed or not self.consumers:
            return
        consumers = self.consumers
        loop = asyncio.get_running_loop()
        exhausted: set[str] = set()
        while True:
            if self.ordered and self.in_flight >= 1:
                return
            n = len(consumers)
            chosen = None
            for i in range(n):
                candidate = consumers[(self._rr + i) % n]
                if candidate.tag not in exhausted and candidate.ready():
                    chosen = candidate
                    self._rr = (self._rr + i + 1) % n
                    break
            if chosen is None:
                return
            entry = self._next(chosen.tag, loop)
            if entry is None:
                exhausted.add(chosen.tag)
                continue
            if chosen.skips(entry.msg, self.ext):
                self.finish_count += 1
                continue
            self._send(chosen, entry, loop)

    def _group(self, msg: StoredMessage) -> str:
        tag = msg.tag
        return tag if tag and tag in self.tag_counts else ""

    def _next(self, group: str, loop: asyncio.AbstractEventLoop) -> Entry | None:
        queue = self.queues.get(group)
        if queue:
            self.queued -= 1
            return queue.popleft()
        messages = self.log.messages
        now = 0.0
        self.cursor = max(self.cursor, self.log.retained)
        while self.cursor < len(messages):
            msg = messages[self.cursor]
            self.cursor += 1
            entry = Entry(msg)
            if msg.deliver_after:
                now = now or loop.time()
                if msg.deliver_after > now:
                    self._defer(entry, msg.deliver_after, loop)
                    continue
            target = self._group(msg) if self.tag_counts else ""
            if target == group:
                return entry
            self.queues.setdefault(target, deque()).append(entry)
            self.queued += 1
            if self.queued >= MAX_PARKED:
                return None
        return None

    def _send(self, consumer: Consumer, entry: Entry, loop: asyncio.AbstractEventLoop) -> None:
        entry.attempts += 1
        entry.deadline = loop.time() + consumer.msg_timeout
        consumer.in_flight[entry.msg.internal_id] = entry
        self.in_flight += 1
        self.message_count += 1
        consumer.stats[0] += 1
        consumer.arm(loop)
        consumer.deliver(entry)
        if self.twice.due and self.ordered:
            self.twice.sent(consumer, entry, loop)

    def _requeue(self, entry: Entry) -> None:
        group = self._group(entry.msg) if self.tag_counts else ""
        self.queues.setdefault(group, deque()).append(entry)
        self.queued += 1

    # -- consumer commands ------------------------------------------------------------------

    def _take(self, consumer: Consumer, key: int) -> Entry | None:
        entry = consumer.in_flight.pop(key, None)
        if entry is None:
            return None
        self.in_flight -= 1
        if consumer.gone and not consumer.in_flight:
            self.lingering.discard(consumer)
            consumer.disarm()
        if self.twice.late is not None:
            self.twice.taken(entry)
        return entry

    def send_copy(self, entry: Entry) -> None:
        """The duplicated first delivery's copy of ``entry`` goes out next, first in line,
        with the same attempts (``_send`` counts the delivery again), and is in flight like
        any delivery."""
        group = self._group(entry.msg) if self.tag_counts else ""
        self.queues.setdefault(group, deque()).appendleft(Entry(entry.msg, entry.attempts - 1))
        self.queued += 1
        self.schedule_pump()

    def finish(self, consumer: Consumer, key: int) -> bool:
        """FIN: False when the message is not in flight for this consumer."""
        if self._take(consumer, key) is None:
            consumer.failed()
            self.twice.refused(consumer, key)
            return False
        self.finish_count += 1
        consumer.stats[1] += 1
        consumer.succeeded()
        self.schedule_pump()
        return True

    def requeue(self, consumer: Consumer, key: int, delay: float) -> bool:
        """REQ: back in the queue now (``delay`` 0) or after ``delay`` seconds."""
        entry = self._take(consumer, key)
        if entry is None:
            consumer.failed()
            self.twice.refused(consumer, key)
            return False
        self.requeue_count += 1
        consumer.stats[2] += 1
        if delay > 0:
            loop = asyncio.get_running_loop()
            self._defer(entry, loop.time() + delay, loop)
        else:
            self._requeue(entry)
        self.schedule_pump()
        return True

    def touch(self, consumer: Consumer, key: int) -> bool:
        """TOUCH: the in-flight clock restarts at the consumer's ``msg_timeout``."""
        entry = consumer.in_flight.pop(key, None)
        if entry is None:
            return False
        entry.deadline = asyncio.get_running_loop().time() + consumer.msg_timeout
        consumer.in_flight[key] = entry  # moved to the end: the dict stays in deadline order
        return True

    def timed_out(self, consumer: Consumer, key: int) -> None:
        entry = self._take(consumer, key)
        if entry is None:
            return
        self.timeout_count += 1
        consumer.stats[3] += 1
        consumer.failed()
        self._requeue(entry)
        self.schedule_pump()

    # -- deferred messages ----------------------------------------------------------------------

    def _defer(self, entry: Entry, due: float, loop: asyncio.AbstractEventLoop) -> None:
        heapq.heappush(self.deferred, (due, next(self._seq), entry))
        if self._deferred_timer is None or due < self._deferred_at:
            if self._deferred_timer is not None:
                self._deferred_timer.cancel()
            self._deferred_at = due
            self._deferred_timer = loop.call_at(due, self._release, loop)

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deferred_timer = None
        now = loop.time()
        deferred = self.deferred
        while deferred and deferred[0][0] <= now:
            _, _, entry = heapq.heappop(deferred)
            self._requeue(entry)
        if deferred:
            self._deferred_at = deferred[0][0]
            self._deferred_timer = loop.call_at(self._deferred_at, self._release, loop)
        self.schedule_pump()

    # -- positions ------------------------------------------------------------------------------

    def reset_to(self, index: int) -> None:
        """Move the cursor (SUB_ADVANCED start, /channel/setoffset): waiting requeues go."""
        self.cursor = max(0, min(index, len(self.log)))
        self.twice.clear()  # what was read ahead goes with the reset
        self.queues.clear()
        self.queued = 0
        self.deferred.clear()
        if self._deferred_timer is not None:
            self._deferred_timer.cancel()
            self._deferred_timer = None
        self.schedule_pump()

    def empty(self) -> None:
        """``/channel/empty``: everything waiting is dropped, in-flight messages included."""
        for consumer in [*self.consumers, *self.lingering]:
            self.in_flight -= len(consumer.in_flight)
            consumer.in_flight.clear()
            consumer.disarm()
        self.lingering.clear()
        self.reset_to(len(self.log))

    def search(self, kind: str, value: int) -> int:
        """The log index a start position names; ``ValueError`` with the reason otherwise."""
        log_ = self.log
        if kind == "special":
            if value != -1:
                raise ValueError("not supported offset type")
            return len(log_)
        if kind == "virtual_queue":
            index = log_.index_at_offset(value)
            if index is None:
                raise ValueError(f"the queue offset {value} is out of range "
                                 f"[0, {log_.end_offset}]")
            if index < len(log_) and log_.messages[index].queue_offset < value:
                # inside a message: the real nsqd goes on at the next one (measured on
                # 0.3.7-HA.1.13.0: the depth drops by one, the next message is delivered)
                index += 1
            return index
        if kind == "msgcount":
            if not 0 <= value <= len(log_):
                raise ValueError(f"the message count {value} is out of range "
                                 f"[0, {len(log_)}]")
            return value
        if kind == "timestamp":
            return log_.index_at_time(value * 1_000_000_000)
        raise ValueError("not supported offset type")
