"""``Consumer(start=...)`` on a topic one of whose partitions was never written to: the real
youzan nsqd refuses a setoffset there (500 "commit log end of file"), which must not stop the
consumer: an empty partition has nothing to skip, so it starts where it is."""

from __future__ import annotations

import time
from typing import Any

import pytest
from both_support import Collector, consuming, producer
from support import bounded, fresh_name

from smartnsq.protocol.commands import StartPosition


@pytest.mark.parametrize("start", [StartPosition.queue_offset(0),
                                   StartPosition.timestamp(int(time.time()) - 3600)])
async def test_a_start_position_on_a_never_written_partition_is_no_error(
        start: StartPosition, nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("startempty")
    await cluster.create_topic(topic, partitions=2, replicas=1, channels=["ch"])
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, b"on zero", partition=0)
    got = Collector()
    async with consuming(cluster, topic, "ch", got, start=start) as consumer:
        await got.count(1)
        async with producer(cluster) as pub, bounded(10):
            await pub.publish(topic, b"on one", partition=1)
        await got.count(2)
        assert consumer.stats().subscribe_failures == 0
    assert sorted(set(got.bodies)) == [b"on one", b"on zero"]
