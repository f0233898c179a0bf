"""Consuming from ordinary threads: a blocking handler in a thread pool.

    python examples/consume_sync.py                          # on an embedded dev cluster
    python examples/consume_sync.py --lookupd 127.0.0.1:4161 --topic clicks --channel stats

``smartnsq.sync.Consumer`` runs the async Consumer on a background event-loop thread and the
handler in a thread pool (``threads=``), so the handler may block: database writes, HTTP
calls. Return to finish the message, raise to requeue it. ``run()`` blocks until ``stop()``
(thread-safe, also from a handler or a signal handler), then drains: running handlers finish
and are acknowledged, messages not started are given back.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Iterator

from smartnsq import LoopThread, Message, sync
from smartnsq.devcluster import DevCluster


@contextlib.contextmanager
def lookupd_addresses(args: argparse.Namespace) -> Iterator[list[str]]:
    """The lookupds to use: the ones given, or a dev cluster run on a thread of its own."""
    if args.lookupd:
        yield args.lookupd
        return
    server = LoopThread("devcluster").start()

    async def start() -> DevCluster:
        cluster = DevCluster(nodes=2, lookupds=1)
        await cluster.start()
        await cluster.create_topic(args.topic, partitions=2, replicas=1,
                                   channels=[args.channel])
        return cluster

    cluster = server.run(start())
    print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
    try:
        yield list(cluster.lookupd_http_addresses)
    finally:
        server.run(cluster.stop())
        server.stop()


def main(args: argparse.Namespace) -> None:
    with lookupd_addresses(args) as lookupd:
        with sync.Producer(lookupd=lookupd) as producer:
            for i in range(args.count):
                producer.publish(args.topic, b"click %d" % i)
        print(f"published {args.count} messages")

        lock = threading.Lock()
        handled = 0
        consumer: sync.Consumer | None = None

        def handle(message: Message) -> None:
            nonlocal handled
            time.sleep(0.005)  # a blocking call, e.g. a database write
            with lock:
                handled += 1
                if handled == args.count:
                    assert consumer is not None
                    consumer.stop()  # never blocks, safe from a handler thread

        consumer = sync.Consumer(args.topic, args.channel, lookupd=lookupd, handler=handle,
                                 threads=8, max_in_flight=16)
        previous = signal.signal(signal.SIGINT, lambda *_: consumer.stop())
        try:
            with consumer:
                finished = consumer.run(timeout=30)
                stats = consumer.stats()
        finally:
            signal.signal(signal.SIGINT, previous)
    print(f"handled {handled} messages with 8 threads; stopped and drained: {finished}; "
          f"finished {stats.finished}, requeued {stats.requeued}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", help="host:http_port (repeatable)")
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--channel", default="stats")
    parser.add_argument("--count", type=int, default=200)
    main(parser.parse_args())
