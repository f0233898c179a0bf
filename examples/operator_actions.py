"""An operator's week with ``smartnsq.admin``, on an embedded dev cluster.

    python examples/operator_actions.py

Pauses a channel while messages arrive, reads one stored message back by the id its publish
receipt gave, skips and empties the channel, expands the topic, and hides a node from the
topic's writers with a tombstone, printing what the servers report after each step.
"""

from __future__ import annotations

import asyncio

from smartnsq import AsyncAdmin, Producer
from smartnsq.devcluster import DevCluster


async def main() -> None:
    async with DevCluster(nodes=3, lookupds=2) as cluster, \
            AsyncAdmin(cluster.lookupd_http_addresses) as admin:
        await admin.create_topic("orders", 2, 1, channels=["billing"])
        paused = await admin.pause_channel("orders", "billing")
        print(f"paused billing on {paused}")
        async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
            receipt = await producer.publish("orders", b'{"id": 7}', partition=1, trace_id=7)
        assert receipt.internal_id is not None
        stored = await admin.get_message("orders", message_id=receipt.internal_id)
        print(f"stored: partition {stored.partition} offset {stored.queue_offset} "
              f"trace {stored.trace_id} body {stored.body}")
        lag = await admin.channel_lag("orders", "billing")
        print(f"billing waits: {[(p.partition, p.depth) for p in lag.partitions]}")
        await admin.unpause_channel("orders", "billing")
        await admin.skip_channel("orders", "billing", partition=1)
        await admin.unskip_channel("orders", "billing", partition=1)
        await admin.empty_channel("orders", "billing")
        print(f"leader lookupd {await admin.expand_topic('orders', 3)} took 3 partitions")
        view = await admin.lookup("orders")
        leader = view.leader(0)
        assert leader is not None
        await admin.tombstone("orders", leader.http_address)
        writable = sorted((await admin.lookup("orders", "w")).leaders())
        print(f"tombstoned {leader.http_address}: writers see partitions {writable}")
        await admin.tombstone("orders", leader.http_address, restore=True)


if __name__ == "__main__":
    asyncio.run(main())
