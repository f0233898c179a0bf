"""One Producer and one Consumer over a classic and a youzan cluster during a migration.

    python examples/mixed_cluster.py                 # two embedded dev clusters
    python examples/mixed_cluster.py --percent 80    # 80 % of publishes to youzan

The topic ``orders`` lives on both clusters (it is being moved); ``audit`` only on the classic
one, ``payments`` only on the youzan one. The client is given every lookupd, of both kinds:

* ``group_lookupds`` tells which lookupd is which, from their answers (``/listlookup``);
* the Producer writes ``audit`` to classic nodes, ``payments`` to youzan partition leaders, and
  ``orders`` to one side per publish as ``MigrationPolicy(youzan_percent=...)`` says; keyed
  publishes stay on one side per key;
* the Consumer of ``orders`` reads both clusters at once.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from smartnsq import Consumer, Producer
from smartnsq.compat import MigrationPolicy
from smartnsq.compat.probe import group_lookupds
from smartnsq.devcluster import DevCluster

COUNT = 200


async def main(args: argparse.Namespace) -> None:
    async with DevCluster(nodes=2, lookupds=1, mode="classic") as classic, \
            DevCluster(nodes=2, lookupds=1) as youzan:
        await classic.create_topic("orders", channels=["billing"])
        await classic.create_topic("audit")
        await youzan.create_topic("orders", partitions=2, channels=["billing"])
        await youzan.create_topic("payments", partitions=2)
        lookupd = [*classic.lookupd_http_addresses, *youzan.lookupd_http_addresses]

        groups = await group_lookupds(lookupd)
        print(f"classic lookupds: {list(groups.classic)}; youzan lookupds: {list(groups.youzan)}")

        policy = MigrationPolicy(youzan_percent=args.percent)
        sides: Counter[str] = Counter()
        async with Producer(lookupd=lookupd, migration=policy) as producer:
            audit = await producer.publish("audit", b"login")
            payment = await producer.publish("payments", b"paid", sharding_key="customer-7")
            print(f"audit    -> {audit.node} (classic, no partition)")
            print(f"payments -> {payment.node} partition {payment.partition} (youzan)")
            for i in range(COUNT):
                result = await producer.publish("orders", b"order %d" % i,
                                                sharding_key=f"customer-{i % 20}")
                sides["youzan" if result.partition is not None else "classic"] += 1
        print(f"orders: {COUNT} keyed publishes, {args.percent:g} % wanted on youzan: "
              f"{dict(sides)}")

        received: Counter[str] = Counter()
        done = asyncio.Event()

        def handle(message: object) -> None:
            received["youzan" if getattr(message, "youzan", False) else "classic"] += 1
            if sum(received.values()) == COUNT:
                done.set()

        async with Consumer("orders", "billing", lookupd=lookupd, handler=handle,
                            max_in_flight=50):
            await asyncio.wait_for(done.wait(), 30)
        print(f"one Consumer read {sum(received.values())} orders: {dict(received)}")
        assert received == sides, "every order read once, from the side it was written to"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--percent", type=float, default=50.0,
                        help="share of 'orders' publishes sent to youzan (0..100)")
    asyncio.run(main(parser.parse_args()))
