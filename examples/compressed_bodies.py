"""Message bodies compressed by the publishing client, as youzan/go-nsq does.

    python examples/compressed_bodies.py                          # embedded dev cluster
    python examples/compressed_bodies.py --lookupd 127.0.0.1:4161 # a real youzan cluster

Publishes a large body with ``Producer(compress=...)`` and one marked by hand the way a Go
producer marks it, then reads both: once decoded (what a handler gets) and once as stored
(``decompress=False``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from smartnsq import AsyncAdmin, BodyCompression, Consumer, Message, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.protocol import body_compression

BODY = b'{"order": 42, "lines": [' + b'{"sku": "abc-123", "qty": 1}, ' * 1500 + b"]}"


@contextlib.asynccontextmanager
async def lookupd_addresses(given: list[str] | None) -> AsyncIterator[list[str]]:
    if given:
        yield given
        return
    async with DevCluster(nodes=1, lookupds=1) as cluster:
        yield list(cluster.lookupd_http_addresses)


async def read(lookupd: list[str], topic: str, channel: str, count: int,
               **options: object) -> list[Message]:
    got: list[Message] = []
    done = asyncio.Event()

    def handler(message: Message) -> None:
        got.append(message)
        if len(got) >= count:
            done.set()

    async with Consumer(topic, channel, lookupd=lookupd, handler=handler, **options):
        await asyncio.wait_for(done.wait(), 30)
    return got


async def main(given: list[str] | None) -> None:
    topic = f"compressed_example_{int(time.time()) % 100000}"
    async with lookupd_addresses(given) as lookupd, AsyncAdmin(lookupd) as admin:
        await admin.create_topic(topic, 1, 1, ext=True, channels=["app", "raw"], timeout=120)
        async with Producer(lookupd=lookupd, compress={topic: BodyCompression("snappy")}) as p:
            await p.publish(topic, BODY, headers={"source": "smartnsq"})
            # what a go-nsq producer with TopicsForCompress sends: gzip, marked
            packed, marks = body_compression.compress("gzip", BODY) or (BODY, {})
            await p.publish(topic, packed, headers={**marks, "source": "go"})
        for message in await read(lookupd, topic, "app", 2):
            print(f"handler: {len(message.body)} bytes, original: {message.body == BODY}, "
                  f"headers {message.headers}")
        for message in await read(lookupd, topic, "raw", 2, decompress=False):
            print(f"as stored: {len(message.body)} bytes, headers {message.headers}")
        await admin.delete_topic(topic)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", help="a lookupd HTTP address")
    asyncio.run(main(parser.parse_args().lookupd))
