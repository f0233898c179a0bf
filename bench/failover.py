"""Failover: what a node loss, a graceful leave and a replica loss cost a smartnsq client.

    python bench/failover.py [--profile realistic] [--scale X] [--seed N]
                             [--scenario node-loss|leave|replica-loss] [--no-ordered] [--quick]

Each scenario gets a fresh embedded dev cluster (3 youzan nsqd, 2 lookupds) playing the real
cluster's failure modes on a :class:`~smartnsq.devcluster.profile.FaultProfile`'s clock, with
a 4-partition x 2-replica topic (and, unless ``--no-ordered``, an ordered one of the same
shape). A ``Producer`` publishes continuously by sharding key (a few keys per partition, each
key one publish after another) and a ``Consumer`` per topic drains it; only the public API
is used (``from smartnsq import Producer, Consumer``, default options). Then the scenario's
fault is injected:

* ``node-loss``: SIGKILL (``kill_node``) of the node leading partition 0 of the topic;
* ``leave``: SIGTERM (``leave_node``) of the node leading the most partitions;
* ``replica-loss``: SIGKILL of a node that leads nothing but holds replicas (leaderships
  are moved off it before the clients start), so the live leaders stall.

Publishing goes on until the fault clock has settled and every partition has been
acknowledged again (or ``--tail-max`` passes). Per partition the script prints:

* **publish pause**: the longest gap between acknowledged publishes (run start and end count
  as edges, so a partition still paused at the end shows it);
* **consume pause**: the longest gap between first deliveries, over the same span;
* the **server window**: what the dev cluster did to that partition, from
  ``cluster.faults.timeline``: from the fault until the partition served writes again
  (leaderless, then not writable until the ISR shrank or a replica caught up; a handoff; a
  stall);
* the client's **overhead**: pause - server window, and the goal's allowance (below);
* connections closed, counted by a logging handler on the ``smartnsq`` loggers (the client's
  own records: the pool's "connection to H:P closed", the consumer's "connection lost", and
  the connection's "timed out ...; closing" / "closing as stalled" for the ones the client
  closed itself). A close of a connection to a node other than the faulted one, or to the
  faulted node before the fault, is a **healthy** connection closed. The dev cluster's own
  view cross-checks that count (``ServerSide``: client connections that vanish from a live
  nsqd), so a change of the client's log wording cannot make it read 0 unnoticed.

The goals: a graceful move costs at most the server's handoff + 100 ms; a node
loss costs the leaderless window (here: the server's whole window for that partition) + at
most 1 s; partitions whose leader stays up pause no longer than the server's stall (+ the
100 ms publish spacing allowance); 0 healthy connections closed.

The dev cluster runs in this process, on the client's event loop (the fault clock and the
timeline need it): its work is included in the client's figures, which makes the overheads
pessimistic by the server's share of the CPU. The method and the latest figures are in
docs/performance.md ("Failover").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from _common import command_line, environment, table

from smartnsq import Consumer, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.profile import FaultProfile, profile_named

SCENARIOS = ("node-loss", "leave", "replica-loss")
TOPIC = "failover"
ORDERED_TOPIC = "failover_ordered"
CHANNEL = "bench"
PARTITIONS = 4
REPLICAS = 2
ALLOWANCE = {"led": 1.0, "move": 0.1, "stall": 0.1, "untouched": 0.1}  # s over the window
ADDRESS = re.compile(r"127\.\d+\.\d+\.\d+:\d+")


# -- counting connection closes from the client's own log records --------------------------

@dataclass
class Close:
    at: float
    address: str
    kind: str  # "closed" (pool/consumer saw it end) or "client" (the client closed it)
    text: str


class CloseCounter(logging.Handler):
    """Records the smartnsq log lines that say a connection ended, and every warning."""

    CLOSED = ("connection to %s:%d closed: %s", "%s: connection lost (%s)")
    CLIENT = ("timed out after", "closing as stalled")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.closes: list[Close] = []
        self.warnings: dict[str, int] = defaultdict(int)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("smartnsq.devcluster"):
            return
        template = str(record.msg)
        if record.levelno >= logging.WARNING:
            self.warnings[f"{record.name}: {template}"] += 1
        kind = ("closed" if template in self.CLOSED
                else "client" if any(c in template for c in self.CLIENT) else None)
        if kind is None:
            return
        text = record.getMessage()
        match = ADDRESS.search(text)
        self.closes.append(Close(time.monotonic(), match.group(0) if match else "?", kind,
                                 text))


class ServerSide:
    """The dev cluster's own view: which client connections each nsqd had, sampled.

    A cross-check of :class:`CloseCounter` that does not depend on the client's log wording:
    a connection that was open on a node and is gone while that node was alive and not
    leaving was closed by the client (or dropped by the server on a healthy node, which the
    dev cluster does only for a reason it logs). Sampled every ``period`` s, so a connection
    opened and closed between two samples is missed.
    """

    def __init__(self, cluster: DevCluster, period: float = 0.02) -> None:
        self.cluster = cluster
        self.period = period
        self.ended: list[tuple[float, str]] = []  # (when seen gone, node id)
        self._open: dict[int, tuple[str, Any]] = {}

    def sample(self) -> None:
        now = time.monotonic()
        current: dict[int, tuple[str, Any]] = {}
        for node in self.cluster.youzan_nodes:
            info = self.cluster.node_info(node)
            if not info.alive or getattr(node, "exiting", False):
                continue  # its connections end for the fault's own reason
            for conn in node.connections:
                current[id(conn)] = (info.node_id, conn)
        for key, (node_id, _) in self._open.items():
            node = self.cluster.node(node_id)
            if key not in current and self.cluster.node_info(node_id).alive \
                    and getattr(node, "running", True) and not getattr(node, "exiting", False):
                self.ended.append((now, node_id))
        self._open = current

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period)


# -- the ledger of one topic ----------------------------------------------------------------

@dataclass
class Ledger:
    topic: str
    ordered: bool
    acks: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    firsts: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    acked: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # the publish raised (unacknowledged)
    seen: set[str] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    duplicates: int = 0

    def delivered(self, partition: int | None, body: str) -> None:
        if body in self.seen:
            self.duplicates += 1
            return
        self.seen.add(body)
        self.firsts[-1 if partition is None else partition].append(time.monotonic())


def longest_gap(times: list[float], start: float, end: float) -> float:
    edges = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(edges))


# -- the server's windows, from the fault timeline ------------------------------------------

@dataclass
class Window:
    seconds: float  # from the fault until the partition served writes again (0: untouched)
    kind: str  # "led" (its leader was lost), "move" (handed off), "stall", "untouched"
    what: str  # the timeline, summarised


def server_windows(timeline: list[Any], fault_at: float, topics: list[str],
                   stalls: dict[tuple[str, int], float]) -> dict[tuple[str, int], Window]:
    """Per (topic, partition): what the fault clock did after ``fault_at``. ``stalls``: the
    unanswered-PUB stalls a kill set (the clock does not put those in its timeline)."""
    events: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for e in timeline:
        if e.at >= fault_at - 1e-6 and "topic" in e.details:
            events[(e.details["topic"], e.details["partition"])].append(e)
    out = {}
    for topic in topics:
        for p in range(PARTITIONS):
            evs = events.get((topic, p), [])
            ends = [e.at for e in evs if e.what in ("writable", "caught_up", "handed_off")]
            for e in evs:
                if e.what == "stalled":
                    ends.append(fault_at + e.details["seconds"])
            names = {e.what for e in evs}
            if not evs:
                stall = stalls.get((topic, p))
                out[(topic, p)] = (Window(0.0, "untouched", "-") if stall is None else
                                   Window(stall, "stall", f"no PUB answer {stall:.2f}s"))
                continue
            kind = ("move" if "handed_off" in names
                    else "led" if "elected" in names or "no_replica_to_elect" in names
                    else "stall")
            steps = ", ".join(f"{e.what} {e.at - fault_at:.2f}s" for e in evs
                              if e.what != "writable" or len(evs) == 1)
            if "stalled" in names:
                steps = f"stalled {evs[0].details['seconds']:.2f}s"
            elif (topic, p) in stalls:
                steps = f"no PUB answer {stalls[(topic, p)]:.2f}s, {steps}"
            end = max(ends) if ends else float("inf")
            out[(topic, p)] = Window(end - fault_at, kind, steps)
    return out


# -- one scenario ---------------------------------------------------------------------------

@dataclass
class Row:
    topic: str
    partition: int
    window: Window
    publish_pause: float
    consume_pause: float
    baseline: float  # the longest publish gap before the fault (steady-state jitter)
    acked: int
    leader: str


@dataclass
class Outcome:
    scenario: str
    node: str
    fault_at: float
    rows: list[Row]
    closes: list[Close]
    warnings: dict[str, int]
    errors: dict[str, dict[str, int]]
    lost: dict[str, int]
    failed_delivered: dict[str, int]  # publishes that raised, yet were delivered
    duplicates: dict[str, int]
    settle_seconds: float
    seconds: float
    leaders: dict[str, list[str]]
    longest_stall: float  # the longest PUB stall the server caused, any partition
    server_closes: list[tuple[float, str]]  # ServerSide.ended
    behind: dict[str, int]  # acknowledged, not yet delivered, at the fault

    def limit(self, row: Row) -> float:
        """The goal: the longest pause the goals allow this partition."""
        if row.window.kind == "untouched":  # its connection may carry a stalled partition
            return self.longest_stall + ALLOWANCE["untouched"]
        return row.window.seconds + ALLOWANCE[row.window.kind]


def short(node_id: str) -> str:
    """``n1`` for the dev cluster's ``127.0.0.1:TCP:HTTP:1``."""
    return "n" + node_id.rsplit(":", 1)[-1] if node_id.count(":") >= 3 else node_id


def _leaders(cluster: DevCluster, topic: str) -> list[str]:
    return [cluster.state.partition(topic, p).leader or "-"  # type: ignore[union-attr]
            for p in range(PARTITIONS)]


def _pick_node(cluster: DevCluster, scenario: str, topics: list[str]) -> str:
    """The node to fault (its node id); for replica-loss, moves leaderships off it first."""
    led: dict[str, int] = defaultdict(int)
    copies: dict[str, int] = defaultdict(int)
    for topic in topics:
        for p in range(PARTITIONS):
            part = cluster.state.partition(topic, p)
            assert part is not None and part.leader is not None
            led[part.leader] += 1
            for r in part.replicas:
                copies[r] += 1
    main = cluster.state.partition(TOPIC, 0)
    assert main is not None and main.leader is not None
    if scenario == "node-loss":
        return main.leader
    if scenario == "leave":
        main_led: dict[str, int] = defaultdict(int)
        for p in range(PARTITIONS):
            main_led[_leaders(cluster, TOPIC)[p]] += 1
        return max(sorted(main_led), key=lambda n: main_led[n])
    node = max(sorted(copies), key=lambda n: (copies[n], -led[n]))
    for topic in topics:
        for p in range(PARTITIONS):
            part = cluster.state.partition(topic, p)
            assert part is not None
            if part.leader == node:
                other = [r for r in part.replicas if r != node]
                if not other:
                    raise RuntimeError(f"{topic}/{p} has no other replica to lead")
                cluster.move_leader(topic, p, other[0])
    return node


async def _publish_key(producer: Producer, ledger: Ledger, key: str, interval: float,
                       stop: asyncio.Event) -> None:
    seq = 0
    while not stop.is_set():
        body = f"{key}:{seq}"
        seq += 1
        try:
            result = await producer.publish(ledger.topic, body.encode(), sharding_key=key)
        except Exception as exc:  # unacknowledged: counted, and the key goes on
            ledger.errors[type(exc).__name__] += 1
            ledger.failed.add(body)
        else:
            ledger.acked.add(body)
            ledger.acks[-1 if result.partition is None else result.partition].append(
                time.monotonic())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


async def _keys_per_partition(producer: Producer, topic: str, per: int) -> list[str]:
    """Keys spreading evenly over the partitions, learnt by publishing (the public API)."""
    found: dict[int, list[str]] = defaultdict(list)
    for i in range(400):
        key = f"key{i}"
        result = await producer.publish(topic, f"warm-up:{i}".encode(), sharding_key=key)
        part = -1 if result.partition is None else result.partition
        if len(found[part]) < per:
            found[part].append(key)
        if len(found) >= PARTITIONS and all(len(v) >= per for v in found.values()):
            break
    return [k for keys in found.values() for k in keys]


async def run_scenario(scenario: str, profile: FaultProfile, args: argparse.Namespace,
                       log: CloseCounter) -> Outcome:
    began = time.monotonic()
    topics = [TOPIC] + ([] if args.no_ordered else [ORDERED_TOPIC])
    ledgers = [Ledger(TOPIC, False)] + ([] if args.no_ordered else [Ledger(ORDERED_TOPIC, True)])
    async with DevCluster(nodes=3, lookupds=2, profile=profile) as cluster:
        for ledger in ledgers:
            await cluster.create_topic(ledger.topic, PARTITIONS, REPLICAS,
                                       ordered=ledger.ordered, channels=[CHANNEL])
        node = _pick_node(cluster, scenario, topics)
        leaders = {t: _leaders(cluster, t) for t in topics}
        lookupd = cluster.lookupd_http_addresses
        addresses = dict(zip(cluster.nsqd_tcp_addresses,
                             (cluster.node_info(i).node_id for i in range(3)), strict=True))

        def handler_for(ledger: Ledger) -> Any:
            def handle(message: Any) -> None:
                body = message.body.decode()
                if not body.startswith("warm-up:"):
                    ledger.delivered(message.partition, body)
            return handle

        consumers = [Consumer(ledger.topic, CHANNEL, lookupd=lookupd,
                              handler=handler_for(ledger)) for ledger in ledgers]
        stop = asyncio.Event()
        async with Producer(lookupd=lookupd) as producer:
            keys = {ledger.topic: await _keys_per_partition(producer, ledger.topic,
                                                             args.keys_per_partition)
                    for ledger in ledgers}
            for consumer in consumers:
                await consumer.start()
            log.closes.clear()
            log.warnings.clear()
            try:
                start = time.monotonic()
                server_side = ServerSide(cluster)
                sampler = asyncio.create_task(server_side.run(stop))
                publishers = [asyncio.create_task(_publish_key(producer, ledger, key,
                                                               args.interval, stop))
                              for ledger in ledgers for key in keys[ledger.topic]]
                await asyncio.sleep(args.warmup)
                fault_at = time.monotonic()
                behind = {lg.topic: len(lg.acked - lg.seen) for lg in ledgers}
                if scenario == "leave":
                    await cluster.leave_node(node)
                else:
                    await cluster.kill_node(node)
                stalls = {}
                for topic in topics:
                    for p in range(PARTITIONS):
                        part = cluster.state.partition(topic, p)
                        if part is not None and part.stalled_until > fault_at:
                            stalls[(topic, p)] = part.stalled_until - fault_at
                await cluster.faults.settled(args.settle_max)
                settled_at = time.monotonic()
                # go on until every partition was acknowledged after the fault settled
                deadline = settled_at + args.tail_max
                while time.monotonic() < deadline:
                    recent = [ledger.acks[p][-1] if ledger.acks[p] else 0.0
                              for ledger in ledgers for p in range(PARTITIONS)]
                    if min(recent) > settled_at + args.tail:
                        break
                    await asyncio.sleep(0.1)
                stop.set()
                await asyncio.gather(*publishers, sampler)
                end = time.monotonic()
                await _drain(ledgers, args.drain_max)
            finally:
                stop.set()
                for consumer in consumers:
                    with contextlib.suppress(Exception):
                        await consumer.close(5.0)
        windows = server_windows(cluster.faults.timeline, fault_at, topics, stalls)
    rows = [Row(ledger.topic, p, windows[(ledger.topic, p)],
                longest_gap(ledger.acks[p], start, end),
                longest_gap(ledger.firsts[p], start, end),
                longest_gap(ledger.acks[p], start, fault_at), len(ledger.acks[p]),
                short(leaders[ledger.topic][p]))
            for ledger in ledgers for p in range(PARTITIONS)]
    closes = [Close(c.at, short(addresses.get(c.address, c.address)), c.kind, c.text)
              for c in log.closes]
    longest_stall = max([*stalls.values(), *(w.seconds for w in windows.values()
                                             if w.what.startswith("stalled"))], default=0.0)
    return Outcome(scenario, short(node), fault_at, rows, closes, dict(log.warnings),
                   {ledger.topic: dict(ledger.errors) for ledger in ledgers},
                   {ledger.topic: len(ledger.acked - ledger.seen) for ledger in ledgers},
                   {ledger.topic: len(ledger.failed & ledger.seen) for ledger in ledgers},
                   {ledger.topic: ledger.duplicates for ledger in ledgers},
                   settled_at - fault_at, time.monotonic() - began,
                   {t: [short(n) for n in ls] for t, ls in leaders.items()}, longest_stall,
                   [(at, short(n)) for at, n in server_side.ended], behind)


async def _drain(ledgers: list[Ledger], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(lg.acked <= lg.seen for lg in ledgers):
        await asyncio.sleep(0.1)


# -- the report -----------------------------------------------------------------------------

def _met(pause: float, limit: float, baseline: float) -> str:
    """Met if within the goal, or no longer than the partition's gaps before the fault."""
    return "yes" if round(pause, 2) <= round(max(limit, baseline), 2) else "NO"  # as printed


def format_outcome(o: Outcome) -> str:
    lines = [f"## {o.scenario}: {'SIGTERM' if o.scenario == 'leave' else 'SIGKILL'} of {o.node}"
             f" (fault settled after {o.settle_seconds:.1f} s; scenario took {o.seconds:.0f} s)"]
    for topic, leaders in o.leaders.items():
        lines.append(f"leaders before the fault, {topic}: "
                     + ", ".join(f"p{i}={n}" for i, n in enumerate(leaders)))
    rows = []
    for r in o.rows:
        w = r.window
        limit = o.limit(r)
        rows.append([
            f"{r.topic}/{r.partition}", r.leader, w.kind, w.what, f"{w.seconds:.2f}",
            f"{r.publish_pause:.2f}", f"{r.publish_pause - w.seconds:+.2f}",
            f"{r.consume_pause:.2f}", f"{r.consume_pause - w.seconds:+.2f}",
            f"{limit:.2f}", f"{r.baseline:.2f}",
            f"{_met(r.publish_pause, limit, r.baseline)}/"
            f"{_met(r.consume_pause, limit, r.baseline)}", str(r.acked)])
    lines.append(table(["partition", "leader", "kind", "server timeline (from the fault)",
                        "server window s", "publish pause s", "overhead s", "consume pause s",
                        "overhead s", "goal: pause <= s", "before fault s", "met pub/con",
                        "acked"], rows))
    healthy = [c for c in o.closes if c.address != o.node or c.at < o.fault_at]
    closed = sum(1 for c in healthy if c.kind == "closed")
    by_client = sum(1 for c in healthy if c.kind == "client")
    by_node: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in o.closes:
        by_node[c.address][0 if c.kind == "closed" else 1] += 1
    lines.append(f"connections closed (client log records): healthy {closed}, of which the "
                 f"client closed {by_client} itself (goal 0: {'met' if not closed else 'MISSED'});"
                 " per node closed/closed-by-client: "
                 + (", ".join(f"{n} {a}/{b}" for n, (a, b) in sorted(by_node.items())) or "none"))
    server = [n for at, n in o.server_closes if n != o.node or at < o.fault_at]
    lines.append(f"connections closed (the dev cluster's view, sampled every 20 ms, live nodes "
                 f"only): {len(server)}"
                 + (" (" + ", ".join(f"{n} x{server.count(n)}" for n in sorted(set(server)))
                    + ")" if server else "")
                 + ("" if len(server) == closed else
                    f"; DIFFERS from the client's log ({closed}): check the log wording"))
    for c in healthy[:6]:
        lines.append(f"  healthy close at +{c.at - o.fault_at:.2f}s: {c.text}")
    if len(healthy) > 6:
        lines.append(f"  ... {len(healthy) - 6} more")
    for topic in o.errors:
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(o.errors[topic].items())) or "none"
        lines.append(f"{topic}: publish failures {errors} ({o.failed_delivered[topic]} of them "
                     f"delivered all the same); acknowledged but not delivered "
                     f"{o.lost[topic]}; duplicate deliveries {o.duplicates[topic]}; consumer "
                     f"behind by {o.behind[topic]} at the fault")
    if o.warnings:
        lines.append("client warnings:")
        for text, n in sorted(o.warnings.items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"  {n:5d} x {text}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="realistic")
    parser.add_argument("--scale", type=float, default=0.5,
                        help="fault durations x this (1.0: the real cluster's figures)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--quick", action="store_true",
                        help="scale 0.05, short warm-up and tail: a smoke run (~30 s)")
    parser.add_argument("--no-ordered", action="store_true", help="skip the ordered topic")
    parser.add_argument("--keys-per-partition", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.03,
                        help="seconds between one key's publishes")
    parser.add_argument("--warmup", type=float, default=3.0, help="publishing before the fault")
    parser.add_argument("--tail", type=float, default=1.0,
                        help="publishing after the fault settled, at least")
    parser.add_argument("--tail-max", type=float, default=30.0,
                        help="... waiting at most this for every partition to come back")
    parser.add_argument("--settle-max", type=float, default=600.0)
    parser.add_argument("--drain-max", type=float, default=30.0)
    args = parser.parse_args()
    if args.quick:
        args.scale, args.warmup, args.tail_max = 0.05, 1.0, 15.0
    try:
        profile = profile_named(args.profile, args.scale, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    counter = CloseCounter()
    logger = logging.getLogger("smartnsq")
    logger.addHandler(counter)
    logger.setLevel(logging.INFO)
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    began = time.monotonic()
    print(f"failover: profile {profile.name} x{profile.scale:g}, seed {args.seed}; "
          f"{PARTITIONS} partitions x {REPLICAS} replicas on 3 nodes; "
          f"{args.keys_per_partition} keys per partition, one publish per key every "
          f"{args.interval * 1000:g} ms; Producer and Consumer with default options\n",
          flush=True)
    for scenario in scenarios:
        outcome = asyncio.run(run_scenario(scenario, profile, args, counter))
        print(format_outcome(outcome), end="\n\n", flush=True)
    print("goals: graceful move <= handoff + 0.1 s; node loss <= server window + 1 s; "
          "partitions whose leader stays up <= the server's stall + 0.1 s; "
          "0 healthy connections closed")
    print(f"wall time {time.monotonic() - began:.0f} s")
    print(f"command: {command_line()}")
    print(environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
