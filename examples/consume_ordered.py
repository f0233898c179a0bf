"""Ordered consumption: every sharding key's messages handled in publish order.

    python examples/consume_ordered.py                      # on an embedded dev cluster
    python examples/consume_ordered.py --lookupd 127.0.0.1:4161 --topic orders --channel audit

An ordered topic (youzan ``orderedmulti``) delivers one message at a time per partition and
only moves on once that message is finished, so publishing with a sharding key (a customer
id, an order id) and consuming with ``SUB_ORDERED`` gives per-key order end to end. The
consumer subscribes to each partition's leader, reads ``meta.ordered`` from lookup and picks
``SUB_ORDERED`` itself; handlers of different partitions run concurrently, messages of one
partition one after another. A failing message holds only its own partition for the requeue
delay (the server ignores a delayed REQ on ordered channels, so the consumer pauses that
partition instead) and is never skipped unless ``on_give_up`` finishes it explicitly.

The embedded dev cluster behaves as the real one does on a fresh ordered channel: it delivers
the first message twice (``ordered_first_delivery_twice``), the copy either while the original
is in flight or after its FIN (``"random"``: per partition); the copy never reaches the
handler (the consumer answers it when the server may hold it in flight), so each customer's
sequence below is exactly ``[0, 1, 2, ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator

from smartnsq import Consumer, Message, Producer
from smartnsq.devcluster import DevCluster


@contextlib.asynccontextmanager
async def lookupd_addresses(args: argparse.Namespace) -> AsyncIterator[list[str]]:
    """The lookupds to use: the ones given, or an embedded dev cluster's."""
    if args.lookupd:
        yield args.lookupd
        return
    async with DevCluster(nodes=2, lookupds=1,
                          nsqd_options={"ordered_first_delivery_twice": "random"}) as cluster:
        # create the channel before publishing: a new youzan channel starts at the end
        await cluster.create_topic(args.topic, partitions=4, replicas=1, ordered=True,
                                   channels=[args.channel])
        print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
        yield list(cluster.lookupd_http_addresses)


async def main(args: argparse.Namespace) -> None:
    customers = [f"customer-{i}" for i in range(6)]
    events_per_customer = 10
    total = len(customers) * events_per_customer
    async with lookupd_addresses(args) as lookupd:
        async with Producer(lookupd=lookupd) as producer:
            for seq in range(events_per_customer):
                await asyncio.gather(*(
                    producer.publish(args.topic, f"{c}:{seq}".encode(), sharding_key=c)
                    for c in customers))
        print(f"published {total} events for {len(customers)} customers")

        seen: dict[str, list[int]] = defaultdict(list)
        done = asyncio.Event()
        count = 0

        async def handle(message: Message) -> None:
            nonlocal count
            customer, _, seq = message.body.decode().partition(":")
            await asyncio.sleep(0.001)  # some I/O: other partitions' handlers run meanwhile
            seen[customer].append(int(seq))
            count += 1
            if count == total:
                done.set()

        async with Consumer(args.topic, args.channel, lookupd=lookupd, handler=handle,
                            concurrency=8) as consumer:
            await asyncio.wait_for(done.wait(), 30)
            await asyncio.sleep(0.2)  # a duplicate handed to the handler would show up here
            stats = consumer.stats()
    for customer in customers:
        print(f"{customer}: {seen[customer]}")
        assert seen[customer] == list(range(events_per_customer)), seen[customer]
    print(f"consumed {count} events over {stats.connections} partition connections; "
          f"every customer's events in publish order; order errors: {stats.order_errors}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", help="host:http_port (repeatable)")
    parser.add_argument("--topic", default="orders_ordered")
    parser.add_argument("--channel", default="audit")
    asyncio.run(main(parser.parse_args()))
