"""Prometheus metrics: a producer and a consumer exported on ``/metrics``.

    python examples/prometheus_metrics.py                 # a short demo on a dev cluster
    python examples/prometheus_metrics.py --serve 60      # keep /metrics up for a minute

``smartnsq.observability.prometheus.register(producer, consumer)`` adds a collector that reads the
clients' ``stats()`` when Prometheus scrapes (nothing per message); ``poll_lag`` keeps the channel's
backlog (nsqd ``/stats``) fresh for it. The server listens on loopback only. The demo
publishes to a 2-partition topic, consumes it, scrapes its own ``/metrics`` once, prints a
few series and exits. Needs the ``prometheus`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import urllib.request

from prometheus_client import CollectorRegistry, start_http_server

import smartnsq.observability.prometheus
from smartnsq import Consumer, Message, Producer
from smartnsq.devcluster import DevCluster

TOPIC, CHANNEL, MESSAGES = "orders", "billing", 200
SHOWN = ("smartnsq_producer_published_messages_total", "smartnsq_consumer_finished_messages_total",
         "smartnsq_producer_publish_seconds_count", "smartnsq_channel_depth_messages",
         "smartnsq_lookup_rounds_total")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


async def main(args: argparse.Namespace) -> None:
    async with DevCluster(nodes=2, lookupds=1) as cluster:
        await cluster.create_topic(TOPIC, partitions=2, channels=[CHANNEL])
        lookupd = cluster.lookupd_http_addresses
        done = asyncio.Event()
        handled = 0

        def handle(message: Message) -> None:
            nonlocal handled
            handled += 1
            if handled == MESSAGES:
                done.set()

        registry = CollectorRegistry()  # (the default registry works the same way)
        async with Producer(lookupd=lookupd) as producer, \
                Consumer(TOPIC, CHANNEL, lookupd=lookupd, handler=handle) as consumer:
            smartnsq.observability.prometheus.register(producer, consumer, registry=registry)
            server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
            port = server.server_port
            print(f"serving http://127.0.0.1:{port}/metrics")
            lag = smartnsq.observability.prometheus.poll_lag(consumer, interval=1.0)
            try:
                for i in range(MESSAGES):
                    await producer.publish(TOPIC, b"order %d" % i, sharding_key=i)
                await asyncio.wait_for(done.wait(), 60)
                await consumer.lag()  # (poll_lag does it every second; now, for the demo)
                text = await asyncio.to_thread(scrape, port)
                for line in text.splitlines():
                    if line.startswith(SHOWN):
                        print(" ", line)
                if args.serve:
                    print(f"serving for {args.serve:g}s more")
                    await asyncio.sleep(args.serve)
            finally:
                lag.cancel()
                server.shutdown()
                server.server_close()
                thread.join(5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", type=float, default=0.0, metavar="SECONDS",
                        help="keep /metrics up this long after the demo")
    asyncio.run(main(parser.parse_args()))
