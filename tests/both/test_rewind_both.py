"""An operator's rewind of an ordered channel under a running consumer (``Admin.set_offset``
back), on the dev cluster and the real youzan servers from the same bodies: the messages from
the new position are handled again, in order, with no order error; a rewind to exactly the
last handled message hands that message over again (it is not the server's duplicated first
delivery)."""

from __future__ import annotations

from typing import Any

import pytest
from both_support import Collector, consuming, producer
from support import bounded, fresh_name

from smartnsq.admin import AsyncAdmin
from smartnsq.protocol.commands import StartPosition


@pytest.mark.parametrize("back", [2, 0])
async def test_a_rewind_replays_in_order_without_an_order_error(
        back: int, nsq_any_cluster: Any) -> None:
    """``back``: how many messages before the last one the channel is set to (0: the last
    one itself)."""
    cluster = nsq_any_cluster
    topic = fresh_name("rewind")
    await cluster.create_topic(topic, partitions=1, replicas=1, ordered=True, channels=["ch"])
    offsets: list[int] = []
    async with producer(cluster) as pub:
        for i in range(6):
            async with bounded(10):
                result = await pub.publish(topic, b"m%d" % i, partition=0)
            assert result.queue_offset is not None
            offsets.append(result.queue_offset)
    got = Collector()
    reported: list[str] = []
    async with consuming(cluster, topic, "ch", got, ordered=True,
                         on_order_error=lambda m, what: reported.append(what)) as consumer:
        await got.count(6)
        handled = len(got.messages)
        target = 5 - back
        async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=10) as admin:
            await admin.set_offset(topic, "ch", StartPosition.queue_offset(offsets[target]))
        await got.until(lambda: len(got.messages) >= handled + back + 1, "the replay")
        stats = consumer.stats()
    replay = got.bodies[handled:]
    assert replay[:back + 1] == [b"m%d" % i for i in range(target, 6)]
    assert stats.order_errors == 0 and reported == []
