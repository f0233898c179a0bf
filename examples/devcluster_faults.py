"""The real cluster's failure modes, on demand: kill a node and watch the cluster recover.

    python examples/devcluster_faults.py

A dev cluster on the ``realistic`` fault profile, 20 times faster: killing a node leaves the
partitions it led without a leader for 1-2.5 s (21-49 s on a real cluster), a partition whose
leader lost a replica stalls, then refuses writes until its in-sync replicas shrink. A producer
keeps publishing with sharding keys throughout and a consumer reads everything back: nothing
acknowledged is lost. The fault clock's timeline shows what the cluster did, and when.
"""

from __future__ import annotations

import asyncio
import time

from smartnsq import Consumer, Message, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.profile import profile_named

TOPIC = "payments"
KEYS = [f"account-{i}" for i in range(8)]


async def main() -> None:
    profile = profile_named("realistic", scale=0.05, seed=3)
    async with DevCluster(nodes=3, lookupds=2, profile=profile) as cluster:
        began = time.monotonic()
        # slow creation: the first check comes ~25 ms after the create; re-sent as needed
        await cluster.create_topic(TOPIC, partitions=3, replicas=3, channels=["ledger"])
        print(f"topic created in {time.monotonic() - began:.2f} s")

        acked: set[bytes] = set()
        seen: set[bytes] = set()
        lookup = {"poll_interval": 0.5}
        async with Producer(lookupd=cluster.lookupd_http_addresses, lookup_options=lookup,
                            timeout=10.0) as producer:

            async def publish(rounds: int) -> None:
                for n in range(rounds):
                    sent = await asyncio.gather(*(
                        producer.publish(TOPIC, f"{key}:{n}".encode(), sharding_key=key)
                        for key in KEYS), return_exceptions=True)
                    for key, result in zip(KEYS, sent, strict=True):
                        if not isinstance(result, BaseException):
                            acked.add(f"{key}:{n}".encode())

            await publish(5)
            victim = cluster.leader_of(TOPIC, 0)
            killed_at = time.monotonic()
            print(f"killing {cluster.node_info(victim).node_id} (leads partition 0)")
            await cluster.kill_node(victim)
            await publish(10)  # sharded publishes wait for their partition's new leader
            await cluster.faults.settled(60)
            await publish(5)

        for event in cluster.faults.timeline:
            if event.at >= killed_at:
                print(f"  +{event.at - killed_at:5.2f} s  {event.what:<12} "
                      f"{ {k: v for k, v in event.details.items() if k != 'node'} }")

        done = asyncio.Event()

        def handle(message: Message) -> None:
            seen.add(message.body)
            if seen >= acked:
                done.set()

        async with Consumer(TOPIC, "ledger", lookupd=cluster.lookupd_http_addresses,
                            handler=handle, lookup_options=lookup):
            await asyncio.wait_for(done.wait(), 20)
    lost = acked - seen
    print(f"acknowledged {len(acked)}, consumed {len(seen & acked)}, lost {len(lost)}")
    assert not lost


if __name__ == "__main__":
    asyncio.run(main())
