"""Blocking publishing from ordinary threads (WSGI handlers, Spark executors, scripts).

    python examples/publish_sync.py                             # on an embedded dev cluster
    python examples/publish_sync.py --lookupd 127.0.0.1:4161 --topic clicks

``smartnsq.sync.Producer`` has the async Producer's API as blocking calls. It runs the async
producer on one background event-loop thread shared by the whole process, so it is safe to
share between threads, and concurrent calls from many threads are coalesced into few socket
writes. Create one per process (not one per request) and close it at shutdown.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from smartnsq import LoopThread, sync
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
        await cluster.create_topic(args.topic, partitions=3, replicas=1)
        return cluster

    cluster = server.run(start())
    print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
    try:
        yield list(cluster.lookupd_http_addresses)
    finally:
        server.run(cluster.stop())
        server.stop()


def main(args: argparse.Namespace) -> None:
    with lookupd_addresses(args) as lookupd, sync.Producer(lookupd=lookupd) as producer:
        first = producer.publish(args.topic, b"hello from a blocking call")
        print(f"published to partition {first.partition} on {first.node}")

        def handle_request(n: int) -> int | None:  # what a web handler would do
            return producer.publish(args.topic, b'{"click": %d}' % n).partition

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            partitions = list(pool.map(handle_request, range(args.count)))
        elapsed = time.perf_counter() - started
        spread = {p: partitions.count(p) for p in sorted(set(partitions), key=str)}
        print(f"{args.count} publishes from {args.threads} threads in {elapsed:.2f}s; "
              f"per partition: {spread}")

        batch = producer.publish_many(args.topic, [b"a", b"b", b"c"])
        print(f"a batch of {batch.count} went to partition {batch.partition}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", metavar="HOST:PORT",
                        help="nsqlookupd HTTP address (repeatable); default: embedded cluster")
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse())
