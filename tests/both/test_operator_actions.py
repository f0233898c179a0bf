"""The operator's actions through ``AsyncAdmin``, the same bodies on the dev cluster and on the
real servers: channel pause/unpause/empty/skip/unskip, the delayed queue's actions, one
stored message by id, offset and count, tombstones, expansion's refusals, and classic's topic
pause.

Each reads the effect back from the servers' own answers (``/stats``, ``/lookup``,
``/message/get``), never from the client's belief; nothing sleeps to wait: a publish is
acknowledged before the next step, and every step is bounded.
"""

from __future__ import annotations

from typing import Any

import pytest
from both_support import producer
from support import bounded, fresh_name

from smartnsq.admin import AsyncAdmin
from smartnsq.errors import AdminError
from smartnsq.protocol.admin import ChannelStats

STEP = 20.0


async def _channel(admin: AsyncAdmin, topic: str, channel: str, partition: int
                   ) -> ChannelStats:
    view = await admin.lookup(topic, "r")
    leader = view.leader(partition)
    assert leader is not None
    stats = await admin.stats(leader.http_address, topic, channel, partition=partition)
    entry = stats.topic(topic, partition)
    assert entry is not None
    found = entry.channel(channel)
    assert found is not None
    return found


async def _youzan_topic(cluster: Any, prefix: str, partitions: int = 2) -> str:
    topic = fresh_name(prefix)
    async with bounded(60):
        await cluster.create_topic(topic, partitions, 1, channels=["ch"])
    return topic


async def test_pause_unpause_and_empty_a_channel(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = await _youzan_topic(cluster, "op-pause")
    async with producer(cluster) as pub, AsyncAdmin(cluster.lookupd_http_addresses,
                                                    timeout=5) as admin, bounded(STEP):
        for i in range(3):
            await pub.publish(topic, b"m%d" % i, partition=0, timeout=5)
        assert (await _channel(admin, topic, "ch", 0)).depth == 3
        targets = await admin.pause_channel(topic, "ch")
        assert sorted(pid for pid, _ in targets) == [0, 1]
        for pid in (0, 1):
            assert (await _channel(admin, topic, "ch", pid)).paused
        await admin.unpause_channel(topic, "ch", partition=1)
        assert not (await _channel(admin, topic, "ch", 1)).paused
        assert (await _channel(admin, topic, "ch", 0)).paused
        await admin.unpause_channel(topic, "ch")
        assert not (await _channel(admin, topic, "ch", 0)).paused
        assert await admin.empty_channel(topic, "ch", partition=0) != ()
        assert (await _channel(admin, topic, "ch", 0)).depth == 0
        with pytest.raises(AdminError) as caught:
            await admin.pause_channel(topic, "nochan")
    assert (caught.value.status, caught.value.message) == (404, "CHANNEL_NOT_FOUND")


async def test_skip_drops_what_is_published_while_skipped(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = await _youzan_topic(cluster, "op-skip", partitions=1)
    async with producer(cluster) as pub, AsyncAdmin(cluster.lookupd_http_addresses,
                                                    timeout=5) as admin, bounded(STEP):
        await pub.publish(topic, b"before", partition=0, timeout=5)
        await admin.skip_channel(topic, "ch")
        skipped = await _channel(admin, topic, "ch", 0)
        assert (skipped.skipped, skipped.paused, skipped.depth) == (True, False, 0)
        await pub.publish(topic, b"during", partition=0, timeout=5)
        await admin.unskip_channel(topic, "ch")
        back = await _channel(admin, topic, "ch", 0)
        assert (back.skipped, back.depth) == (False, 0)
        await pub.publish(topic, b"after", partition=0, timeout=5)
        assert (await _channel(admin, topic, "ch", 0)).depth == 1


async def test_one_stored_message_by_id_offset_and_count(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = await _youzan_topic(cluster, "op-get")
    async with producer(cluster) as pub, AsyncAdmin(cluster.lookupd_http_addresses,
                                                    timeout=5) as admin, bounded(STEP):
        receipts = [await pub.publish(topic, b"body-%d" % i, partition=1,
                                      trace_id=500 + i, timeout=5) for i in range(3)]
        last = receipts[-1]
        assert last.internal_id is not None and last.queue_offset is not None
        by_id = await admin.get_message(topic, message_id=last.internal_id)
        assert (by_id.body, by_id.trace_id, by_id.partition) == ("body-2", 502, 1)
        assert (by_id.queue_offset, by_id.count) == (last.queue_offset, 3)
        by_offset = await admin.get_message(topic, queue_offset=last.queue_offset,
                                            partition=1)
        assert by_offset.id == last.internal_id
        first = await admin.get_message(topic, count=1, partition=1)
        assert (first.body, first.count, first.queue_offset) == ("body-0", 1, 0)
        with pytest.raises(AdminError) as past:
            await admin.get_message(topic, count=99, partition=1)
        with pytest.raises(AdminError) as delayed:
            await admin.get_message(topic, message_id=last.internal_id,
                                    delayed_channel="ch")
    assert (past.value.status, past.value.message) == (500, "INTERNAL_ERROR")
    assert (delayed.value.status, delayed.value.message) == (
        404, "no message found in delayed queue")


async def test_the_delayed_queue_actions_and_a_forced_finish(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = await _youzan_topic(cluster, "op-delayed")
    async with producer(cluster) as pub, AsyncAdmin(cluster.lookupd_http_addresses,
                                                    timeout=5) as admin, bounded(STEP):
        receipt = await pub.publish(topic, b"x", partition=0, trace_id=1, timeout=5)
        assert len(await admin.empty_delayed(topic, "ch")) == 2
        assert len(await admin.requeue_delayed(topic, "ch", partition=0)) == 1
        assert receipt.internal_id is not None
        with pytest.raises(AdminError) as not_in_flight:
            await admin.finish_message(topic, "ch", receipt.internal_id)
        with pytest.raises(AdminError) as no_channel:
            await admin.empty_delayed(topic, "nochan")
    assert not_in_flight.value.status == 500
    assert "Message ID not in flight" in not_in_flight.value.message
    assert (no_channel.value.status, no_channel.value.message) == (404, "CHANNEL_NOT_FOUND")


async def test_a_tombstone_hides_a_node_from_writers_only(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = await _youzan_topic(cluster, "op-tomb")
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin, bounded(STEP):
        view = await admin.lookup(topic, "r")
        leader = view.leader(0)
        assert leader is not None
        told = await admin.tombstone(topic, leader.http_address)
        assert set(told) == set(cluster.lookupd_http_addresses)
        written = await admin.lookup(topic, "w")
        assert all(node.http_address != leader.http_address
                   for node in written.leaders().values())
        assert (await admin.lookup(topic, "r")).leader(0) is not None
        await admin.tombstone(topic, leader.http_address, restore=True)
        assert 0 in (await admin.lookup(topic, "w")).leaders()


async def test_expansion_never_shrinks_a_topic(nsq_any_cluster: Any) -> None:
    """A smaller partition count is refused. The real lookupd also refuses any expansion for
    about two minutes after the cluster changed ("the cluster is unstable", measured: 105 and
    115 s after a topic's creation), which it may answer first."""
    cluster = nsq_any_cluster
    topic = await _youzan_topic(cluster, "op-expand")
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        with pytest.raises(AdminError) as caught:
            async with bounded(STEP):
                await admin.expand_topic(topic, 1)
    assert caught.value.status == 500
    assert caught.value.message in ("the partition number can not be reduced",
                                    "the cluster is unstable")


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_classic_topic_and_channel_pause(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("op-classic")
    async with bounded(STEP):
        await cluster.create_topic(topic, channels=["ch"])
    async with producer(cluster) as pub, AsyncAdmin(cluster.lookupd_http_addresses,
                                                    timeout=5) as admin, bounded(STEP):
        await pub.publish(topic, b"x", timeout=5)
        node = cluster.nsqd_http_addresses[0]
        assert await admin.pause_topic(topic) == ((None, node),)
        stats = (await admin.stats(node, topic)).topic(topic)
        assert stats is not None and stats.paused
        await admin.unpause_topic(topic)
        await admin.pause_channel(topic, "ch")
        stats = (await admin.stats(node, topic)).topic(topic)
        assert stats is not None and not stats.paused
        channel = stats.channel("ch")
        assert channel is not None and channel.paused
        await admin.unpause_channel(topic, "ch")
        with pytest.raises(AdminError) as skip:
            await admin.skip_channel(topic, "ch")
        with pytest.raises(AdminError) as expand:
            await admin.expand_topic(topic, 2)
        with pytest.raises(AdminError) as missing:
            await admin.pause_topic("nosuch", address=node)
    assert (skip.value.status, skip.value.message) == (404, "NOT_FOUND")
    assert expand.value.status == 404
    assert (missing.value.status, missing.value.message) == (404, "TOPIC_NOT_FOUND")
