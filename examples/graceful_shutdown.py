"""Graceful shutdown: SIGTERM (or Ctrl-C) drains the consumer, and nothing is lost.

    python examples/graceful_shutdown.py                      # on an embedded dev cluster
    python examples/graceful_shutdown.py --lookupd 127.0.0.1:4161 --topic jobs --channel work

``await consumer.run(stop_on=(signal.SIGINT, signal.SIGTERM))`` consumes until one of those
signals comes, then closes the consumer within ``drain_timeout``: the handlers at work finish
and their messages are FINed, the messages received but not started are given back to the
server, and ``run()`` returns True (no ``KeyboardInterrupt`` traceback). Here the process sends
itself SIGTERM once it has handled ``--stop-after`` messages, as ``kubectl delete pod`` or
``docker stop`` would; a second consumer then reads what the first left, to show that every
published message was handled. The program exits 0 only if it was.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

from smartnsq import Consumer, Message, Producer
from smartnsq.devcluster import DevCluster


@contextlib.asynccontextmanager
async def lookupd_addresses(args: argparse.Namespace) -> AsyncIterator[list[str]]:
    """The lookupds to use: the ones given, or an embedded dev cluster's."""
    if args.lookupd:
        yield args.lookupd
        return
    async with DevCluster(nodes=2, lookupds=1) as cluster:
        # create the channel before publishing: a new youzan channel starts at the end
        await cluster.create_topic(args.topic, partitions=2, replicas=1,
                                   channels=[args.channel])
        print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
        yield list(cluster.lookupd_http_addresses)


async def main(args: argparse.Namespace) -> int:
    async with lookupd_addresses(args) as lookupd:
        published = {f"job {i}".encode() for i in range(args.count)}
        async with Producer(lookupd=lookupd) as producer:
            await asyncio.gather(*(producer.publish(args.topic, body) for body in published))
        print(f"published {len(published)} jobs")

        handled: set[bytes] = set()

        async def work(message: Message) -> None:
            await asyncio.sleep(0.01)  # the job: a database write, an HTTP call...
            handled.add(message.body)
            if len(handled) == args.stop_after:
                # what a container's stop sends; run() below turns it into a drain
                os.kill(os.getpid(), signal.SIGTERM)

        consumer = Consumer(args.topic, args.channel, lookupd=lookupd, handler=work,
                            max_in_flight=20, drain_timeout=10)
        drained = await consumer.run(stop_on=(signal.SIGINT, signal.SIGTERM))
        stats = consumer.stats()
        print(f"SIGTERM: drained and closed: {drained}; handled {len(handled)} jobs "
              f"(finished {stats.finished}, {stats.requeued} given back unstarted)")

        # a second consumer (the pod that replaces this one) reads what is left
        rest = published - handled
        done = asyncio.Event()

        async def finish(message: Message) -> None:
            handled.add(message.body)
            if handled >= published:
                done.set()

        async with Consumer(args.topic, args.channel, lookupd=lookupd, handler=finish):
            await asyncio.wait_for(done.wait(), 60)
        print(f"the next consumer handled the {len(rest)} left; every job handled: "
              f"{handled >= published}")
        return 0 if handled >= published else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookupd", action="append", help="host:http_port (repeatable)")
    parser.add_argument("--topic", default="jobs")
    parser.add_argument("--channel", default="work")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--stop-after", type=int, default=100)
    raise SystemExit(asyncio.run(main(parser.parse_args())))
