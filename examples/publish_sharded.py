"""Sharded publishing: every message of one key goes to one partition, in order.

    python examples/publish_sharded.py                          # on an embedded dev cluster
    python examples/publish_sharded.py --lookupd 127.0.0.1:4161 --topic orders

The partition of a key is MurmurHash3(key) % partition_num, as youzan's Go client computes it
(``--sharding java`` for the Java client's ``hashCode()`` routing), so producers in any of the
three languages agree on where a customer's orders go, and an ordered consumer of that
partition sees them in publish order. Against your own cluster the topic must exist already
(youzan nsqd never creates topics on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator

from smartnsq import Producer
from smartnsq.devcluster import DevCluster


@contextlib.asynccontextmanager
async def lookupd_addresses(args: argparse.Namespace) -> AsyncIterator[list[str]]:
    """The lookupds to use: the ones given, or those of a dev cluster started here."""
    if args.lookupd:
        yield args.lookupd
        return
    async with DevCluster(nodes=3, lookupds=2) as cluster:
        await cluster.create_topic(args.topic, partitions=4, replicas=2, ordered=True)
        print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
        yield cluster.lookupd_http_addresses


async def main(args: argparse.Namespace) -> None:
    async with lookupd_addresses(args) as lookupd, \
            Producer(lookupd=lookupd, sharding=args.sharding, timeout=10) as producer:
        routes = await producer.routes(args.topic)
        print(f"topic {args.topic!r}: {routes.partition_num} partitions, "
              f"ordered={routes.ordered}, sharding={args.sharding}")
        placed: dict[str, set[int]] = defaultdict(set)
        for n in range(args.count):
            customer = f"customer-{n % 5}"
            body = f'{{"order": {n}, "customer": "{customer}"}}'.encode()
            result = await producer.publish(args.topic, body, sharding_key=customer)
            placed[customer].add(result.partition)  # type: ignore[arg-type]
            print(f"order {n:3d} of {customer} -> partition {result.partition} on "
                  f"{result.node} (offset {result.queue_offset})")
        for customer, partitions in sorted(placed.items()):
            assert len(partitions) == 1, f"{customer} spread over {partitions}"
        print("every customer's orders went to exactly one partition")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", metavar="HOST:PORT",
                        help="nsqlookupd HTTP address (repeatable); default: embedded cluster")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--sharding", choices=("murmur3", "java"), default="murmur3")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
