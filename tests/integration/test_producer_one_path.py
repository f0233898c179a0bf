"""Every attempt of every call is routed once and written by one function.

A call's first attempt is routed as the call is made; when the target's connection is not
open yet, that attempt waits for it (in the call's own coroutine for ``publish()``, in a task
for ``publish_nowait``) and is written where it was routed: the round-robin step and a
migration chooser's draw are taken once per attempt, and waiting for a connection is not a
retry. What each result claims is checked against what the servers stored.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support import WAIT, classic_bodies, stored

from smartnsq import Producer, PublishResult
from smartnsq.compat import MigrationChooser, MigrationPolicy


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_first_attempts_waiting_for_their_connection_keep_their_partition(
        nsq_cluster: Any) -> None:
    for topic in ("waiting_publish", "waiting_nowait"):
        await nsq_cluster.create_topic(topic, partitions=4, replicas=1)
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as p:
        await p.routes("waiting_publish")
        await p.routes("waiting_nowait")
        assert p.pool.connections == {}  # routes known, nothing dialled yet
        published = await asyncio.wait_for(asyncio.gather(
            *(p.publish("waiting_publish", b"p%d" % i) for i in range(8))), WAIT)
        futures = [p.publish_nowait("waiting_nowait", b"n%d" % i) for i in range(8)]
        nowaited = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
        retries = p.retry_count
    for topic, results, prefix in (("waiting_publish", published, b"p"),
                                   ("waiting_nowait", nowaited, b"n")):
        assert all(isinstance(r, PublishResult) and r.attempts == 1 for r in results)
        # one round-robin step per publish: evenly spread, as with open connections
        assert Counter(r.partition for r in results) == {0: 2, 1: 2, 2: 2, 3: 2}
        where = stored(nsq_cluster, topic)
        for i, result in enumerate(results):
            assert where[prefix + b"%d" % i] == [result.partition]
    assert retries == 0


async def test_a_migration_chooser_is_asked_once_per_publish(
        nsq_cluster_factory: Any) -> None:
    classic = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic")
    youzan = await nsq_cluster_factory(nodes=1, lookupds=1)
    await classic.create_topic("moving")
    await youzan.create_topic("moving", partitions=2)
    chooser = MigrationChooser(MigrationPolicy(youzan_percent=50))
    lookupds = [*classic.lookupd_http_addresses, *youzan.lookupd_http_addresses]
    async with Producer(lookupd=lookupds, migration=chooser) as p:
        await p.routes("moving")  # known on both sides, no connection open yet
        futures = [p.publish_nowait("moving", b"n%d" % i) for i in range(10)]
        await asyncio.wait_for(asyncio.gather(*futures), WAIT)
        for i in range(10):  # the connections open now: the fast path
            await p.publish("moving", b"p%d" % i)
        gathered = await asyncio.wait_for(asyncio.gather(
            *(p.publish("moving", b"g%d" % i) for i in range(10))), WAIT)
    assert all(r.attempts == 1 for r in gathered)
    assert sum(chooser.counts.values()) == 30
    bodies = [b for b in stored(youzan, "moving")] + classic_bodies(classic, "moving")
    assert sorted(bodies) == sorted(b"%s%d" % (k, i) for k in (b"n", b"p", b"g")
                                    for i in range(10))
