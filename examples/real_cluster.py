"""Run smartnsq against the real NSQ servers, started as processes by ``RealCluster``.

    SMARTNSQ_REAL_NSQ=/path/to/binaries python examples/real_cluster.py

Starts etcd, two youzan nsqlookupds and three nsqd, creates an ordered topic, publishes keyed
messages, makes the leader of partition 0 leave (SIGTERM) while a consumer reads, and checks
that every message arrived in per-key order. Without the binaries it says so and exits 0.
A graceful handoff takes 0.07-4 s; on a loaded machine the leaving node's handoff can fail
(the server logs ``request leave isr failed``), and the partition then waits for etcd's session
to expire like a crash (21-49 s): hence the publishes' long timeout.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict

from smartnsq import AsyncAdmin, Consumer, Producer
from smartnsq.testing.realcluster import ENV, RealCluster

KEYS, PER_KEY = 8, 25


async def main() -> int:
    async with RealCluster(mode="youzan", nodes=3, lookupds=2) as cluster:
        print(cluster.describe())
        await cluster.create_topic("orders", partitions=4, replicas=3, ordered=True,
                                   channels=["billing"])
        lookupd = cluster.lookupd_http_addresses
        seen: dict[str, list[int]] = defaultdict(list)
        done = asyncio.Event()

        async def handle(message) -> None:  # type: ignore[no-untyped-def]
            key, seq = message.body.decode().split(":")
            seen[key].append(int(seq))
            if sum(len(v) for v in seen.values()) >= KEYS * PER_KEY:
                done.set()

        async with Producer(lookupd=lookupd) as producer, \
                Consumer("orders", "billing", lookupd=lookupd, handler=handle):
            for seq in range(PER_KEY):
                if seq == PER_KEY // 2:
                    async with AsyncAdmin(lookupd) as admin:
                        view = await admin.lookup("orders", "w")
                    leader = view.partitions[0].leader
                    assert leader is not None
                    address = f"{leader.broadcast_address}:{leader.tcp_port}"
                    print(f"the leader of partition 0 ({address}) leaves (SIGTERM)")
                    await cluster.leave_node(address)
                for key in range(KEYS):
                    await producer.publish("orders", f"k{key}:{seq}".encode(),
                                           sharding_key=f"k{key}", timeout=120)
            await asyncio.wait_for(done.wait(), 120)
        ordered = all(v == sorted(v) for v in seen.values())
        print(f"{sum(len(v) for v in seen.values())} messages, per-key order kept: {ordered}")
        return 0 if ordered else 1


if __name__ == "__main__":
    if not os.environ.get(ENV):
        print(f"set {ENV} to the folder of the real NSQ binaries to run this example")
        sys.exit(0)
    sys.exit(asyncio.run(main()))
