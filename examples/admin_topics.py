"""Administering topics and channels with ``smartnsq.admin``.

    python examples/admin_topics.py                          # on an embedded dev cluster
    python examples/admin_topics.py --lookupd 127.0.0.1:4161 # on a real youzan cluster

Creates an ordered topic and waits until it is usable (every partition has a leader and is
writable: on a real cluster the create is re-sent until the leader lookupd has assigned
leaders), publishes a few messages, adds a channel positioned at the end, shows per-partition
stats, then deletes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from smartnsq import AsyncAdmin, Producer, StartPosition
from smartnsq.devcluster import DevCluster
from smartnsq.protocol.admin import CreationProgress


@contextlib.asynccontextmanager
async def lookupd_addresses(given: list[str] | None) -> AsyncIterator[list[str]]:
    if given:
        yield given
        return
    async with DevCluster(nodes=3, lookupds=2) as cluster:
        print(f"embedded dev cluster: lookupd {', '.join(cluster.lookupd_http_addresses)}")
        yield list(cluster.lookupd_http_addresses)


def show(state: CreationProgress) -> None:
    print(f"  {state.describe()}")


async def main(given: list[str] | None) -> None:
    topic = f"admin_example_{int(time.time()) % 100000}"
    async with lookupd_addresses(given) as lookupd, AsyncAdmin(lookupd) as admin:
        listing = await admin.listlookup()
        print(f"lookupds {', '.join(listing.nodes)}; leader {listing.leader}")
        for node in await admin.nodes():
            info = await admin.info(node.http_address)
            print(f"nsqd {node.http_address} version {info.version}")

        print(f"creating {topic} (4 partitions, 2 replicas, ordered) with channel 'audit'")
        state = await admin.create_topic(topic, 4, 2, ordered=True, channels=["audit"],
                                         timeout=120, progress=show)
        assert state.done

        async with Producer(lookupd=lookupd) as producer:
            for order in range(20):
                await producer.publish(topic, b"order %d" % order, sharding_key=order)

        # a channel created now starts where it is told: here, at the end of each partition
        await admin.create_channel(topic, "late")
        await admin.set_offset(topic, "late", StartPosition.end())

        stats = await admin.cluster_stats(topic)
        for address, node in sorted(stats.items()):
            if isinstance(node, Exception):
                print(f"{address}: {node}")
                continue
            for entry in node.partitions(topic, leader=True):
                depths = ", ".join(f"{c.name} {c.depth}" for c in entry.channels)
                print(f"partition {entry.partition} on {address}: {depths}")

        await admin.delete_channel(topic, "late")
        await admin.delete_topic(topic)
        print(f"deleted {topic}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lookupd", action="append", help="nsqlookupd HTTP address")
    asyncio.run(main(parser.parse_args().lookupd))
