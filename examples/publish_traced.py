"""Traced publishing: trace ids, receipts and the ``smartnsq.observability.trace`` log.

    python examples/publish_traced.py                           # on an embedded dev cluster
    python examples/publish_traced.py --lookupd 127.0.0.1:4161 --topic payments

A publish given a ``trace_id`` (an order id, a request id: any uint64) goes as PUB_TRACE, or
with ``##trace_id`` in its JSON header when it carries headers (PUB_EXT). The server logs it
on its side and answers with a receipt: the message's internal id, its byte offset in the
partition's queue and its size on disk. The producer writes one line per traced publish on
the ``smartnsq.observability.trace`` logger; ``set_trace`` switches that per producer or per topic
while running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from smartnsq import Producer
from smartnsq.devcluster import DevCluster


@contextlib.asynccontextmanager
async def lookupd_addresses(args: argparse.Namespace) -> AsyncIterator[list[str]]:
    if args.lookupd:
        yield args.lookupd
        return
    async with DevCluster(nodes=2, lookupds=1) as cluster:
        await cluster.create_topic(args.topic, partitions=2, replicas=1, ext=True)
        print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
        yield cluster.lookupd_http_addresses


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("smartnsq.trace").setLevel(logging.INFO)
    async with lookupd_addresses(args) as lookupd, Producer(lookupd=lookupd) as producer:
        ext = (await producer.routes(args.topic)).ext
        for order_id in (1001, 1002, 1003):
            result = await producer.publish(args.topic, b"paid order %d" % order_id,
                                            trace_id=order_id)
            print(f"  receipt: partition {result.partition}, internal id {result.internal_id}, "
                  f"offset {result.queue_offset}, {result.raw_size} bytes on disk")
        if ext:  # headers need an ext topic; the trace id then rides in ##trace_id
            result = await producer.publish(args.topic, b"refund", trace_id=2001,
                                            headers={"kind": "refund"})
            print(f"  with headers: trace id {result.trace_id} at offset {result.queue_offset}")

        print("untraced publishes write no trace line ...")
        await producer.publish(args.topic, b"no trace id")
        print("... until tracing is switched on for the topic:")
        producer.set_trace(True, args.topic)
        await producer.publish(args.topic, b"traced because of the switch")
        producer.set_trace(False)  # producer-wide off; the topic's own setting still wins
        await producer.publish(args.topic, b"still traced: topic setting")
        producer.set_trace(None, args.topic)  # back to the producer's setting: off
        await producer.publish(args.topic, b"not logged", trace_id=9)
        print("done")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", metavar="HOST:PORT",
                        help="nsqlookupd HTTP address (repeatable); default: embedded cluster")
    parser.add_argument("--topic", default="payments")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
