"""A poison message on an ordered topic: parked on a dead-letter topic, then put back.

    python examples/dead_letter.py                          # embedded dev cluster
    python examples/dead_letter.py --lookupd 127.0.0.1:4161 # a real youzan cluster

The handler fails one message every time. With ``max_attempts=2``, ``dead_letter=`` and the
ordered opt-in ``dead_letter_ordered=True``, that message is published to the dead-letter
topic (its origin in ``smartnsq.dl.*`` headers), FINed, and the messages behind it in its
partition are handled in order. Then ``smartnsq dead-letter replay`` puts it back on the
origin topic, where a fixed handler takes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from smartnsq import AsyncAdmin, Consumer, Message, Producer, RequeuePolicy
from smartnsq.cli import main as smartnsq_command
from smartnsq.devcluster import DevCluster


@contextlib.asynccontextmanager
async def lookupd_addresses(given: list[str] | None) -> AsyncIterator[list[str]]:
    if given:
        yield given
        return
    async with DevCluster(nodes=1, lookupds=1) as cluster:
        yield list(cluster.lookupd_http_addresses)


async def read(lookupd: list[str], topic: str, channel: str,
               done: Callable[[list[Message]], bool], **options: Any) -> list[Message]:
    """Messages a handler is given until ``done(messages)``; the handler raises on the body
    ``b"poison"`` unless ``fixed=True``."""
    fixed = bool(options.pop("fixed", False))
    got: list[Message] = []
    finished = asyncio.Event()

    def handler(message: Message) -> None:
        got.append(message)
        if done(got):
            finished.set()
        if message.body == b"poison" and not fixed:
            raise RuntimeError("cannot handle this one")

    # (on the ordered topic "last" comes only once "poison" was parked and FINed)
    async with Consumer(topic, channel, lookupd=lookupd, handler=handler, **options):
        await asyncio.wait_for(finished.wait(), 30)
    return got


async def main(given: list[str] | None) -> None:
    suffix = int(time.time()) % 100000
    topic, dead = f"dl_example_{suffix}", f"dl_example_{suffix}_dead"
    async with lookupd_addresses(given) as lookupd, AsyncAdmin(lookupd) as admin:
        await admin.create_topic(topic, 1, 1, ordered=True, ext=True, channels=["app"],
                                 timeout=120)
        await admin.create_topic(dead, 1, 1, ext=True, channels=["replay", "look"],
                                 timeout=120)
        async with Producer(lookupd=lookupd) as producer:
            for body in (b"first", b"poison", b"last"):
                await producer.publish(topic, body, partition=0, headers={"order": "42"})
        handled = await read(lookupd, topic, "app", lambda got: got[-1].body == b"last",
                             max_attempts=2, dead_letter=dead, dead_letter_ordered=True,
                             requeue_policy=RequeuePolicy(initial=0.1))
        print("handled, in order:", [(m.body.decode(), m.attempts) for m in handled])
        (copy,) = await read(lookupd, dead, "look", lambda got: True, fixed=True)
        print("the dead-letter copy:", copy.body.decode(), copy.headers)
        # put it back (as `smartnsq dead-letter replay ...` does from a shell)
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(
            smartnsq_command, ["dead-letter", "replay", dead, "--channel", "replay", "-n", "1",
                               "--lookupd", lookupd[0]], stdout=out, stderr=err)
        print(f"smartnsq dead-letter replay: exit {code}: "
              f"{out.getvalue() or err.getvalue()}", end="")
        if code == 0:
            (back,) = await read(lookupd, topic, "app", lambda got: True, fixed=True)
            print("back on the origin:", back.body.decode(), back.headers)
        await admin.delete_topic(topic)
        await admin.delete_topic(dead)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", help="a lookupd HTTP address")
    asyncio.run(main(parser.parse_args().lookupd))
