"""A total-queue check in the manner of youzan's Jepsen suite, on the dev cluster.

A smartnsq ``Producer`` publishes numbered messages per sharding key to an unordered and an
ordered topic while a seeded random schedule kills nodes (SIGKILL), makes them leave
(SIGTERM) and moves leaders, on a :class:`~smartnsq.devcluster.profile.FaultProfile`'s clock;
a smartnsq ``Consumer`` per topic reads everything back. Only the public client API is used
(``from smartnsq import Producer, Consumer``), so the check holds the client to what a user
gets. At the end:

* every **acknowledged** publish must have been delivered (else it is **lost**);
* nothing delivered may be unknown (**phantom**: never published, not even attempted);
* **duplicated**: delivered more than once (allowed, at-least-once, but counted);
* **order violations** (ordered topic): a key's acknowledged messages first delivered out of
  publish order (an unacknowledged one, stored after all, has no place in that order: the
  publisher was told it failed and went on with the key's next message);
* the **longest pause** per partition: the longest time without an acknowledged publish.

A publish that failed (timeout, refused) is *unacknowledged*: it may or may not show up, and
either is correct. ``python -m smartnsq.devcluster.chaos --seconds 60`` runs one from a shell;
``bench/chaos.py`` runs the long realistic one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .cluster import DevCluster
from .profile import FaultProfile, profile_named

__all__ = ["KNOWN_FAULTS", "REAL_FAULTS", "ChaosConfig", "ChaosReport", "Step", "TopicReport",
           "make_schedule", "run_chaos"]

log = logging.getLogger("smartnsq.devcluster.chaos")

TOPIC = "chaos"
ORDERED_TOPIC = "chaos_ordered"
CHANNEL = "check"
FAULTS = ("kill", "leave", "move_leader")
"""The dev cluster's default schedule; ``lookupd`` (a lookupd killed, then started) may be
added."""
KNOWN_FAULTS = (*FAULTS, "lookupd")
REAL_FAULTS = ("kill", "leave", "lookupd")
"""What a real cluster's processes can be made to do (no leader move from outside)."""


@dataclass(frozen=True)
class ChaosConfig:
    """One run. ``seconds``: how long faults are injected; then every node comes back and
    the consumers get ``drain_seconds`` to read what is left."""

    seed: int = 1
    seconds: float = 10.0
    profile: FaultProfile = field(default_factory=lambda: profile_named("realistic", 0.03))
    nodes: int = 3
    lookupds: int = 2
    partitions: int = 4
    replicas: int = 2
    keys: int = 16
    rate: float = 100.0  # publishes per second over all keys and both topics
    fault_gap: tuple[float, float] = (0.5, 2.0)  # seconds between the end of one fault and the next
    down_for: tuple[float, float] = (0.5, 3.0)  # how long a killed/left node stays down
    # how long a SIGKILLed node stays down, if not ``down_for``: on the real youzan servers a
    # leader killed and started again inside its etcd session (before the cluster moved its
    # partitions) comes back as leader without the tail of its log that was still in its
    # write buffer, and its replicas resync to it: acknowledged messages are gone on the
    # server (docs/devcluster.md). Keeping it down past the leaderless window tests the client.
    kill_down_for: tuple[float, float] | None = None
    faults: tuple[str, ...] = FAULTS
    publish_timeout: float = 10.0
    drain_seconds: float = 30.0

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(KNOWN_FAULTS)
        if unknown:
            raise ValueError(f"faults: unknown {sorted(unknown)}; known {list(KNOWN_FAULTS)}")
        if self.nodes < 2 or self.replicas < 2:
            raise ValueError("nodes and replicas must be >= 2 (a node loss must be survivable)")
        if self.seconds <= 0 or self.rate <= 0 or self.keys < 1:
            raise ValueError("seconds, rate and keys must be positive")


@dataclass(frozen=True)
class Step:
    """One scheduled fault: ``at`` seconds into the run, on node ``node`` (an index; the
    lookupd's index for ``lookupd``) or, for ``move_leader``, on ``partition`` of ``topic``;
    a node or lookupd comes back after ``down_for``."""

    at: float
    fault: str
    node: int = 0
    topic: str = ""
    partition: int = 0
    down_for: float = 0.0


def make_schedule(config: ChaosConfig) -> list[Step]:
    """The seeded fault schedule: one fault at a time, each node back before the next."""
    rng = random.Random(config.seed)
    steps: list[Step] = []
    at = rng.uniform(*config.fault_gap)
    while at < config.seconds:
        fault = rng.choice(config.faults)
        if fault == "move_leader":
            topic = rng.choice((TOPIC, ORDERED_TOPIC))
            steps.append(Step(at, fault, topic=topic,
                              partition=rng.randrange(config.partitions)))
            at += rng.uniform(*config.fault_gap)
        else:
            down = rng.uniform(*(config.kill_down_for if fault == "kill"
                                 and config.kill_down_for else config.down_for))
            count = config.lookupds if fault == "lookupd" else config.nodes
            steps.append(Step(at, fault, node=rng.randrange(count), down_for=down))
            at += down + rng.uniform(*config.fault_gap)
    return steps


@dataclass
class TopicReport:
    """The check of one topic."""

    topic: str
    ordered: bool
    attempted: int = 0
    acknowledged: int = 0
    unacknowledged: int = 0
    delivered: int = 0
    lost: int = 0
    phantom: int = 0
    duplicated: int = 0
    order_violations: int = 0
    longest_pause: dict[int, float] = field(default_factory=dict)  # partition -> seconds
    errors: dict[str, int] = field(default_factory=dict)  # publish failures by kind
    lost_examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.phantom or self.order_violations)


@dataclass
class ChaosReport:
    config: ChaosConfig
    schedule: list[Step]  # the faults injected
    topics: list[TopicReport]
    seconds: float = 0.0
    drained: bool = False

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.topics)

    def format(self) -> str:
        c = self.config
        lines = [f"chaos run seed={c.seed} profile={c.profile.name} x{c.profile.scale} "
                 f"nodes={c.nodes} partitions={c.partitions} replicas={c.replicas} "
                 f"faults={len(self.schedule)} in {c.seconds:.0f} s, took {self.seconds:.1f} s"
                 f"{'' if self.drained else ' (drain timed out)'}"]
        counts: dict[str, int] = defaultdict(int)
        for step in self.schedule:
            counts[step.fault] += 1
        lines.append("  schedule: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
        for t in self.topics:
            pauses = " ".join(f"p{p}={s:.1f}s" for p, s in sorted(t.longest_pause.items()))
            lines.append(
                f"  {t.topic}{' (ordered)' if t.ordered else ''}: attempted {t.attempted}, "
                f"acknowledged {t.acknowledged}, unacknowledged {t.unacknowledged}, "
                f"delivered {t.delivered}, lost {t.lost}, phantom {t.phantom}, "
                f"duplicated {t.duplicated}, order violations {t.order_violations}")
            lines.append(f"    longest pause per partition: {pauses or '-'}")
            if t.errors:
                lines.append("    publish failures: " + ", ".join(
                    f"{k} x{v}" for k, v in sorted(t.errors.items())))
            if t.lost_examples:
                lines.append(f"    lost e.g.: {', '.join(t.lost_examples)}")
        lines.append("RESULT: " + ("ok" if self.ok else "FAILED"))
        return "\n".join(lines)


@dataclass
class _Ledger:
    """What one topic's producer and consumer saw."""

    topic: str
    ordered: bool
    attempted: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    placed: dict[str, int | None] = field(default_factory=dict)  # acked body -> partition
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    acks: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    deliveries: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    first_order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def delivered(self, body: str) -> None:
        self.deliveries[body] += 1
        if self.deliveries[body] == 1:
            key, seq = body.split(":")[:2]
            self.first_order[key].append(int(seq))
        self.changed.set()

    def drained(self) -> bool:
        return self.acked <= self.deliveries.keys()

    def report(self, started: float, ended: float) -> TopicReport:
        delivered = set(self.deliveries)
        lost = sorted(self.acked - delivered)
        order = 0
        if self.ordered:
            acked = self.acked
            for key, seqs in self.first_order.items():
                kept = [seq for seq in seqs if f"{key}:{seq}" in acked]
                order += sum(1 for a, b in itertools.pairwise(kept) if b < a)
        pauses = {}
        for partition, times in self.acks.items():
            edges = [started, *sorted(times), ended]
            pauses[partition] = max(b - a for a, b in itertools.pairwise(edges))
        return TopicReport(
            topic=self.topic, ordered=self.ordered, attempted=len(self.attempted),
            acknowledged=len(self.acked), unacknowledged=len(self.attempted - self.acked),
            delivered=len(delivered), lost=len(lost),
            phantom=len(delivered - self.attempted),
            duplicated=sum(1 for n in self.deliveries.values() if n > 1),
            order_violations=order, longest_pause=pauses, errors=dict(self.errors),
            lost_examples=[f"{body}@p{self.placed.get(body)}" for body in lost[:8]])


async def _publish_key(producer: Any, ledger: _Ledger, key: str, interval: float,
                       stop: asyncio.Event, timeout: float) -> None:
    """One key's messages, one after another (so per-key publish order is defined)."""
    seq = 0
    while not stop.is_set():
        body = f"{key}:{seq}"
        ledger.attempted.add(body)
        try:
            result = await producer.publish(ledger.topic, body.encode(), sharding_key=key,
                                            timeout=timeout)
        except Exception as exc:  # any failure leaves it unacknowledged: that is what we count
            ledger.errors[type(exc).__name__] += 1
        else:
            ledger.acked.add(body)
            ledger.placed[body] = result.partition
            if result.partition is not None:
                ledger.acks[result.partition].append(time.monotonic())
        seq += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


async def _inject(cluster: Any, config: ChaosConfig, schedule: list[Step],
                  started: float, done: list[Step]) -> None:
    """Play the schedule; ``done`` receives each step as it is injected."""
    for step in schedule:
        if time.monotonic() - started >= config.seconds:
            break  # long recoveries pushed the rest of the schedule past the run's end
        delay = started + step.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule's clock
        log.info("chaos: %s", step)
        done.append(step)
        if step.fault == "move_leader":
            p = cluster.state.partition(step.topic, step.partition)
            if p is not None and p.leader is not None and cluster.node_info(p.leader).alive:
                with contextlib.suppress(Exception):
                    cluster.move_leader(step.topic, step.partition)
            continue
        if step.fault == "lookupd":
            if len(cluster.lookupds) > 1:  # the last lookupd standing is not taken away
                await cluster.stop_lookupd(step.node)
                await asyncio.sleep(step.down_for)
                await cluster.start_lookupd(step.node)
            continue
        node = cluster.nodes[step.node]
        if step.fault == "kill":
            await cluster.kill_node(node)
        else:
            await cluster.leave_node(node)
        await asyncio.sleep(step.down_for)
        if isinstance(cluster, DevCluster):
            await cluster.faults.settled(600)
        else:  # a real nsqd: until the leaving process has exited
            await cluster.settled(node, 600)
        await cluster.start_node(node)


async def run_chaos(config: ChaosConfig, cluster: Any = None) -> ChaosReport:
    """Run one total-queue check (see the module doc) and return its report.

    ``cluster``: a started cluster to run on instead of a fresh ``DevCluster`` of the
    config's shape, e.g. a :class:`~smartnsq.testing.realcluster.RealCluster` (whose faults are real
    SIGKILL/SIGTERM/lookupd kills; give it ``faults=REAL_FAULTS``). It is not stopped here.
    """
    schedule = make_schedule(config)
    ledgers = [_Ledger(TOPIC, False), _Ledger(ORDERED_TOPIC, True)]
    if cluster is not None:
        return await _run(config, cluster, schedule, ledgers)
    async with DevCluster(nodes=config.nodes, lookupds=config.lookupds,
                          profile=config.profile) as dev:
        return await _run(config, dev, schedule, ledgers)


async def _run(config: ChaosConfig, cluster: Any, schedule: list[Step],
               ledgers: list[_Ledger]) -> ChaosReport:
    from smartnsq import Consumer, Producer  # the public API, nothing else of the client

    injected: list[Step] = []  # the schedule's steps that ran before the time was up
    began = time.monotonic()
    for ledger in ledgers:
        await cluster.create_topic(ledger.topic, config.partitions, config.replicas,
                                   ordered=ledger.ordered, channels=[CHANNEL])
    lookupd = cluster.lookupd_http_addresses
    lookup_options = {"poll_interval": 1.0, "discover_interval": 5.0}

    def handler_for(ledger: _Ledger) -> Any:
        def handle(message: Any) -> None:
            ledger.delivered(message.body.decode())
        return handle

    consumers = [Consumer(ledger.topic, CHANNEL, lookupd=lookupd,
                          handler=handler_for(ledger), max_in_flight=50,
                          max_attempts=0,  # every delivery is counted: none may be given up
                          reconnect_delay=0.1, reconnect_delay_max=1.0,
                          lookup_options=lookup_options)
                 for ledger in ledgers]
    stop = asyncio.Event()
    interval = 2 * config.keys / config.rate
    drained = False
    async with Producer(lookupd=lookupd, lookup_options=lookup_options,
                        timeout=config.publish_timeout) as producer:
        for consumer in consumers:
            await consumer.start()
        try:
            started = time.monotonic()
            publishers = [asyncio.create_task(_publish_key(
                producer, ledger, f"k{i}", interval, stop, config.publish_timeout))
                for ledger in ledgers for i in range(config.keys)]
            await _inject(cluster, config, schedule, started, injected)
            remaining = started + config.seconds - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)
            stop.set()
            await asyncio.gather(*publishers)
            ended = time.monotonic()
            drained = await _drain(ledgers, config.drain_seconds)
        finally:
            stop.set()
            for consumer in consumers:
                with contextlib.suppress(Exception):
                    await consumer.close(5.0)
    return ChaosReport(config, injected, [ledger.report(started, ended) for ledger in ledgers],
                       seconds=time.monotonic() - began, drained=drained)


async def _drain(ledgers: Sequence[_Ledger], seconds: float) -> bool:
    """Wait until every acknowledged message was delivered (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    while not all(ledger.drained() for ledger in ledgers):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        waiting = [ledger for ledger in ledgers if not ledger.drained()]
        for ledger in waiting:
            ledger.changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(ledger.changed.wait() for ledger in waiting)), min(left, 1.0))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smartnsq.devcluster.chaos",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0, help="fault injection time")
    parser.add_argument("--profile", default="realistic")
    parser.add_argument("--time-scale", type=float, default=0.03)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--publish-timeout", type=float, default=10.0)
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        config = ChaosConfig(seed=args.seed, seconds=args.seconds,
                             profile=profile_named(args.profile, args.time_scale, args.seed),
                             rate=args.rate, partitions=args.partitions,
                             replicas=args.replicas, publish_timeout=args.publish_timeout,
                             drain_seconds=args.drain_seconds)
    except ValueError as exc:
        parser.error(str(exc))
    report = asyncio.run(run_chaos(config))
    print(report.format())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
