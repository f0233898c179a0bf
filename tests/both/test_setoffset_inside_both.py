"""``/channel/setoffset`` to a queue offset inside a message, on the dev cluster and on the real
youzan nsqd from the same steps.

The real nsqd (0.3.7-HA.1.13.0) moves such a channel on to the next message: the message the
offset falls in is not delivered, and the channel's depth counts only the messages after it;
inside the last message, nothing is left. Whoever sets offsets (the Spark source's planner,
an operator) must therefore tell a boundary from the inside of a message before setting one:
the server will not refuse it. The dev cluster is held to the same rule here.
"""

from __future__ import annotations

from typing import Any

from both_support import Collector, channel_counts, consuming, producer
from support import bounded, fresh_name

from smartnsq.admin import AsyncAdmin
from smartnsq.protocol.commands import StartPosition


async def test_a_setoffset_inside_a_message_goes_on_at_the_next_one(
        nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("inside")
    await cluster.create_topic(topic, partitions=1, replicas=1, channels=["ch"])
    async with producer(cluster) as pub:
        results = []
        for i in range(5):
            async with bounded(10):
                results.append(await pub.publish(topic, b"m%d" % i, partition=0))
    offsets = [r.queue_offset or 0 for r in results]
    assert all(r.queue_offset is not None for r in results), results
    last = results[-1]
    assert last.queue_offset is not None and last.raw_size is not None
    end = last.queue_offset + last.raw_size
    cases = {  # offset -> messages the channel then holds
        offsets[2]: 3,          # a boundary: from that message on
        offsets[2] + 1: 2,      # inside message 2: from message 3 on
        offsets[3] - 1: 2,      # its last byte: the same
        end - 1: 0,             # inside the last message: nothing left
    }
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        for n, (offset, left) in enumerate(cases.items()):
            channel = f"probe{n}"
            async with bounded(10):
                await admin.create_channel(topic, channel, partition=0)
                await admin.set_offset(topic, channel, StartPosition.queue_offset(offset),
                                       partition=0)
            depth, _ = await channel_counts(cluster, topic, channel)
            assert depth == left, (offset, depth)
    got = Collector()
    async with consuming(cluster, topic, "probe1", got):
        await got.count(2)
    assert sorted(set(got.bodies)) == [b"m3", b"m4"]  # message 2 is not delivered
