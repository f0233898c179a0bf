"""Ordered drain time of a backlog: the first SUB_ORDERED of a fresh channel, run after run.

    python bench/ordered_drain.py [--runs 10] [--count 20000] [--keys 200]
                                  [--real DIR | --dev [--first-twice MODE] [--msg-timeout S]]

Each run publishes ``--count`` messages over ``--keys`` sharding keys (each key's messages in
order, ``publish_many`` per key) to a fresh ordered topic of 4 partitions x 2 replicas, with
channel ``bench`` created before anything is written, then drains them with smartnsq's
``Consumer`` (``ordered=True``: SUB_ORDERED, one message in flight per partition) and prints
how long the drain took: from the consumer's start to the last distinct message handled. The
handler checks each key's order; the consumer's duplicate and error counters are printed
beside the time.

The channel is fresh and has a backlog at its first SUB_ORDERED: this is where the real youzan
nsqd (0.3.7-HA.1.13.0) delivers each partition's first message twice (``docs/devcluster.md``).
A copy left unanswered while the server counts it in flight holds its partition until the
server's ``msg_timeout`` (60 s by default): a client that left it so drained in 62 s instead
of 2.3 s, in 2 of 3 drains.

The cluster is the real one when ``--real DIR`` is given or ``SMARTNSQ_REAL_NSQ`` is set
(``smartnsq.testing.realcluster.RealCluster``: etcd, 2 nsqlookupd, 3 nsqd, all started here and
stopped at the end), otherwise the dev cluster (3 nsqd, 2 lookupds) in a child process, with
``ordered_first_delivery_twice`` set to ``--first-twice`` (``random`` by default: each
channel's copy goes out while the original is in flight or after its FIN, at random) and the
nsqd's ``msg_timeout`` set to ``--msg-timeout`` seconds (60 by default, the real default).
``--timeout`` bounds each drain (a stalled run is reported as such, and the next run goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed copy

CHANNEL = "bench"
PARTITIONS = 4
REPLICAS = 2
BODY = 100


def key(k: int) -> str:
    return f"key-{k}"


def body_for(name: str, seq: int) -> bytes:
    return f"{name}:{seq}:".encode().ljust(BODY, b"x")


async def preload(lookupd: list[str], topic: str, count: int, keys: int) -> None:
    from smartnsq import Producer

    per_key = count // keys
    async with Producer(lookupd=lookupd, sharded_receipts=False) as producer:
        for k in range(keys):
            name = key(k)
            await producer.publish_many(topic, [body_for(name, s) for s in range(per_key)],
                                        sharding_key=name, timeout=30)


class ClientLog(logging.Handler):
    """What the client logs, per run: error frames and warnings (shown), and how its
    duplicate copies went (counted from the consumer's debug lines: copies dropped while the
    original was pending, copies FINed after the original's FIN, and the E_FIN_FAILED those
    FINs got when the server had not counted the copy in flight)."""

    KINDS = {"the copy is dropped": "copies_dropped",
             "the copy is FINed too": "copies_fined",
             "had not counted in flight (expected)": "copy_fin_failed"}

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.counts: dict[str, int] = dict.fromkeys(self.KINDS.values(), 0)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        for needle, kind in self.KINDS.items():
            if needle in text:
                self.counts[kind] += 1
                return
        if record.levelno >= logging.WARNING or (record.levelno >= logging.INFO
                                                 and " E_" in text):
            self.lines.append(f"{record.levelname} {record.name}: {text}")

    def take(self) -> tuple[dict[str, int], list[str]]:
        counts, lines = self.counts, self.lines
        self.counts, self.lines = dict.fromkeys(self.KINDS.values(), 0), []
        return counts, lines


async def drain(lookupd: list[str], topic: str, count: int, timeout: float) -> dict[str, Any]:
    from smartnsq import Consumer

    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    last: dict[bytes, int] = {}
    result: dict[str, Any] = {"handled": 0, "distinct": 0, "repeated": 0, "out_of_order": 0}

    def handle(message: Any) -> None:
        result["handled"] += 1
        name, seq_text, _ = message.body.split(b":", 2)
        seq = int(seq_text)
        prev = last.get(name, -1)
        if seq <= prev:
            result["repeated"] += 1  # a redelivery (at-least-once), never out of order
            return
        if seq != prev + 1:
            result["out_of_order"] += 1
        last[name] = seq
        result["distinct"] += 1
        if result["distinct"] == count and not done.done():
            done.set_result(None)

    consumer = Consumer(topic, CHANNEL, lookupd=lookupd, handler=handle, ordered=True,
                        max_in_flight=PARTITIONS * 4)
    started = time.monotonic()
    cpu = time.process_time()
    await consumer.start()
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
        result["seconds"] = time.monotonic() - started
    except asyncio.TimeoutError:
        result["seconds"] = None  # stalled past the bound
    result["client_cpu_s"] = round(time.process_time() - cpu, 2)
    stats = consumer.stats()
    await consumer.close(timeout=5)
    for name in ("duplicates_dropped", "server_errors", "order_errors", "finished",
                 "requeued"):
        if name in stats:
            result[name] = stats[name]
    return result


async def one_run(cluster: Any, run: int, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"ordrain_{os.getpid()}_{run}"
    await cluster.create_topic(topic, PARTITIONS, REPLICAS, ordered=True, channels=[CHANNEL],
                               timeout=180)
    lookupd = list(cluster.lookupd_http_addresses)
    await preload(lookupd, topic, args.count, args.keys)
    return await drain(lookupd, topic, args.count, args.timeout)


class DevProcess:
    """The dev cluster in a child process (so the client's process is the client alone)."""

    def __init__(self, first_twice: str, msg_timeout: float) -> None:
        self.first_twice = first_twice
        self.msg_timeout = msg_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.lookupd_http_addresses: list[str] = []

    async def __aenter__(self) -> DevProcess:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-dev", self.first_twice, str(self.msg_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, self.proc.stdout.readline)
        if not line:
            raise RuntimeError("the dev cluster did not start")
        self.lookupd_http_addresses = json.loads(line)["lookupd"]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the child stops when its stdin closes
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    async def create_topic(self, name: str, partitions: int, replicas: int, *,
                           ordered: bool, channels: list[str], timeout: float) -> None:
        from smartnsq.admin import AsyncAdmin

        async with AsyncAdmin(self.lookupd_http_addresses, timeout=5.0) as admin:
            await admin.create_topic(name, partitions, replicas, ordered=ordered,
                                     channels=channels, timeout=timeout, resend_interval=1.0,
                                     poll_interval=0.05)


def serve_dev(first_twice: str, msg_timeout: float) -> int:
    """Child: a dev cluster until stdin closes; its lookupds' addresses on stdout."""
    from smartnsq.devcluster import DevCluster

    mode: bool | str = {"on": True, "off": False}.get(first_twice, first_twice)

    async def serve() -> None:
        options = {"ordered_first_delivery_twice": mode,
                   "msg_timeout": round(msg_timeout * 1000)}
        async with DevCluster(nodes=3, lookupds=2, nsqd_options=options) as cluster:
            print(json.dumps({"lookupd": cluster.lookupd_http_addresses}), flush=True)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, sys.stdin.read)

    asyncio.run(serve())
    return 0


async def main_async(args: argparse.Namespace) -> int:
    real = args.real or (None if args.dev else os.environ.get("SMARTNSQ_REAL_NSQ"))
    if real:
        from smartnsq.testing.realcluster import RealCluster

        cluster: Any = RealCluster(nodes=3, lookupds=2, binaries=real)
        where = f"real youzan cluster ({real}): etcd, 2 nsqlookupd, 3 nsqd"
    else:
        cluster = DevProcess(args.first_twice, args.msg_timeout)
        where = (f"dev cluster (3 nsqd, 2 lookupds), ordered_first_delivery_twice="
                 f"{args.first_twice}, msg_timeout={args.msg_timeout:g}s")
    import smartnsq

    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# smartnsq from {Path(smartnsq.__file__).parent}")
    print(f"# {where}; {args.count} messages, {args.keys} keys, {PARTITIONS} partitions x "
          f"{REPLICAS} replicas, ordered consumer, drain bound {args.timeout:g}s")
    times: list[float] = []
    stalled = 0
    client_log = ClientLog()
    smartnsq_log = logging.getLogger("smartnsq")
    smartnsq_log.addHandler(client_log)
    smartnsq_log.setLevel(logging.INFO)
    smartnsq_log.propagate = False
    logging.getLogger("smartnsq.consumer").setLevel(logging.DEBUG)  # a few lines per run
    async with cluster:
        for run in range(1, args.runs + 1):
            result = await one_run(cluster, run, args)
            seconds = result.pop("seconds")
            if seconds is None:
                stalled += 1
                shown = f"STALLED (> {args.timeout:g} s)"
            else:
                times.append(seconds)
                shown = f"{seconds:7.2f} s"
            counts, lines = client_log.take()
            extras = " ".join(f"{k}={v}" for k, v in {**result, **counts}.items())
            load = os.getloadavg()[0]
            print(f"run {run:2d}: drain {shown}  {extras} load1={load:.1f}", flush=True)
            for line in lines:
                print(f"        {line}", flush=True)
    if times:
        under = sum(1 for t in times if t < args.goal)
        print(f"# {len(times)} drained, {stalled} stalled; median "
              f"{statistics.median(times):.2f} s, max {max(times):.2f} s; under {args.goal:g} s "
              f"in {under} of {args.runs}")
    else:
        print(f"# every run stalled (bound {args.timeout:g} s)")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--serve-dev"]:
        return serve_dev(sys.argv[2], float(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--real", default="", metavar="DIR",
                        help="the real binaries' folder (default: $SMARTNSQ_REAL_NSQ)")
    parser.add_argument("--dev", action="store_true",
                        help="the dev cluster even when SMARTNSQ_REAL_NSQ is set")
    parser.add_argument("--first-twice", default="random",
                        help="dev cluster: ordered_first_delivery_twice (off, on, before, "
                             "after, random)")
    parser.add_argument("--msg-timeout", type=float, default=60.0,
                        help="dev cluster: nsqd msg_timeout in seconds (default 60)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="bound of each drain in seconds (default 120)")
    parser.add_argument("--goal", type=float, default=5.0, help="target drain time (5 s)")
    args = parser.parse_args()
    args.count -= args.count % args.keys
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
