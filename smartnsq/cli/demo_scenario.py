"""The scenario of ``smartnsq demo`` (its arguments are :mod:`smartnsq.cli.demo`): partitioned,
ordered, traced NSQ in one command, verified end to end.

What it does, on an embedded dev cluster (3 youzan nsqd, 2 nsqlookupd) or, with
``--cluster``, on a real one:

1. creates an ordered topic (``<prefix>_orders``, 4 partitions, 2 replicas) and a plain one
   (``<prefix>_audit``, 2 partitions);
2. publishes order events (created, paid, packed, ...) for a few hundred order ids, sharded by
   order id, the events of one order in order, interleaved across orders as a shop would,
   one in fifty orders traced (trace id = order id); every completed order also writes an
   audit record to the plain topic (unsharded, round-robin);
3. consumes both topics, the orders with ordered consumption (SUB_ORDERED), checking for each
   order id that its events arrive once and in order;
4. moves a partition's leader to another node in the middle of the stream (embedded cluster
   only) and measures how long publishing and consumption of that partition paused;
5. prints a table per partition, the failover pause, throughput and latency, and a few trace
   lines that follow one message from its publish receipt to its delivery.

The exit status is 0 only when every event arrived exactly once (a redelivery of a message
whose FIN could not reach the old leader is at-least-once working as designed and is counted,
not failed) and in order per order id, and every audit record arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..errors import TopicNotFound
from .tables import format_table
from .util import CLIError, Progress, bar, split_addresses

__all__ = ["DemoOptions", "DemoReport", "run_cli", "run_demo"]

EVENTS = ("created", "paid", "packed", "shipped", "out_for_delivery", "delivered", "reviewed",
          "closed")
FIRST_ORDER_ID = 100_001
TRACE_EVERY = 50  # one order in this many is traced
BATCH = 64  # events per MPUB


def event_name(seq: int) -> str:
    return EVENTS[seq] if seq < len(EVENTS) else f"update_{seq}"


@dataclass
class DemoOptions:
    """The demo's knobs (the ``smartnsq demo`` options)."""

    orders: int = 300
    events: int = 5
    duration: float = 4.0
    cluster: list[str] | None = None
    topic_prefix: str = "smartnsq_demo"
    partitions: int = 4
    failover: bool = True
    progress: bool | None = None
    seed: int = 7
    timeout: float = 10.0
    create_timeout: float = 120.0
    json: bool = False

    def check(self) -> None:
        if not 1 <= self.orders <= 1_000_000:
            raise CLIError("--orders must be in 1..1000000")
        if not 1 <= self.events <= 1000:
            raise CLIError("--events must be in 1..1000")
        if not 0 <= self.duration <= 3600:
            raise CLIError("--duration must be in 0..3600 seconds")
        if not 1 <= self.partitions <= 64:
            raise CLIError("--partitions must be in 1..64")
        if not 1 <= self.create_timeout <= 3600:
            raise CLIError("--create-timeout must be in 1..3600 seconds")


@dataclass
class _PartitionReport:
    published: int = 0
    consumed: int = 0
    redelivered: int = 0
    keys: set[int] = field(default_factory=set)
    leaders: list[str] = field(default_factory=list)  # publish-side leaders, in order seen
    nodes: list[str] = field(default_factory=list)  # nodes delivering, in order seen
    order_errors: int = 0


@dataclass
class _Traced:
    order: int
    seq: int
    published_at: float = 0.0
    pub_partition: int | None = None
    pub_node: str = ""
    internal_id: int | None = None
    delivered_at: float = 0.0
    sub_partition: int | None = None
    sub_node: str = ""
    sub_internal_id: int | None = None
    queue_offset: int | None = None
    attempts: int = 0


@dataclass
class DemoReport:
    """What the demo measured; ``ok`` is the verdict behind the exit status."""

    total: int = 0
    published: int = 0
    consumed: int = 0
    redelivered: int = 0
    duplicates: int = 0
    order_errors: int = 0
    wrong_partition: int = 0
    missing: int = 0
    audit_expected: int = 0
    audit_received: int = 0
    audit_duplicates: int = 0
    foreign: int = 0
    partitions: dict[int, _PartitionReport] = field(default_factory=dict)
    failover_partition: int | None = None
    failover_at: float | None = None
    failover_from: str = ""
    failover_to: str = ""
    publish_pause: float | None = None
    consume_pause: float | None = None
    failover_note: str = ""
    publish_seconds: float = 0.0
    consume_seconds: float = 0.0
    total_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    traced: dict[tuple[int, int], _Traced] = field(default_factory=dict)
    cluster: str = ""
    orders_topic: str = ""
    audit_topic: str = ""
    channel: str = ""
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (not self.timed_out and self.published == self.total
                and self.consumed == self.total and self.duplicates == 0
                and self.order_errors == 0 and self.wrong_partition == 0
                and self.audit_received == self.audit_expected
                and self.audit_duplicates == 0 and not self.problems)


# -- the cluster the demo runs on ------------------------------------------------------------

class _Lab:
    """Where the demo runs: creates its topics (through ``smartnsq.admin``, on either kind of
    cluster the same way), and moves leaders when it can."""

    lookupd: list[str]
    description: str
    can_move_leaders = False

    def __init__(self, timeout: float, create_timeout: float, err: TextIO,
                 progress: bool | None) -> None:
        self.timeout = timeout
        self.create_timeout = create_timeout
        self.err = err
        self.progress = progress

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def create_topic(self, name: str, partitions: int, replicas: int, ordered: bool,
                           channel: str) -> None:
        """Create ``name`` unless it exists as wanted, and return once every partition has a
        leader and is writable: a real cluster gives leaders only after its cluster check,
        which a re-sent create triggers (docs/protocol.md §10.1), so the wait is ``create_topic``'s
        with ``wait=True``, shown as it goes."""
        from ..admin import AsyncAdmin
        from ..errors import NSQError

        async with AsyncAdmin(self.lookupd, timeout=self.timeout) as admin:
            try:
                view = await admin.lookup(name, "r")
            except TopicNotFound:
                view = None
            except NSQError as exc:
                raise CLIError(f"looking up {name}: {exc}") from None
            if view is not None and not view.youzan and view.producers:
                raise CLIError(f"{name}: the demo needs a youzan cluster (lookupd answered "
                               "without partitions)")
            if view is not None and view.meta is not None and view.meta.known:
                if ordered and not view.ordered:
                    raise CLIError(f"topic {name} exists and is not ordered; use another "
                                   "--topic-prefix")
                if view.partition_num != partitions:
                    raise CLIError(f"topic {name} exists with {view.partition_num} partitions, "
                                   f"not {partitions}; use another --topic-prefix")
            shown = _CreationShown(self.err, self.progress)
            try:
                await admin.create_topic(name, partitions, replicas, ordered=ordered,
                                         channels=[channel], timeout=self.create_timeout,
                                         progress=shown.update)
            except NSQError as exc:
                raise CLIError(f"creating topic {name}: {exc}") from None
            finally:
                shown.done()

    def move_leader(self, topic: str, partition: int) -> tuple[str, str]:
        raise NotImplementedError


class _CreationShown:
    """Topic creation progress on stderr: a live line on a terminal, else a line each time
    the state changes (a real cluster can take a minute; silence would look like a hang)."""

    def __init__(self, err: TextIO, enabled: bool | None) -> None:
        self.line = Progress(enabled, stream=err)
        self.err = err
        self.last = ""
        self.started = time.monotonic()

    def update(self, state: Any) -> None:
        text = f"creating topic {state.describe()}"
        if self.line.enabled:
            self.line.update(text)
            return
        summary = text.rsplit(" after ", 1)[0]
        # quiet when creation is quick; past a second, every change gets a line
        if summary != self.last and time.monotonic() - self.started > 1.0:
            self.err.write(text + "\n")
            self.err.flush()
            self.last = summary

    def done(self) -> None:
        self.line.done()


class _Embedded(_Lab):
    can_move_leaders = True

    def __init__(self, *args: Any) -> None:
        from ..devcluster.cluster import DevCluster

        super().__init__(*args)
        self.cluster = DevCluster(nodes=3, lookupds=2)

    async def start(self) -> None:
        await self.cluster.start()
        self.lookupd = list(self.cluster.lookupd_http_addresses)
        self.description = (f"embedded dev cluster: {len(self.cluster.lookupds)} nsqlookupd "
                            f"({', '.join(self.lookupd)}), {len(self.cluster.nodes)} nsqd "
                            f"({', '.join(self.cluster.nsqd_tcp_addresses)})")

    async def close(self) -> None:
        await self.cluster.stop()

    def _address(self, node: Any) -> str:
        return self.cluster.node_info(node).tcp_address

    def move_leader(self, topic: str, partition: int) -> tuple[str, str]:
        old = self.cluster.leader_of(topic, partition)
        new = self.cluster.move_leader(topic, partition)
        return (self._address(old) if old is not None else "?",
                self._address(new) if new is not None else "?")


class _Remote(_Lab):
    """A real youzan cluster: topics are created through its leader lookupd if missing."""

    def __init__(self, lookupd: list[str], *args: Any) -> None:
        super().__init__(*args)
        self.lookupd = lookupd
        self.description = f"cluster at {', '.join(lookupd)}"


# -- the run -----------------------------------------------------------------------------------

class _Demo:
    def __init__(self, options: DemoOptions, lab: _Lab, out: TextIO, err: TextIO) -> None:
        from ..model.sharding import murmur3_partition

        self.o = options
        self.lab = lab
        self.out = out
        self.progress = Progress(options.progress, stream=err)
        self.route = murmur3_partition
        self.report = DemoReport(total=options.orders * options.events,
                                 audit_expected=options.orders)
        self.run_id = f"{int(time.time() * 1000) % 100_000_000:08d}"
        prefix = options.topic_prefix
        self.orders_topic = f"{prefix}_orders"
        self.audit_topic = f"{prefix}_audit"
        self.channel = "demo" if isinstance(lab, _Embedded) else f"demo_{self.run_id}"
        self.t0 = 0.0
        # consumer-side state per order: last seq seen, and the internal id it came with
        self.last_seq: dict[int, int] = {}
        self.last_id: dict[int, int] = {}
        self.audit_seen: set[int] = set()
        self.done = asyncio.Event()
        self.first_delivery: float | None = None
        self.last_delivery = 0.0
        self.acked_after_move: float | None = None
        self.delivered_after_move: float | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- stream --------------------------------------------------------------------------------

    def stream(self) -> list[tuple[int, int]]:
        """(order id, seq) in publish order: orders interleave, each order's events in order."""
        rng = random.Random(self.o.seed)
        slots = [FIRST_ORDER_ID + i for i in range(self.o.orders) for _ in range(self.o.events)]
        rng.shuffle(slots)
        next_seq: dict[int, int] = {}
        out = []
        for order in slots:
            seq = next_seq.get(order, 0)
            next_seq[order] = seq + 1
            out.append((order, seq))
        return out

    def body(self, order: int, seq: int) -> bytes:
        return json.dumps({"run": self.run_id, "order_id": order, "seq": seq,
                           "event": event_name(seq), "at": round(time.time(), 6)},
                          separators=(",", ":")).encode()

    # -- consuming -----------------------------------------------------------------------------

    def on_order(self, message: Any) -> None:
        r = self.report
        try:
            data = json.loads(message.body)
            order, seq = int(data["order_id"]), int(data["seq"])
            if data.get("run") != self.run_id:
                r.foreign += 1
                return
        except (ValueError, KeyError, TypeError):
            r.foreign += 1
            return
        now = self.now()
        partition = message.partition
        row = r.partitions.setdefault(partition if partition is not None else -1,
                                      _PartitionReport())
        node = message.node
        if not row.nodes or row.nodes[-1] != node:
            row.nodes.append(node)
        expected = self.route(order, self.o.partitions)
        if partition is not None and partition != expected:
            r.wrong_partition += 1
        last = self.last_seq.get(order, -1)
        internal_id = message.internal_id
        if seq == last + 1:
            self.last_seq[order] = seq
            self.last_id[order] = internal_id
            r.consumed += 1
            row.consumed += 1
            row.keys.add(order)
            if self.first_delivery is None:
                self.first_delivery = now
            self.last_delivery = now
            with contextlib.suppress(ValueError, KeyError, TypeError):
                r.latencies.append(max(0.0, time.time() - float(data["at"])))
        elif seq == last and internal_id == self.last_id.get(order):
            r.redelivered += 1  # its FIN did not reach the server: at-least-once at work
            row.redelivered += 1
        elif seq <= last:
            r.duplicates += 1
        else:
            r.order_errors += 1
            row.order_errors += 1
        if (r.failover_at is not None and self.delivered_after_move is None
                and partition == r.failover_partition and node == r.failover_to):
            self.delivered_after_move = now
            r.consume_pause = now - r.failover_at
        traced = r.traced.get((order, seq))
        if traced is not None and not traced.delivered_at:
            traced.delivered_at = now
            traced.sub_partition = partition
            traced.sub_node = node
            traced.sub_internal_id = internal_id
            traced.queue_offset = message.queue_offset
            traced.attempts = message.attempts
        self._check_done()

    def on_audit(self, message: Any) -> None:
        try:
            data = json.loads(message.body)
            if data.get("run") != self.run_id:
                return
            order = int(data["order_id"])
        except (ValueError, KeyError, TypeError):
            return
        if order in self.audit_seen:
            if message.attempts <= 1:
                self.report.audit_duplicates += 1
            return
        self.audit_seen.add(order)
        self.report.audit_received += 1
        self._check_done()

    def _check_done(self) -> None:
        r = self.report
        if r.consumed >= r.total and r.audit_received >= r.audit_expected:
            self.done.set()

    # -- publishing ----------------------------------------------------------------------------

    async def publish(self, producer: Any) -> None:
        r = self.report
        stream = self.stream()
        for order, seq in stream:
            if order % TRACE_EVERY == FIRST_ORDER_ID % TRACE_EVERY:
                r.traced[(order, seq)] = _Traced(order, seq)
        queues: dict[int, asyncio.Queue[tuple[int, int] | None]] = {
            p: asyncio.Queue() for p in range(self.o.partitions)}
        audit: asyncio.Queue[int | None] = asyncio.Queue()
        move_at = int(len(stream) * 0.4) if self.o.failover and self.lab.can_move_leaders \
            else -1
        if self.o.failover and not self.lab.can_move_leaders:
            r.failover_note = "skipped: leaders can only be moved on the embedded cluster"
        elif not self.o.failover:
            r.failover_note = "skipped (--no-failover)"
        move_partition = min(1, self.o.partitions - 1)

        async def sender(partition: int) -> None:
            queue = queues[partition]
            row = r.partitions.setdefault(partition, _PartitionReport())
            finished = False
            while not finished:
                item = await queue.get()
                if item is None:
                    break
                batch = [item]
                while len(batch) < BATCH and not queue.empty():
                    more = queue.get_nowait()
                    if more is None:
                        finished = True
                        break
                    batch.append(more)
                bodies = [self.body(o, s) for o, s in batch]
                traces = [o if (o, s) in r.traced else 0 for o, s in batch]
                sent = self.now()
                result = await producer.publish_many(self.orders_topic, bodies,
                                                     partition=partition, trace_id=traces,
                                                     timeout=max(30.0, self.o.timeout))
                now = self.now()
                if not row.leaders or row.leaders[-1] != result.node:
                    row.leaders.append(result.node)
                if (r.failover_at is not None and self.acked_after_move is None
                        and partition == r.failover_partition):
                    self.acked_after_move = now
                    r.publish_pause = now - r.failover_at
                for i, (order, seq) in enumerate(batch):
                    traced = r.traced.get((order, seq))
                    if traced is not None:
                        traced.published_at = sent
                        traced.pub_partition = result.partition
                        traced.pub_node = result.node
                        if result.internal_id is not None:
                            traced.internal_id = result.internal_id + i
                    if seq == self.o.events - 1:
                        audit.put_nowait(order)
                row.published += len(batch)
                r.published += len(batch)

        async def audit_sender() -> None:
            finished = False
            while not finished:
                item = await audit.get()
                if item is None:
                    break
                batch = [item]
                while len(batch) < BATCH and not audit.empty():
                    more = audit.get_nowait()
                    if more is None:
                        finished = True
                        break
                    batch.append(more)
                bodies = [json.dumps({"run": self.run_id, "order_id": o, "status": "completed"},
                                     separators=(",", ":")).encode() for o in batch]
                await producer.publish_many(self.audit_topic, bodies,
                                            timeout=max(30.0, self.o.timeout))

        senders = [asyncio.create_task(sender(p)) for p in range(self.o.partitions)]
        audit_task = asyncio.create_task(audit_sender())
        try:
            start = time.monotonic()
            pace = self.o.duration / len(stream) if self.o.duration > 0 else 0.0
            for i, (order, seq) in enumerate(stream):
                if i == move_at:
                    old, new = self.lab.move_leader(self.orders_topic, move_partition)
                    r.failover_partition = move_partition
                    r.failover_from, r.failover_to = old, new
                    r.failover_at = self.now()
                if pace:
                    due = start + i * pace
                    delay = due - time.monotonic()
                    if delay > 0.01:
                        await asyncio.sleep(delay)  # pacing the stream, not waiting for state
                        self.show()
                queues[self.route(order, self.o.partitions)].put_nowait((order, seq))
                if not pace and i % 256 == 0:
                    await asyncio.sleep(0)
                    self.show()
            for queue in queues.values():
                queue.put_nowait(None)
            await asyncio.gather(*senders)
            audit.put_nowait(None)
            await audit_task
            r.publish_seconds = time.monotonic() - start
        finally:
            for task in (*senders, audit_task):
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*senders, audit_task, return_exceptions=True)

    # -- progress ------------------------------------------------------------------------------

    def show(self, force: bool = False) -> None:
        if not self.progress.enabled:
            return
        r = self.report
        note = ""
        if r.failover_at is not None:
            note = f" | p{r.failover_partition} leader moved"
            if r.consume_pause is not None:
                note += f", back in {r.consume_pause * 1000:.0f} ms"
        self.progress.update(
            f"{bar(r.consumed / max(1, r.total), 16)} published {r.published}/{r.total} "
            f"consumed {r.consumed} audit {r.audit_received}{note}", force=force)

    async def _ticker(self) -> None:
        while True:
            self.show()
            await asyncio.sleep(0.1)

    # -- the whole run -------------------------------------------------------------------------

    async def run(self) -> DemoReport:
        from ..consumer.core import Consumer
        from ..producer.producer import Producer

        r = self.report
        r.cluster = self.lab.description
        r.orders_topic, r.audit_topic, r.channel = (self.orders_topic, self.audit_topic,
                                                    self.channel)
        replicas = 2
        await self.lab.create_topic(self.orders_topic, self.o.partitions, replicas, True,
                                    self.channel)
        await self.lab.create_topic(self.audit_topic, 2, 1, False, self.channel)
        self.t0 = time.monotonic()
        ticker = asyncio.create_task(self._ticker()) if self.progress.enabled else None
        lookupd = self.lab.lookupd
        try:
            async with Producer(lookupd=lookupd, timeout=max(30.0, self.o.timeout)) as producer, \
                    Consumer(self.orders_topic, self.channel, lookupd=lookupd,
                             handler=self.on_order, ordered=True,
                             max_in_flight=4 * self.o.partitions) as orders, \
                    Consumer(self.audit_topic, self.channel, lookupd=lookupd,
                             handler=self.on_audit, max_in_flight=64) as audits:
                await self.publish(producer)
                # every event is published; wait for the rest to be delivered
                limit = max(20.0, 3 * self.o.duration, r.total / 200)
                try:
                    await asyncio.wait_for(self.done.wait(), limit)
                except asyncio.TimeoutError:
                    r.timed_out = True
                    r.problems.append(f"not everything arrived within {limit:.0f} s after "
                                      "publishing ended")
                regressions = orders.stats().order_errors
                if regressions:
                    r.problems.append(f"the consumer saw internal ids or queue offsets go "
                                      f"backwards {regressions} times")
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.gather(orders.close(), audits.close()),
                                           5.0)
        finally:
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            self.show(force=True)
            self.progress.done()
        r.total_seconds = self.now()
        if self.first_delivery is not None:
            r.consume_seconds = self.last_delivery - self.first_delivery
        r.missing = r.total - r.consumed
        return r


# -- the report ----------------------------------------------------------------------------

def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def render(report: DemoReport, options: DemoOptions) -> str:
    r = report
    lines = [f"smartnsq demo on {r.cluster}",
             f"ordered topic {r.orders_topic} ({options.partitions} partitions), plain topic "
             f"{r.audit_topic} (2 partitions), channel {r.channel}",
             f"{options.orders} orders x {options.events} events = {r.total} events, sharded "
             f"by order id (murmur3), 1 order in {TRACE_EVERY} traced", ""]
    rows = []
    for p in sorted(r.partitions):
        row = r.partitions[p]
        leaders = " -> ".join(row.leaders) if row.leaders else "-"
        moved = p == r.failover_partition and r.failover_at is not None
        if moved:
            leaders = f"{r.failover_from} -> {r.failover_to}"
        pause = f"{_ms(r.consume_pause)}" if moved else ""
        ordered = "ok" if row.order_errors == 0 else f"{row.order_errors} out of order"
        rows.append(["-" if p < 0 else p, leaders, row.published, row.consumed,
                     row.redelivered, len(row.keys), ordered, pause])
    lines.append(format_table(
        ["partition", "leader", "published", "consumed", "redelivered", "order ids",
         "order per id", "failover pause"], rows, right=(0, 2, 3, 4, 5)))
    lines.append("")
    once = r.consumed == r.total and r.duplicates == 0
    lines.append(f"delivery:   {r.consumed}/{r.total} events consumed"
                 f"{', each once' if once else ''}; duplicates {r.duplicates}, missing "
                 f"{r.missing}, redelivered after failover {r.redelivered}, "
                 f"on a wrong partition {r.wrong_partition}")
    order_text = ("every order id in order" if r.order_errors == 0
                  else f"{r.order_errors} events out of order")
    checked = sum(len(p.keys) for p in r.partitions.values())
    lines.append(f"order:      {order_text} ({checked} order ids checked)")
    lines.append(f"audit:      {r.audit_received}/{r.audit_expected} records on the plain "
                 f"topic (unsharded, round-robin)")
    if r.failover_at is not None:
        lines.append(f"failover:   partition {r.failover_partition} leader moved "
                     f"{r.failover_from} -> {r.failover_to} at +{r.failover_at:.2f} s; "
                     f"publishing resumed after {_ms(r.publish_pause)}, consumption after "
                     f"{_ms(r.consume_pause)}")
    else:
        lines.append(f"failover:   {r.failover_note or 'none'}")
    pub_rate = r.published / r.publish_seconds if r.publish_seconds else 0.0
    con_rate = r.consumed / r.consume_seconds if r.consume_seconds else 0.0
    paced = f", paced over --duration {options.duration:g} s" if options.duration else ""
    lines.append(f"throughput: published {r.published} in {r.publish_seconds:.2f} s "
                 f"({pub_rate:,.0f} msg/s{paced}); consumed {r.consumed} in "
                 f"{r.consume_seconds:.2f} s ({con_rate:,.0f} msg/s)")
    if r.latencies:
        lines.append(f"latency:    publish to handler p50 {_percentile(r.latencies, .5) * 1000:.1f}"
                     f" ms, p99 {_percentile(r.latencies, .99) * 1000:.1f} ms, max "
                     f"{max(r.latencies) * 1000:.1f} ms (mean "
                     f"{statistics.fmean(r.latencies) * 1000:.1f} ms)")
    traced = [t for t in r.traced.values() if t.delivered_at]
    if traced:
        # the moved partition first, then the earliest
        traced.sort(key=lambda t: (t.pub_partition != r.failover_partition, t.published_at))
        lines.append(f"trace:      {len(traced)} traced events (trace id = order id), a few:")
        for t in traced[:5]:
            lines.append(
                f"  trace {t.order} {event_name(t.seq):<16} PUB p{t.pub_partition} "
                f"{t.pub_node} id {t.internal_id} at +{t.published_at:.3f}s  ->  "
                f"delivered p{t.sub_partition} {t.sub_node} offset {t.queue_offset} "
                f"attempts {t.attempts} after {(t.delivered_at - t.published_at) * 1000:.1f} ms")
    for problem in r.problems:
        lines.append(f"problem:    {problem}")
    lines.append(f"result:     {'OK' if r.ok else 'FAILED'} in {r.total_seconds:.1f} s")
    return "\n".join(lines) + "\n"


def report_json(report: DemoReport) -> dict[str, Any]:
    """The report as one JSON object (``smartnsq demo --json``)."""
    r = report
    return {
        "ok": r.ok, "cluster": r.cluster, "orders_topic": r.orders_topic,
        "audit_topic": r.audit_topic, "channel": r.channel, "total": r.total,
        "published": r.published, "consumed": r.consumed, "duplicates": r.duplicates,
        "missing": r.missing, "redelivered": r.redelivered, "order_errors": r.order_errors,
        "wrong_partition": r.wrong_partition, "audit_expected": r.audit_expected,
        "audit_received": r.audit_received,
        "partitions": [{"partition": p, "published": row.published, "consumed": row.consumed,
                        "redelivered": row.redelivered, "order_ids": len(row.keys),
                        "order_errors": row.order_errors, "leaders": row.leaders}
                       for p, row in sorted(r.partitions.items())],
        "failover": None if r.failover_at is None else {
            "partition": r.failover_partition, "at": round(r.failover_at, 3),
            "from": r.failover_from, "to": r.failover_to,
            "publish_pause": r.publish_pause, "consume_pause": r.consume_pause},
        "publish_seconds": round(r.publish_seconds, 3),
        "consume_seconds": round(r.consume_seconds, 3),
        "total_seconds": round(r.total_seconds, 3),
        "latency_ms": None if not r.latencies else {
            "p50": round(_percentile(r.latencies, .5) * 1000, 2),
            "p99": round(_percentile(r.latencies, .99) * 1000, 2),
            "max": round(max(r.latencies) * 1000, 2)},
        "problems": list(r.problems),
    }


async def run_demo(options: DemoOptions, out: TextIO, err: TextIO) -> DemoReport:
    """Run the demo and print its report on ``out`` (progress on ``err``)."""
    options.check()
    shape = (options.timeout, options.create_timeout, err, options.progress)
    lab: _Lab = _Remote(options.cluster, *shape) if options.cluster else _Embedded(*shape)
    if options.cluster:
        err.write(f"running the demo against {', '.join(options.cluster)}\n")
    else:
        err.write("starting an embedded cluster (3 nsqd, 2 nsqlookupd)...\n")
    err.flush()
    await lab.start()
    try:
        demo = _Demo(options, lab, out, err)
        # a guard, not the verdict: the run checks its own progress, but a hang anywhere must
        # still end the command with a clear line instead of never returning
        limit = (2 * options.duration + max(60.0, options.orders * options.events / 100)
                 + 2 * options.create_timeout)  # two topics to create first
        try:
            report = await asyncio.wait_for(demo.run(), limit)
        except asyncio.TimeoutError:
            raise CLIError(f"the demo did not finish within {limit:.0f} s") from None
    finally:
        await lab.close()
    if options.json:
        out.write(json.dumps(report_json(report), separators=(",", ":")) + "\n")
    else:
        out.write(render(report, options))
    out.flush()
    return report


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    cluster = split_addresses(args.cluster, "lookupd") if args.cluster else None
    return DemoOptions(orders=args.orders, events=args.events, duration=args.duration,
                       cluster=cluster, topic_prefix=args.topic_prefix,
                       partitions=args.partitions, failover=not args.no_failover,
                       progress=False if getattr(args, "quiet", False) else args.progress,
                       seed=args.seed, timeout=args.timeout,
                       create_timeout=getattr(args, "create_timeout", 120.0),
                       json=getattr(args, "json", False))


async def run_cli(args: argparse.Namespace) -> int:
    """``smartnsq demo``: exit 0 only when the run verified."""
    options = options_from_args(args)
    report = await run_demo(options, args.out, args.err)
    return 0 if report.ok else 1
