"""Recovery pace: how soon a Producer and a Consumer resume after a partition is writable
again, and how many refused commands they send the server meanwhile.

    SMARTNSQ_REAL_NSQ=/path/to/realnsq python bench/recovery_pace.py [--fault leave|kill]
                                                                     [--bound 300] [--json]

A real youzan cluster (``smartnsq.testing.realcluster``: etcd, 2 nsqlookupd, 3 nsqd) with a
3-partition x 2-replica topic and one channel. A ``Producer`` (default options) publishes
without a pause, two publishers per partition, each publish pinned to its partition with a
10 s timeout; a ``Consumer`` (default options) reads the channel. Then the nsqd leading
partition 0 leaves (``--fault leave``, SIGTERM, the default) or is SIGKILLed (``kill``) and
stays down. After a leave the leadership moves at once, but with replica 2 the new leader is
below its write quorum: it refuses PUB, and SUB (its channels are disabled, as a former
replica's are), with ``E_FAILED_ON_NOT_WRITABLE`` until a spare node has caught up (about
two minutes). After a kill the partitions it led have no leader until etcd's session expires
(21-49 s), then the same wait for a spare; a live leader that lost a replica leaves PUBs
unanswered for ~12 s.

Per partition the script prints, in seconds from the kill:

* ``writable``: when the server took writes again, the earliest of: the lookupds listing the
  partition for writers again (``access=w``, polled every 0.2 s by an observer of its own) and
  the producer's first acknowledgement after the kill;
* ``producer +``: the producer's first acknowledgement after the kill, past ``writable``;
* ``consumer +``: the consumer's first delivery of a message published after the kill, past
  ``writable``: the resume delay of the consumer;

and for the run: the refused commands (``E_FAILED_ON_NOT_WRITABLE``) the surviving nsqd logged
(``PUB``/``SUB``), the same refusals as the clients counted them, and both per minute of
outage (from the kill until the last partition was writable again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.errors import NSQError
from smartnsq.message import Message
from smartnsq.testing.realcluster import RealCluster

TOPIC = "pace"
CHANNEL = "ch"
PARTITIONS: tuple[int, ...] = (0, 1)
PUBLISH_TIMEOUT = 10.0
OBSERVE_EVERY = 0.2  # s between the observer's access=w lookups
AFTER = 20  # deliveries per partition after writes came back before the run ends


@dataclass
class Run:
    kill_at: float = 0.0
    acked: dict[int, list[float]] = field(default_factory=lambda: {p: [] for p in PARTITIONS})
    published_at: dict[bytes, float] = field(default_factory=dict)
    delivered: dict[int, list[tuple[float, float]]] = field(
        default_factory=lambda: {p: [] for p in PARTITIONS})  # (published, delivered)
    listed_w: dict[int, list[tuple[float, bool]]] = field(
        default_factory=lambda: {p: [] for p in PARTITIONS})  # (when, listed for writers)
    client_refusals: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[tuple[float, str]] = field(default_factory=list)

    def first_ack_after_outage(self, p: int) -> float | None:
        """The acknowledgement ending the partition's longest pause after the fault (the
        first one after the fault when it never paused for more than a second)."""
        acks = sorted(t for t in self.acked[p] if t > self.kill_at)
        best, last, end = 1.0, self.kill_at, acks[0] if acks else None
        for t in acks:
            if t - last > best:
                best, end = t - last, t
            last = t
        return end

    def writable_again(self, p: int) -> float | None:
        """When the partition took writes again after the kill (see the module docstring)."""
        first_ack = self.first_ack_after_outage(p)
        gone = False
        listed = None
        for when, on in self.listed_w[p]:
            if when <= self.kill_at:
                continue
            if not on:
                gone = True
            elif gone:
                listed = when
                break
        moments = [t for t in (first_ack, listed) if t is not None]
        return min(moments) if moments else None

    def first_delivery_after(self, p: int, moment: float) -> float | None:
        return next((got for published, got in self.delivered[p]
                     if published > self.kill_at and got >= moment), None)


class Refusals(logging.Handler):
    """Counts the refused SUBs the consumer logs (and keeps its records for the timeline);
    refused PUBs are taken from ``Producer.stats()``."""

    def __init__(self, run: Run) -> None:
        super().__init__(logging.DEBUG)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.name == "smartnsq.consumer" and record.levelno >= logging.INFO:
            self.run.events.append((time.monotonic(), text[:160]))
        if "E_FAILED_ON_NOT_WRITABLE" not in text:
            return
        if record.name == "smartnsq.consumer":  # (a refused SUB: WARNING once, then DEBUG)
            self.run.client_refusals["SUB"] += 1


async def _publisher(producer: Producer, run: Run, partition: int, worker: int) -> None:
    n = 0
    while not run.stop.is_set():
        body = b"p%d-w%d-%d" % (partition, worker, n)
        n += 1
        started = time.monotonic()
        run.published_at[body] = started
        try:
            await producer.publish(TOPIC, body, partition=partition, timeout=PUBLISH_TIMEOUT)
        except NSQError as exc:
            run.failures[type(exc).__name__] += 1
            continue
        run.acked[partition].append(time.monotonic())


async def _observer(admin: AsyncAdmin, run: Run) -> None:
    while not run.stop.is_set():
        now = time.monotonic()
        try:
            view = await admin.lookup(TOPIC, "w", timeout=1.0)
        except NSQError:
            listed: set[int] = set()
        else:
            listed = {p for p, part in view.partitions.items() if part.leader is not None}
        for p in PARTITIONS:
            run.listed_w[p].append((now, p in listed))
        await asyncio.sleep(OBSERVE_EVERY)


def _done(run: Run) -> bool:
    for p in PARTITIONS:
        back = run.writable_again(p)
        if back is None:
            return False
        if sum(1 for published, got in run.delivered[p]
               if published > run.kill_at and got >= back) < AFTER:
            return False
    return True


_REFUSED = re.compile(rb"FAILED_ON_NOT_WRITABLE|failed on not writable|consume disabled",
                      re.IGNORECASE)


def _server_refusals(cluster: RealCluster, since_bytes: dict[str, int]) -> Counter[str]:
    """Refusals the nsqd logged since the kill (lines naming the refusal, by command)."""
    counts: Counter[str] = Counter()
    for node in cluster.nodes:
        try:
            data = node.log_path.read_bytes()[since_bytes.get(node.name, 0):]
        except OSError:
            continue
        for line in data.splitlines():
            if b"sub failed" in line.lower() or (b"SUB" in line and _REFUSED.search(line)):
                counts["SUB"] += 1
            elif _REFUSED.search(line):
                counts["PUB/other"] += 1
    return counts


async def main(args: argparse.Namespace) -> dict[str, Any]:
    global PARTITIONS
    PARTITIONS = tuple(range(args.partitions))
    run = Run()
    logging.getLogger("smartnsq").setLevel(logging.DEBUG)
    logging.getLogger("smartnsq").addHandler(Refusals(run))
    async with RealCluster(nodes=3, lookupds=2) as cluster:
        await cluster.create_topic(TOPIC, partitions=len(PARTITIONS), replicas=2,
                                   channels=[CHANNEL])

        def handle(message: Message) -> None:
            published = run.published_at.get(bytes(message.body), 0.0)
            p = message.partition
            if p in run.delivered:
                run.delivered[p].append((published, time.monotonic()))

        lookupd = cluster.lookupd_http_addresses
        async with AsyncAdmin(lookupd, timeout=2.0) as admin, \
                Producer(lookupd=lookupd) as producer, \
                Consumer(TOPIC, CHANNEL, lookupd=lookupd, handler=handle) as consumer:
            tasks = [asyncio.create_task(_publisher(producer, run, p, w))
                     for p in PARTITIONS for w in (0, 1)]
            tasks.append(asyncio.create_task(_observer(admin, run)))
            deadline = time.monotonic() + 60
            while not all(run.delivered[p] for p in PARTITIONS):
                assert time.monotonic() < deadline, "no delivery before the fault"
                await asyncio.sleep(0.1)
            view = await admin.lookup(TOPIC, "w")
            leader = view.partitions[0].leader
            assert leader is not None
            nodes = list(cluster.nsqd_tcp_addresses)
            victim = nodes.index("{}:{}".format(*leader.address))
            if args.fault == "replica":  # a node leading nothing (it holds replicas)
                leading = {"{}:{}".format(*part.leader.address)
                           for part in view.partitions.values() if part.leader is not None}
                idle = [i for i, a in enumerate(nodes) if a not in leading]
                assert idle, f"every nsqd leads a partition: {sorted(leading)}"
                victim = idle[0]
            offsets = {n.name: n.log_path.stat().st_size for n in cluster.nodes}
            run.kill_at = time.monotonic()
            if args.fault in ("kill", "replica"):
                await cluster.kill_node(victim)
            else:
                await cluster.leave_node(victim)
            print(f"{args.fault}: nsqd {victim} ({nodes[victim]}); waiting up to "
                  f"{args.bound:g}s", flush=True)
            until = run.kill_at + args.bound
            while not _done(run) and time.monotonic() < until:
                await asyncio.sleep(0.2)
            run.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            stats = consumer.stats()
            pstats = producer.stats()
            # the producer's own count of refused attempts (log records of the same kind
            # are folded by smartnsq's repeat filter, so the records alone undercount)
            run.client_refusals["PUB"] = (pstats.retried.get("E_FAILED_ON_NOT_WRITABLE", 0)
                                          + pstats.failed.get("E_FAILED_ON_NOT_WRITABLE", 0))
        server = _server_refusals(cluster, offsets)
    report: dict[str, Any] = {"partitions": {}}
    backs = []
    for p in PARTITIONS:
        back = run.writable_again(p)
        first_ack = run.first_ack_after_outage(p)
        got = run.first_delivery_after(p, back) if back is not None else None
        report["partitions"][p] = {
            "writable": None if back is None else round(back - run.kill_at, 2),
            "producer_resume": None if back is None or first_ack is None
            else round(first_ack - back, 2),
            "consumer_resume": None if back is None or got is None else round(got - back, 2)}
        if back is not None:
            backs.append(back)
    outage = (max(backs) - run.kill_at) / 60 if backs else args.bound / 60
    report["outage_min"] = round(outage, 2)
    report["server_refusals"] = dict(server)
    report["client_refusals"] = dict(run.client_refusals)
    report["per_minute"] = {k: round(v / outage, 1) for k, v in
                            {**{f"server {k}": v for k, v in server.items()},
                             **{f"client {k}": v for k, v in run.client_refusals.items()}}
                            .items()}
    report["consumer_subscribe_failures"] = stats.subscribe_failures
    report["consumer_server_errors"] = dict(stats.server_errors)
    report["producer_retried"] = {str(k): v for k, v in pstats.retried.items()}
    report["publish_failures"] = dict(run.failures)
    report["timeline"] = _timeline(run)
    return report


def _gaps(times: list[float], since: float, least: float = 1.0) -> list[tuple[float, float]]:
    """(start, length) of the gaps longer than ``least`` s in ``times`` after ``since``."""
    out = []
    last = since
    for t in sorted(t for t in times if t >= since):
        if t - last > least:
            out.append((round(last - since, 2), round(t - last, 2)))
        last = t
    return out


def _timeline(run: Run) -> dict[str, Any]:
    k = run.kill_at
    out: dict[str, Any] = {}
    for p in PARTITIONS:
        flips = []
        state = None
        for when, on in run.listed_w[p]:
            if on != state:
                flips.append((round(when - k, 2), on))
                state = on
        out[f"p{p} acks: gaps"] = _gaps(run.acked[p], k)
        out[f"p{p} deliveries: gaps"] = _gaps([g for _, g in run.delivered[p]], k)
        out[f"p{p} listed for writers"] = flips
    out["consumer events"] = [(round(t - k, 2), text) for t, text in run.events if t >= k - 1]
    return out


def _print(report: dict[str, Any]) -> None:
    print("partition  writable(s after kill)  producer +s  consumer +s")
    for p, row in report["partitions"].items():
        print(f"{p:>9}  {row['writable']!s:>22}  {row['producer_resume']!s:>11}  "
              f"{row['consumer_resume']!s:>11}")
    print(f"outage {report['outage_min']} min; refused (nsqd log): "
          f"{report['server_refusals']}; refused (clients): {report['client_refusals']}; "
          f"per minute of outage: {report['per_minute']}")
    print(f"consumer subscribe failures {report['consumer_subscribe_failures']}, server "
          f"errors {report['consumer_server_errors']}; producer retries "
          f"{report['producer_retried']}; publish failures {report['publish_failures']}")
    for name, value in report["timeline"].items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=float, default=300.0,
                        help="longest wait for recovery after the kill (s)")
    parser.add_argument("--fault", choices=("replica", "leave", "kill"), default="replica",
                        help="SIGKILL of a node leading nothing, SIGTERM (a graceful leave) or "
                        "SIGKILL of partition 0's leader")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    print(json.dumps(result, indent=1) if ns.json else "", end="")
    if not ns.json:
        _print(result)
