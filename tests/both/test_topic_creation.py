"""Topic creation until usable, on both clusters.

``create_topic`` returns only once an ``access=w`` lookup lists every partition (the real
lookupd needs seconds and re-sent creates: docs/protocol.md §10.1); a publish to each partition
right after is accepted at its first attempt and read back from that partition.
"""

from __future__ import annotations

from typing import Any

import pytest
from both_support import consume, producer, writable_partitions
from support import bounded, fresh_name

from smartnsq.admin import AsyncAdmin

SHAPES = {
    "plain": {"partitions": 2, "replicas": 1},
    # ordered (orderedmulti) and more partitions than nodes
    "ordered": {"partitions": 4, "replicas": 1, "ordered": True},
    # partitions x replicas > nodes (3): multipart
    "multipart": {"partitions": 4, "replicas": 2},
}


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_created_topic_is_usable_at_once(nsq_any_cluster: Any, shape: str) -> None:
    cluster = nsq_any_cluster
    options = SHAPES[shape]
    partitions = options["partitions"]
    topic = fresh_name(f"create-{shape}")
    async with bounded(60):
        await cluster.create_topic(topic, channels=["ch"], **options)
    assert await writable_partitions(cluster, topic) == set(range(partitions))
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        view = await admin.lookup(topic, "r")
    assert view.meta is not None
    assert (view.meta.partition_num, view.meta.replica, view.meta.ordered) == (
        partitions, options["replicas"], bool(options.get("ordered")))
    assert view.meta.multi_part == (shape == "multipart")
    async with producer(cluster) as pub:
        for p in range(partitions):
            async with bounded(5):
                result = await pub.publish(topic, b"p%d" % p, partition=p, timeout=5)
            assert (result.partition, result.attempts) == (p, 1)
    got = await consume(cluster, topic, "ch", partitions)
    assert {bytes(m.body): m.partition for m in got} == {b"p%d" % p: p
                                                        for p in range(partitions)}


async def test_too_many_replicas_without_multipart_are_refused(nsq_any_cluster: Any) -> None:
    """``partitions x replicas`` above the nodes without ``multipart``: the lookupd refuses
    the topic ("No node is available for topic"), at once."""
    cluster = nsq_any_cluster
    topic = fresh_name("create-refused")
    with pytest.raises(RuntimeError, match="No node is available"):
        async with bounded(20):
            await cluster.create_topic(topic, partitions=2, replicas=2, multipart=False,
                                       channels=["ch"], timeout=15)
