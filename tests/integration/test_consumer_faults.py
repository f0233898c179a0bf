"""The Consumer through faults: a node restarting, connections cut, ordered failures (REQ 0,
never skipped), order regressions reported, pausing with max_in_flight 0, backoff.

Handlers, connections' ``closed`` futures and the dev cluster's channels signal what tests wait
for (``tests/support.py``); nothing is polled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from support import WAIT, Watch, channel_reaches, watch_channels

from smartnsq import Consumer, Producer, StartPosition
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy

FAST: dict[str, Any] = {"requeue_policy": RequeuePolicy(initial=0.0),
                        "backoff_policy": BackoffPolicy(enabled=False),
                        "reconnect_delay": 0.05, "reconnect_delay_max": 0.5,
                        "lookup_options": {"poll_interval": 5.0}}


def channel_of(cluster: Any, topic: str, channel: str, partition: int = 0) -> Any:
    return cluster.state.topics[topic].partitions[partition].channels[channel]


def subscribed(channel: Any, *, besides: Sequence[Any] = ()) -> bool:
    """A consumer (not one of ``besides``) sent RDY on this channel: the client counts that
    connection by then (it registers a connection, then sends its first RDY)."""
    return any(c.rdy and all(c is not old for old in besides) for c in channel.consumers)


async def test_node_restart_resubscribes_and_loses_nothing(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("restart", partitions=2, replicas=1, channels=["ch"])
    seen: set[bytes] = set()
    changed = Watch()

    async def handler(msg: Message) -> None:
        seen.add(msg.body)
        changed.poke()

    lookupd = nsq_cluster.lookupd_http_addresses
    async with Producer(lookupd=lookupd) as producer, \
            Consumer("restart", "ch", lookupd=lookupd, handler=handler, **FAST) as consumer:
        for i in range(20):
            await producer.publish("restart", b"a%d" % i, partition=i % 2)
        await changed.until(lambda: len(seen) == 20, WAIT)
        node = nsq_cluster.leader_of("restart", 0)
        address = nsq_cluster.node_info(node).tcp_address
        lost = [c for c in consumer.connections() if c.address_text == address]
        assert len(lost) == 1
        # the partition-0 channel lives in the cluster state: it outlives its node's restart
        channel = channel_of(nsq_cluster, "restart", "ch", 0)
        watch_channels(changed, channel)
        before = list(channel.consumers)
        await nsq_cluster.stop_node(node)
        await asyncio.wait_for(lost[0].closed, WAIT)
        assert consumer.connection_count == 1
        await nsq_cluster.start_node(node)
        await changed.until(lambda: subscribed(channel, besides=before), WAIT)
        assert consumer.connection_count == 2
        for i in range(20):
            await producer.publish("restart", b"b%d" % i, partition=i % 2)
        await changed.until(lambda: len(seen) == 40, WAIT)
    assert seen == {b"a%d" % i for i in range(20)} | {b"b%d" % i for i in range(20)}


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_cut_connections_are_replaced_and_nothing_is_lost(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("cut", partitions=2, replicas=1, channels=["ch"])
    seen: set[bytes] = set()
    finished = 0
    halfway = asyncio.Event()
    changed = Watch()

    async def handler(msg: Message) -> None:
        nonlocal finished
        seen.add(msg.body)
        finished += 1
        changed.poke()
        if len(seen) == 100:
            halfway.set()

    lookupd = nsq_cluster.lookupd_http_addresses
    bodies = [b"%d" % i for i in range(200)]
    async with Producer(lookupd=lookupd) as producer, \
            Consumer("cut", "ch", lookupd=lookupd, handler=handler, max_in_flight=10,
                     **FAST) as consumer:
        channels = [channel_of(nsq_cluster, "cut", "ch", p) for p in (0, 1)]
        watch_channels(changed, *channels)
        await changed.until(lambda: all(subscribed(c) for c in channels), WAIT)
        assert consumer.connection_count == 2
        for body in bodies[:100]:
            await producer.publish("cut", body)
        await asyncio.wait_for(halfway.wait(), WAIT)
        assert nsq_cluster.cut_connections(which="tcp") >= 2
        for body in bodies[100:]:
            await producer.publish("cut", body)
        await changed.until(lambda: len(seen) == 200
                            and all(c.in_flight == 0 and c.depth == 0 for c in channels), WAIT)
        assert consumer.connection_count == 2
    assert seen == set(bodies)
    # duplicates are possible (answers lost with a cut connection), losses are not
    assert finished >= 200


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_ordered_failure_is_retried_after_its_delay_and_never_skipped(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ord", partitions=1, ordered=True, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    async with Producer(lookupd=lookupd) as producer:
        for i in range(5):
            await producer.publish("ord", b"%d" % i, sharding_key="k")
    handled: list[tuple[bytes, int]] = []
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        handled.append((msg.body, msg.attempts))
        if msg.body == b"2" and msg.attempts <= 3:
            raise RuntimeError("blocked message (test)")
        if msg.body == b"4":
            done.set()

    # the server ignores delayed REQs on ordered channels: the consumer sends REQ 0 and holds
    # the partition for the requeue delay itself; max_attempts without a hook never skips
    async with Consumer("ord", "ch", lookupd=lookupd, handler=handler, max_attempts=2,
                        requeue_policy=RequeuePolicy(initial=0.05),
                        backoff_policy=BackoffPolicy(enabled=False)) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
        stats = consumer.stats()
    assert handled == [(b"0", 1), (b"1", 1), (b"2", 1), (b"2", 2), (b"2", 3), (b"2", 4),
                       (b"3", 1), (b"4", 1)]
    assert stats.give_ups == 2 and stats.order_errors == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_ordered_give_up_hook_may_skip_explicitly(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ordskip", partitions=1, ordered=True, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    async with Producer(lookupd=lookupd) as producer:
        for i in range(3):
            await producer.publish("ordskip", b"%d" % i, sharding_key="k")
    handled: list[bytes] = []
    skipped: list[bytes] = []
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        handled.append(msg.body)
        if msg.body == b"1":
            raise RuntimeError("poison (test)")
        if msg.body == b"2":
            done.set()

    def skip(msg: Message) -> None:
        skipped.append(msg.body)
        msg.fin()  # the explicit decision to skip

    async with Consumer("ordskip", "ch", lookupd=lookupd, handler=handler, max_attempts=2,
                        on_give_up=skip, **FAST):
        await asyncio.wait_for(done.wait(), WAIT)
    assert handled == [b"0", b"1", b"1", b"2"] and skipped == [b"1"]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_an_operators_rewind_is_a_replay_not_a_regression(nsq_cluster: Any) -> None:
    """A setoffset back under a running SUB_ADVANCED consumer: the messages from there are
    handled again, and no order error is counted or reported (genuine regressions, which no
    server here produces, are tests/unit/test_link_rewinds.py's)."""
    await nsq_cluster.create_topic("regress", partitions=1, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    async with Producer(lookupd=lookupd) as producer:
        for i in range(4):
            await producer.publish("regress", b"%d" % i)
    seen: list[Message] = []
    reported: list[str] = []
    changed = Watch()

    def handler(msg: Message) -> None:
        seen.append(msg)
        changed.poke()

    async with Consumer("regress", "ch", lookupd=lookupd, handler=handler,
                        start=StartPosition.message_count(0),
                        on_order_error=lambda m, what: reported.append(what)) as consumer:
        await changed.until(lambda: len(seen) == 4, WAIT)
        # an operator rewinds the channel under the running consumer
        http = nsq_cluster.nsqd_http_addresses[0]
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"http://{http}/channel/setoffset",
                params={"topic": "regress", "partition": "0", "channel": "ch"},
                content=b"msgcount:2")  # counted from 1, as the real nsqd
            assert answer.status_code == 200
        await changed.until(lambda: len(seen) == 7, WAIT)
        assert consumer.stats().order_errors == 0
    assert reported == []
    assert [bytes(m.body) for m in seen] == [b"0", b"1", b"2", b"3", b"1", b"2", b"3"]
    assert [m.body for m in seen] == [b"0", b"1", b"2", b"3", b"1", b"2", b"3"]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_max_in_flight_zero_pauses_and_a_positive_value_resumes(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("pause", partitions=1, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    seen: list[bytes] = []
    changed = Watch()

    def handler(msg: Message) -> None:
        seen.append(msg.body)
        changed.poke()

    async with Producer(lookupd=lookupd) as producer, \
            Consumer("pause", "ch", lookupd=lookupd, handler=handler) as consumer:
        channel = channel_of(nsq_cluster, "pause", "ch")
        watch_channels(changed, channel)
        await changed.until(lambda: subscribed(channel), WAIT)
        assert consumer.connection_count == 1
        consumer.set_max_in_flight(0)
        await changed.until(lambda: all(c.rdy == 0 for c in channel.consumers), WAIT)
        for i in range(5):
            await producer.publish("pause", b"%d" % i)
        assert channel.depth == 5 and not seen  # RDY 0 on the server: nothing is sent
        consumer.set_max_in_flight(10)
        await changed.until(lambda: len(seen) == 5, WAIT)
        assert consumer.max_in_flight == 10


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_failures_back_off_with_rdy_zero(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("backoff", partitions=1, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    failed = asyncio.Event()

    def handler(msg: Message) -> None:
        failed.set()
        raise RuntimeError("downstream down (test)")

    async with Producer(lookupd=lookupd) as producer, \
            Consumer("backoff", "ch", lookupd=lookupd, handler=handler,
                     requeue_policy=RequeuePolicy(initial=0.0),
                     backoff_policy=BackoffPolicy(initial=60.0, max=120.0)) as consumer:
        await producer.publish("backoff", b"x")
        await asyncio.wait_for(failed.wait(), WAIT)
        channel = channel_of(nsq_cluster, "backoff", "ch")
        await channel_reaches(channel, lambda: all(c.rdy == 0 for c in channel.consumers), WAIT)
        stats = consumer.stats()
        assert stats.backoff == "backing_off" and stats.requeued == 1
        assert channel.depth == 1  # requeued at once, but not taken while backing off


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_a_stalled_connection_is_detected_and_replaced(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("stall", partitions=1, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    seen: list[bytes] = []
    changed = Watch()

    def handler(msg: Message) -> None:
        seen.append(msg.body)
        changed.poke()

    async with Producer(lookupd=lookupd) as producer, \
            Consumer("stall", "ch", lookupd=lookupd, handler=handler,
                     heartbeat_interval=1, connect_timeout=1, **FAST) as consumer:
        channel = channel_of(nsq_cluster, "stall", "ch")
        await channel_reaches(channel, lambda: subscribed(channel), WAIT)
        assert consumer.connection_count == 1
        before = consumer.connections()[0]
        stale = list(channel.consumers)
        nsq_cluster.stall(which="tcp")
        await asyncio.wait_for(before.closed, WAIT)  # silent for 2 heartbeats: stalled
        assert "stalled" in str(before.close_reason)
        nsq_cluster.resume(which="tcp")
        await channel_reaches(channel, lambda: subscribed(channel, besides=stale), WAIT)
        assert consumer.connection_count == 1 and consumer.connections()[0] is not before
        await producer.publish("stall", b"after")
        await changed.until(lambda: seen == [b"after"], WAIT)
