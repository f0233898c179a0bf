"""Leader loss on the real youzan servers: how long a partition cannot be read or written.

    python bench/leader_loss.py [--real DIR] [--replicas 2 3] [--signals kill term] [--runs 2]

For each replica count, signal and run: a fresh ``RealCluster`` (etcd, 2 nsqlookupd, 3 nsqd),
a topic of 4 partitions with that many replicas, ``--messages`` messages published to each
partition, then SIGKILL (``kill``) or SIGTERM (``term``) of the nsqd leading partition 0.
From the signal on, every ``--poll`` seconds, the script asks what a reader and a writer of
partition 0 would get, exactly as the Spark source's range reads ask it:

* (a) **lookup**: when the readers' lookup (``access=r``) first names a leader other than the
  one signalled;
* (b) **SUB**: when that leader first takes a range read's steps: a channel created over HTTP
  (``/channel/create``), moved to the partition's first offset (``/channel/setoffset``) and
  subscribed (``SUB_ADVANCED``, RDY 1); each refusal before that is kept with its step and
  the server's exact text (the first and last time it was seen);
* (c) **read**: when the first message is read there;
* (d) **write**: when a publish pinned to partition 0 (``Producer``, 1.5 s timeout) is first
  acknowledged again.

It also probes the other three partitions in each round and prints, per case, the longest
time one of them could not be read (with the same steps). Times are seconds after the
signal. The figures are the Spark source's defaults (``leaderTimeout``) and are in
docs/spark.md and docs/reliability.md ("Leader loss").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _common import command_line, environment

from smartnsq import Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.errors import NSQError
from smartnsq.spark.cluster import ClusterClient, LeaderInfo, temporary_channel
from smartnsq.spark.options import ClusterOptions, ConnectionOptions
from smartnsq.spark.ranges import RangeReader
from smartnsq.testing.realcluster import RealCluster
from smartnsq.transport import loop_thread as _loop_thread

PARTITIONS = 4


@dataclass
class Refusal:
    step: str
    text: str
    first: float
    last: float
    count: int = 1


@dataclass
class Case:
    replicas: int
    signal: str
    run: int
    lookup: float | None = None
    sub: float | None = None
    read: float | None = None
    write: float | None = None
    refusals: dict[tuple[str, str], Refusal] = field(default_factory=dict)
    others_out: float = 0.0  # longest time one of partitions 1-3 could not be read
    others_refusals: dict[tuple[str, str], Refusal] = field(default_factory=dict)
    leaders_after: dict[int, str] = field(default_factory=dict)
    note: str = ""


def _refused(book: dict[tuple[str, str], Refusal], step: str, text: str, at: float) -> None:
    key = (step, text)
    seen = book.get(key)
    if seen is None:
        book[key] = Refusal(step, text, at, at)
    else:
        seen.last = at
        seen.count += 1


_NAMES = re.compile(r"bench-ll-[0-9a-f]+|ll_r\d_\w+?_\d+_\d+|127\.0\.0\.1:\d+")


def _short(exc: BaseException) -> str:
    """The error's first line, with channel, topic and address names made generic (so the
    same refusal counts once)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return _NAMES.sub("*", f"{type(exc).__name__}: {text}")[:300]


def probe(loop_thread: Any, client: ClusterClient, topic: str, partition: int,
          leader: LeaderInfo, start: int, end: int) -> tuple[str, str | None]:
    """One range read's steps on ``leader``: ("read", None) when a message was read, else
    (the step that failed, what it raised)."""
    name = temporary_channel("bench-ll")
    step = "create"
    reader: RangeReader | None = None
    created = False
    try:
        client.create_channel(topic, partition, leader, name)
        created = True
        step = "setoffset"
        client.set_offset(topic, partition, leader, name, start)
        step = "sub"
        reader = RangeReader(topic, partition, leader, name, start, end, ordered=False,
                             ext=False, rdy=1, limit=1, config=client.connection_config)
        loop_thread.run(reader.open(), timeout=5)
        step = "read"
        batch = loop_thread.run(reader.next_batch(2.0), timeout=5)
        if not batch:
            return "read", "no message"
        return "read", None
    except Exception as exc:  # every refusal is a measurement
        return step, _short(exc)
    finally:
        if reader is not None:
            with contextlib.suppress(Exception):
                loop_thread.run(reader.close(), timeout=5)
        if created:
            with contextlib.suppress(NSQError):
                client.delete_channel(topic, partition, leader, name)


async def run_case(args: argparse.Namespace, replicas: int, signal: str, run: int) -> Case:
    case = Case(replicas, signal, run)
    topic = f"ll_r{replicas}_{signal}_{run}_{os.getpid() % 10000}"
    async with RealCluster(nodes=3, lookupds=2, binaries=args.real or None) as cluster:
        lookupd = cluster.lookupd_http_addresses
        await cluster.create_topic(topic, PARTITIONS, replicas, channels=["default"])
        async with Producer(lookupd=lookupd, timeout=10) as producer:
            for p in range(PARTITIONS):
                await producer.publish_many(topic, [b"m%d-%d" % (p, i)
                                                    for i in range(args.messages)],
                                            partition=p)
        async with AsyncAdmin(lookupd, timeout=2.0) as admin:
            view = await admin.lookup(topic, "r")
            leaders = {p: LeaderInfo.of(n) for p, n in view.leaders().items()}
        old = leaders[0]
        victim = cluster.node(old.tcp_address)
        ends: dict[int, int] = {}
        with ClusterClient(ClusterOptions(lookupd=tuple(lookupd), nsqd_http=(),
                                          http_timeout=2.0,
                                          connection=ConnectionOptions())) as client:
            for p, leader in leaders.items():
                first, last = await asyncio.to_thread(client.bounds, topic, p, leader)
                assert first == 0, (p, first)
                ends[p] = last
            began = time.monotonic()
            if signal == "kill":
                await cluster.kill_node(victim)
            else:
                await cluster.leave_node(victim)

            def now() -> float:
                return time.monotonic() - began

            writer = asyncio.create_task(_until_written(lookupd, topic, case, now,
                                                        args.timeout))
            loop_thread = _loop_thread.shared()
            out_since: dict[int, float] = {}
            try:
                async with AsyncAdmin(lookupd, timeout=2.0) as admin:
                    while now() < args.timeout:
                        try:
                            view = await admin.lookup(topic, "r")
                            current = {p: LeaderInfo.of(n) for p, n in view.leaders().items()}
                        except NSQError as exc:
                            _refused(case.refusals, "lookup", _short(exc), now())
                            current = {}
                        leader = current.get(0)
                        if leader is None:
                            _refused(case.refusals, "lookup", "no leader for partition 0",
                                     now())
                        elif leader.tcp_address == old.tcp_address:
                            _refused(case.refusals, "lookup", "names the signalled leader",
                                     now())
                        else:
                            if case.lookup is None:
                                case.lookup = now()
                            if case.read is None:
                                step, error = await asyncio.to_thread(
                                    probe, loop_thread, client, topic, 0, leader, 0, ends[0])
                                at = now()
                                if error is None:
                                    case.read = at
                                    if case.sub is None:
                                        case.sub = at
                                else:
                                    if step == "read" and case.sub is None:
                                        case.sub = at
                                    _refused(case.refusals, step, error, at)
                        for p in range(1, PARTITIONS):
                            other = current.get(p)
                            if other is None:
                                step, error = "lookup", "no leader"
                            else:
                                step, error = await asyncio.to_thread(
                                    probe, loop_thread, client, topic, p, other, 0, ends[p])
                            at = now()
                            if error is None:
                                since = out_since.pop(p, None)
                                if since is not None:
                                    case.others_out = max(case.others_out, at - since)
                            else:
                                out_since.setdefault(p, at)
                                _refused(case.others_refusals, f"p{p} {step}", error, at)
                        if case.read is not None and case.write is not None \
                                and not out_since:
                            break
                        await asyncio.sleep(args.poll)
                    else:
                        case.note = f"gave up at {args.timeout:g}s"
                    for since in out_since.values():
                        case.others_out = max(case.others_out, now() - since)
                    with contextlib.suppress(NSQError):
                        view = await admin.lookup(topic, "r")
                        case.leaders_after = {p: f"{n.tcp_port}"
                                              for p, n in view.leaders().items()}
            finally:
                _loop_thread.release_shared(loop_thread)
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
    return case


async def _until_written(lookupd: list[str], topic: str, case: Case,
                         now: Callable[[], float], limit: float) -> None:
    async with Producer(lookupd=lookupd, timeout=1.5) as producer:
        for i in itertools.count():
            if now() >= limit:
                return
            try:
                await producer.publish(topic, b"after-%d" % i, partition=0, timeout=1.5)
            except NSQError as exc:
                _refused(case.refusals, "publish", _short(exc)[:120], now())
                await asyncio.sleep(0.2)
                continue
            case.write = now()
            return


def _t(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def report(cases: list[Case]) -> str:
    lines = ["| replicas | signal | run | (a) lookup names a new leader | (b) SUB taken | "
             "(c) first message read | (d) write acknowledged | other partitions unreadable "
             "(longest) |", "|---|---|---|---|---|---|---|---|"]
    for c in cases:
        lines.append(f"| {c.replicas} | {c.signal} | {c.run} | {_t(c.lookup)} | {_t(c.sub)} | "
                     f"{_t(c.read)} | {_t(c.write)} | {c.others_out:.1f} {c.note} |")
    lines.append("")
    lines.append("Refusals of partition 0 (step: server's text, first..last seen, count):")
    for c in cases:
        lines.append(f"  replicas {c.replicas} {c.signal} run {c.run}:")
        for r in sorted(c.refusals.values(), key=lambda r: r.first):
            lines.append(f"    {r.step}: {r.text}  [{r.first:.1f}..{r.last:.1f} s, {r.count}x]")
        for r in sorted(c.others_refusals.values(), key=lambda r: r.first):
            lines.append(f"    (other) {r.step}: {r.text}  [{r.first:.1f}..{r.last:.1f} s, "
                         f"{r.count}x]")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", default="", metavar="DIR",
                        help="the real binaries (default: $SMARTNSQ_REAL_NSQ)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--signals", nargs="+", choices=("kill", "term"),
                        default=["kill", "term"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--messages", type=int, default=50, help="per partition")
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between rounds")
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="seconds after the signal before a case gives up")
    args = parser.parse_args()
    cases: list[Case] = []
    began = time.monotonic()
    for replicas, signal, run in itertools.product(args.replicas, args.signals,
                                                   range(1, args.runs + 1)):
        case = asyncio.run(run_case(args, replicas, signal, run))
        cases.append(case)
        print(f"replicas {replicas} {signal} run {run}: lookup {_t(case.lookup)} sub "
              f"{_t(case.sub)} read {_t(case.read)} write {_t(case.write)} others out "
              f"{case.others_out:.1f} {case.note}", flush=True)
    print()
    print(report(cases))
    print(f"\nwall time {time.monotonic() - began:.0f} s")
    print(f"command: {command_line()}")
    print(environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
