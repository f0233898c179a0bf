"""A pynsq program moved to smartnsq by changing one import.

    python examples/pynsq_migration.py               # smartnsq.compat.pynsq, embedded cluster
    python examples/pynsq_migration.py --pynsq       # the same program on pynsq itself
    python examples/pynsq_migration.py --youzan      # smartnsq against a youzan cluster

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

from smartnsq._loop_thread import LoopThread
from smartnsq.devcluster import DevCluster

TOPIC = "nsq_reader"
CHANNEL = "async"
COUNT = 9


def program(nsq: ModuleType, nsqd_tcp_addresses: list[str],
            lookupd_http_addresses: list[str]) -> list[bytes]:
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
                print("  got", msg.body.decode(), "attempts", msg.attempts)
                msg.finish()
            buf.clear()
        else:
            print("  deferring processing")
        if len(received) >= COUNT:
            os.kill(os.getpid(), signal.SIGTERM)  # how a pynsq service is stopped

    writer = nsq.Writer(nsqd_tcp_addresses)

    def publish_all(conn: Any = None, data: Any = None) -> None:
        for i in range(COUNT):
            writer.pub(TOPIC, b"hello %d" % i, finish_pub)

    nsq.Reader(message_handler=process_message, lookupd_http_addresses=lookupd_http_addresses,
               topic=TOPIC, channel=CHANNEL, max_in_flight=9, lookupd_poll_interval=1)
    # pynsq's Writer connects once run() runs: publish from the loop, a moment later
    writer.io_loop.call_later(0.5, publish_all)
    nsq.run()
    return received


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
        return cluster

    cluster = server.run(start())
    print(f"{module.__name__} against a {'youzan' if args.youzan else 'classic'} dev cluster")
    watchdog = signal.SIGALRM
    signal.signal(watchdog, lambda *_: sys.exit("timed out"))
    signal.alarm(30)
    started = time.perf_counter()
    try:
        received = program(module, list(cluster.nsqd_tcp_addresses),
                           [f"http://{a}" for a in cluster.lookupd_http_addresses])
    finally:
        signal.alarm(0)
        server.run(cluster.stop())
        server.stop()
    ok = sorted(received) == sorted(b"hello %d" % i for i in range(COUNT))
    print(f"{len(received)} messages in {time.perf_counter() - started:.2f}s: "
          f"{'all there' if ok else 'MISSING SOME'}")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pynsq", action="store_true", help="run on pynsq (import nsq)")
    parser.add_argument("--youzan", action="store_true", help="a youzan dev cluster")
    sys.exit(main(parser.parse_args()))
