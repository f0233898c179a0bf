"""What a Prometheus scrape of smartnsq's collector costs, by partition count.

    python bench/scrape.py [--partitions 4,64,255] [--scrapes 200]

The collector does no work per message: it reads the clients' ``stats()`` when Prometheus
scrapes. So its cost is the scrape's, paid once per scrape interval on the scraping thread.
For each partition count this runs a dev cluster (3 youzan nsqd), a producer that has
written to every partition, a consumer reading them all with a ``lag()`` reading kept (so the
backlog series are there too), registers both on a fresh registry and times
``generate_latest`` (what the HTTP handler runs), the collector's ``collect()`` alone (the
snapshots turned into metric families; the rest is ``prometheus_client``'s text format),
``Producer.stats()`` and ``Consumer.stats()``: the median CPU time per call over
``--scrapes`` calls, the series and bytes a scrape gives, and the share of one core at a
15 s scrape interval.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any


def per_call(fn: Callable[[], Any], calls: int) -> float:
    """Median CPU seconds of one ``fn()`` call (process time: the machine's load does not
    add to it)."""
    fn()  # warm
    times = []
    for _ in range(calls):
        start = time.process_time_ns()
        fn()
        times.append((time.process_time_ns() - start) / 1e9)
    return statistics.median(times)


async def one(partitions: int, scrapes: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    import smartnsq.observability.prometheus
    from smartnsq import Consumer, Producer
    from smartnsq.devcluster import DevCluster

    async with DevCluster(nodes=3, lookupds=1) as cluster:
        await cluster.create_topic("scrape", partitions=partitions, channels=["ch"],
                                   timeout=60)
        lookupd = cluster.lookupd_http_addresses
        got = asyncio.Event()
        seen = 0

        def handle(_: Any) -> None:
            nonlocal seen
            seen += 1
            if seen == partitions:
                got.set()

        async with Producer(lookupd=lookupd) as producer, \
                Consumer("scrape", "ch", lookupd=lookupd, handler=handle) as consumer:
            for p in range(partitions):
                await producer.publish("scrape", b"x", partition=p)
            await asyncio.wait_for(got.wait(), 60)
            await consumer.lag()
            registry = CollectorRegistry()
            collector = smartnsq.observability.prometheus.register(producer, consumer,
                                                                   registry=registry)
            text = generate_latest(registry)
            series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
            return {
                "partitions": partitions,
                "series": series,
                "bytes": len(text),
                "scrape": per_call(lambda: generate_latest(registry), scrapes),
                "collect": per_call(lambda: list(collector.collect()), scrapes),
                "producer_stats": per_call(producer.stats, scrapes),
                "consumer_stats": per_call(consumer.stats, scrapes),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="4,64,255",
                        help="partition counts, comma-separated (default 4,64,255)")
    parser.add_argument("--scrapes", type=int, default=200, help="calls timed per figure")
    parser.add_argument("--quick", action="store_true", help="4,64 partitions, 50 calls")
    args = parser.parse_args()
    counts = [4, 64] if args.quick else [int(n) for n in args.partitions.split(",")]
    scrapes = 50 if args.quick else args.scrapes
    print(f"python bench/scrape.py --partitions {','.join(map(str, counts))} "
          f"--scrapes {scrapes}")
    print("partitions  series   bytes  scrape ms  collect() ms  Producer.stats() ms"
          "  Consumer.stats() ms  one core at 15 s")
    for n in counts:
        row = asyncio.run(one(n, scrapes))
        print(f"{row['partitions']:>10}  {row['series']:>6}  {row['bytes']:>6}  "
              f"{row['scrape'] * 1e3:>9.2f}  {row['collect'] * 1e3:>12.2f}  "
              f"{row['producer_stats'] * 1e3:>19.3f}  "
              f"{row['consumer_stats'] * 1e3:>19.3f}  {row['scrape'] / 15:>15.4%}")


if __name__ == "__main__":
    main()
