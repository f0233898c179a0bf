"""A pynsq program moved to smartnsq by changing one import.

    python examples/pynsq_migration.py               # smartnsq.compat.pynsq, embedded cluster
    python examples/pynsq_migration.py --pynsq       # the same program on pynsq itself
    python examples/pynsq_migration.py --youzan      # smartnsq against a youzan cluster
    python examples/pynsq_migration.py --count 5000  # (with or without --pynsq) timing
    python examples/pynsq_migration.py --bench 20000 # publish, then consume, timed apart

``program(nsq, ...)`` below is written the way pynsq's documentation writes programs: a
``Writer`` publishing with a ``callback(conn, data)``, a ``Reader`` whose handler uses
``message.enable_async()`` to buffer messages and finish them in batches (pynsq's
"asynchronous example"), ``nsq.run()``, and a SIGTERM to stop (``nsq.run()`` stops on it).
It only ever touches ``nsq``: the module passed in is either pynsq (``import nsq``) or
smartnsq's compat layer (``from smartnsq.compat import pynsq as nsq``), nothing else changes.

On a youzan cluster the same program reads every partition of the topic; its Writer, given
nsqd addresses, writes each node's default partition (``lookupd_http_addresses=`` instead is
smartnsq's extension that writes to partition leaders).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any

from smartnsq import LoopThread
from smartnsq.devcluster import DevCluster

TOPIC = "nsq_reader"
CHANNEL = "async"
COUNT = 9


def program(nsq: ModuleType, nsqd_tcp_addresses: list[str],
            lookupd_http_addresses: list[str], count: int = COUNT) -> list[bytes]:
    """The pynsq program: only ``nsq`` differs between the two runs."""
    buf: list[Any] = []
    received: list[bytes] = []
    published: list[Any] = []

    def finish_pub(conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            print("publish failed:", data)
        published.append(data)

    def process_message(message: Any) -> None:
        message.enable_async()
        # cache the message for later processing
        buf.append(message)
        if len(buf) >= 3:
            for msg in buf:
                received.append(msg.body)
                if count <= COUNT:
                    print("  got", msg.body.decode(), "attempts", msg.attempts)
                msg.finish()
            buf.clear()
        elif count <= COUNT:
            print("  deferring processing")
        if len(received) >= count:
            os.kill(os.getpid(), signal.SIGTERM)  # how a pynsq service is stopped

    writer = nsq.Writer(nsqd_tcp_addresses)

    def publish_all(conn: Any = None, data: Any = None) -> None:
        for i in range(count):
            writer.pub(TOPIC, b"hello %d" % i, finish_pub)

    # no reference kept, as pynsq allows: its IOLoop holds an open Reader, and so does the
    # compat layer (until close())
    nsq.Reader(message_handler=process_message, lookupd_http_addresses=lookupd_http_addresses,
               topic=TOPIC, channel=CHANNEL, max_in_flight=9, lookupd_poll_interval=1)
    # pynsq's Writer connects once run() runs: publish from the loop, a moment later
    writer.io_loop.call_later(0.5, publish_all)
    nsq.run()
    return received


def bench(nsq: ModuleType, nsqd_tcp_addresses: list[str], count: int) -> None:
    """Time ``count`` publishes (Writer, callbacks), then their consumption (Reader)."""
    writer = nsq.Writer(nsqd_tcp_addresses)
    acked: list[Any] = []
    marks: dict[str, float] = {}

    def finish_pub(conn: Any, data: Any) -> None:
        acked.append(data)
        if len(acked) == count:
            marks["published"] = time.perf_counter()
            nsq.Reader("bench", "c", handler, nsqd_tcp_addresses=nsqd_tcp_addresses,
                       max_in_flight=200)

    handled = [0]

    def handler(message: Any) -> bool:
        if not handled[0]:
            marks["first"] = time.perf_counter()
        handled[0] += 1
        if handled[0] == count:
            marks["handled"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGTERM)
        return True

    def publish_all() -> None:
        marks["start"] = time.perf_counter()
        for _ in range(count):
            writer.pub("bench", b"x" * 100, finish_pub)

    writer.io_loop.call_later(0.5, publish_all)
    nsq.run()
    print(f"{nsq.__name__}: {count} publishes acknowledged in "
          f"{marks['published'] - marks['start']:.2f}s; {count} messages handled in "
          f"{marks['handled'] - marks['first']:.2f}s from the first (max_in_flight 200)")


def main(args: argparse.Namespace) -> int:
    if args.pynsq:
        import nsq as module  # pynsq itself
    else:
        from smartnsq.compat import pynsq as module
    server = LoopThread("devcluster").start()

    async def start() -> DevCluster:
        if args.youzan:
            cluster = DevCluster(nodes=2, lookupds=1)
            await cluster.start()
            await cluster.create_topic(TOPIC, partitions=2, channels=[CHANNEL])
        else:
            cluster = DevCluster(nodes=2, lookupds=1, mode="classic")
            await cluster.start()
            await cluster.create_topic(TOPIC, channels=[CHANNEL])
            await cluster.create_topic("bench", channels=["c"])
        return cluster

    cluster = server.run(start())
    print(f"{module.__name__} against a {'youzan' if args.youzan else 'classic'} dev cluster")
    watchdog = signal.SIGALRM
    signal.signal(watchdog, lambda *_: sys.exit("timed out"))
    signal.alarm(30 if not args.bench else 300)
    started = time.perf_counter()
    if args.bench:
        try:
            bench(module, list(cluster.nsqd_tcp_addresses), args.bench)
        finally:
            signal.alarm(0)
            server.run(cluster.stop())
            server.stop()
        return 0
    try:
        received = program(module, list(cluster.nsqd_tcp_addresses),
                           [f"http://{a}" for a in cluster.lookupd_http_addresses], args.count)
    finally:
        signal.alarm(0)
        server.run(cluster.stop())
        server.stop()
    ok = sorted(received) == sorted(b"hello %d" % i for i in range(args.count))
    print(f"{len(received)} messages in {time.perf_counter() - started:.2f}s: "
          f"{'all there' if ok else 'MISSING SOME'}")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pynsq", action="store_true", help="run on pynsq (import nsq)")
    parser.add_argument("--youzan", action="store_true", help="a youzan dev cluster")
    parser.add_argument("--count", type=int, default=COUNT, help="messages (multiple of 3)")
    parser.add_argument("--bench", type=int, default=0, metavar="N",
                        help="time N publishes and their consumption instead")
    sys.exit(main(parser.parse_args()))
