"""``expand_topic(..., wait=True)`` and ``smartnsq topic expand`` return once the new partitions
take writes, on the dev cluster and on the real youzan servers.

Left alone, the real lookupd refuses an expansion ("the cluster is unstable") until its next
full topic check (112 s after a topic's creation, measured), and then leaves the new
partitions refusing SUB and channels (``E_FAILED_ON_NOT_LEADER``) and writes
(``E_FAILED_ON_NOT_WRITABLE``, no channel) for minutes; with ``wait`` the expansion asks the
lookupd for its check and creates the topic's channels on the new partitions, so the whole
call ends within the bound below. Every step is bounded; nothing sleeps to wait.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from both_support import producer
from support import bounded, cli, fresh_name

from smartnsq.admin import AsyncAdmin

WITHIN = 60.0  # the call's timeout, and the test's bound on it


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_an_expansion_waited_for_takes_writes_on_its_new_partitions(
        nsq_any_cluster: Any, ordered: bool) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("grow-wait")
    replicas = 2 if ordered else 1  # 2 x 2 plain partitions would need more than 3 nsqd
    async with bounded(60):
        await cluster.create_topic(topic, 2, replicas, ordered=ordered, channels=["ch"])
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        async with bounded(WITHIN):
            await admin.expand_topic(topic, 4 if ordered else 3,
                                     wait=True, timeout=WITHIN)
        view = await admin.lookup(topic, "w")
        grown = view.partition_num
        assert grown in (3, 4) and sorted(view.partitions) == list(range(grown))
        # the channel the topic had is on the new partitions too
        for pid in range(2, grown):
            leader = view.leader(pid)
            assert leader is not None
            stats = await admin.stats(leader.http_address, topic, "ch", partition=pid)
            entry = stats.topic(topic, pid)
            assert entry is not None and entry.channel("ch") is not None
    async with producer(cluster) as pub, bounded(20):
        for pid in range(2, grown):  # taken at once: no refusal to retry
            receipt = await pub.publish(topic, b"new", partition=pid, timeout=5)
            assert receipt.partition == pid


async def test_the_cli_expansion_waits_until_writers_see_the_new_partition(
        nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("grow-cli")
    async with bounded(60):
        await cluster.create_topic(topic, 2, 1, channels=["ch"])
    lookupd = ",".join(cluster.lookupd_http_addresses)
    async with bounded(WITHIN + 10):
        code, out, err = await cli("topic", "expand", topic, "--partitions", "3", "--lookupd",
                                   lookupd, "--create-timeout", str(WITHIN), "--json")
    assert code == 0, err
    assert json.loads(out)["waited"] is True
    async with producer(cluster) as pub, bounded(20):
        receipt = await pub.publish(topic, b"new", partition=2, timeout=5)
    assert receipt.partition == 2
