"""A publish loop survives leader moves, a node restart and a lookupd stopping.

Every acknowledged message must be in the partition its key routes to (and in no other), as
read back from the cluster's partition logs; no call may hang past its own timeout. Faults are
triggered by progress (acknowledgement counts), never by wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support import WAIT, Watch, poke_on_log

from smartnsq import Producer
from smartnsq.errors import Timeout
from smartnsq.model.sharding import murmur3_partition

TIMEOUT = 5.0  # each publish's own deadline
PARTITIONS = 4


class Progress:
    """Counts acknowledgements; faults wait for the count to grow."""

    def __init__(self) -> None:
        self.acked: dict[bytes, int] = {}  # body -> partition the result names
        self.routed: dict[bytes, int] = {}  # body -> partition its key hashes to
        self.timeouts: list[Timeout] = []
        self.hangs: list[str] = []
        self.changed = asyncio.Event()

    def ack(self, body: bytes, partition: int, routed: int | None) -> None:
        self.acked[body] = partition
        if routed is not None:
            self.routed[body] = routed
        self.changed.set()

    async def grow(self, by: int) -> None:
        target = len(self.acked) + by

        async def until() -> None:
            while len(self.acked) < target:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), WAIT)


async def publisher(p: Producer, progress: Progress, worker: int, stop: asyncio.Event,
                    sharded: bool) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        key = f"key-{worker}-{i % 7}"
        body = f"w{worker}-m{i}-{'s' if sharded else 'u'}".encode()
        call = (p.publish("flow", body, sharding_key=key, timeout=TIMEOUT) if sharded
                else p.publish("flow", body, timeout=TIMEOUT))
        try:
            # the guard only fires if the call outlives its own deadline by far
            result = await asyncio.wait_for(call, TIMEOUT + 5.0)
        except Timeout as exc:
            progress.timeouts.append(exc)
            continue
        except TimeoutError:
            progress.hangs.append(body.decode())
            continue
        assert result.partition is not None
        progress.ack(body, result.partition,
                     murmur3_partition(key, PARTITIONS) if sharded else None)


@pytest.mark.nsq_cluster(nodes=3, lookupds=2)
async def test_publish_loop_through_faults(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("flow", partitions=PARTITIONS, replicas=2)
    progress = Progress()
    stop = asyncio.Event()
    async with Producer(lookupd=cluster.lookupd_http_addresses, retry_delay_max=0.2,
                        reconnect_delay_max=0.2, lookup_options={}) as p:
        workers = [asyncio.ensure_future(publisher(p, progress, w, stop, sharded=w < 6))
                   for w in range(8)]
        try:
            await progress.grow(200)

            # 1. a partition leader moves (the old leader answers E_FAILED_ON_NOT_LEADER)
            cluster.move_leader("flow", 0)
            await progress.grow(200)

            # 2. a node restarts: its partitions have no leader until it is back
            victim = cluster.leader_of("flow", 1)
            retries = p.retry_count
            with poke_on_log(Watch(), "smartnsq.producer") as attempt_failed:
                await cluster.stop_node(victim)
                await progress.grow(50)  # unsharded publishes keep flowing meanwhile
                # each failed attempt is logged before the retry the counter counts
                await attempt_failed.until(lambda: p.retry_count >= retries + 5, WAIT)
            await cluster.start_node(victim)
            await progress.grow(200)

            # 3. the leading lookupd stops; then leaders move again, so the producer has to
            #    learn the new routes from the remaining lookupd
            await cluster.stop_lookupd(0)
            await progress.grow(100)
            cluster.move_leader("flow", 2)
            cluster.move_leader("flow", 3)
            await progress.grow(200)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), WAIT)

    assert progress.hangs == [], "calls outlived their timeout"
    stored: dict[bytes, list[int]] = {}
    for part in cluster.state.topics["flow"].partitions:
        for msg in part.log.messages:
            stored.setdefault(msg.body, []).append(part.partition)
    # at-least-once: a publish retried after an ambiguous failure (the connection died before
    # the answer) may be stored twice. A sharded one only ever in its key's partition; an
    # unsharded retry is round-robined, so its extra copy may sit in another partition.
    for body, partition in progress.acked.items():
        where = stored.get(body)
        assert where, f"acknowledged {body!r} is missing"
        assert partition in where, f"{body!r} stored in {where}, acked on {partition}"
    for body, routed in progress.routed.items():
        assert progress.acked[body] == routed, f"{body!r} left its key's partition"
        assert set(stored[body]) == {routed}, f"{body!r} stored in {stored[body]}"
    duplicates = Counter({b: len(w) for b, w in stored.items() if len(w) > 1})
    assert sum(duplicates.values()) <= len(progress.acked) // 10, duplicates
    assert len(progress.acked) >= 950
    assert len(progress.routed) > 0 and len(progress.routed) < len(progress.acked)
