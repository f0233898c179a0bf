"""The async Consumer against the dev cluster over real sockets: FIN, REQ and redelivery,
give-up, manual answers, iteration, graceful close, ext headers, SUB_ADVANCED, tracing.

Completion is awaited on events with a timeout (handlers and the dev cluster's channels
signal, see ``tests/support.py``); what the server holds is read from the cluster's state (its
channels' in-flight tables), never from the consumer's own view.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from support import WAIT, Watch, channel_reaches, wait_until

from smartnsq import Consumer, StartPosition
from smartnsq.errors import AlreadyResponded
from smartnsq.message import Message
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection


async def publish(cluster: Any, topic: str, bodies: list[bytes], partition: int = 0,
                  headers: dict[str, str] | None = None, trace_id: int | None = None) -> None:
    """Publish straight to the partition's leader over a raw connection."""
    leader = cluster.node_info(cluster.leader_of(topic, partition))
    host, port = leader.tcp_address.rsplit(":", 1)
    conn = await Connection.connect(host, int(port))
    try:
        for body in bodies:
            if headers is not None:
                data = commands.pub_ext(topic, body, headers, partition)
            elif trace_id is not None:
                data = commands.pub_trace(topic, body, trace_id, partition)
            else:
                data = commands.pub(topic, body, partition)
            await conn.request(data)
    finally:
        await conn.close()


def leader_address(cluster: Any, topic: str, partition: int = 0) -> str:
    return str(cluster.node_info(cluster.leader_of(topic, partition)).tcp_address)


def channel_of(cluster: Any, topic: str, channel: str, partition: int = 0) -> Any:
    return cluster.state.topics[topic].partitions[partition].channels[channel]


class Collector:
    """A handler that records messages and signals when ``n`` arrived."""

    def __init__(self, n: int, fail: Callable[[Message], bool] | None = None) -> None:
        self.n = n
        self.messages: list[Message] = []
        self.done = asyncio.Event()
        self.changed = Watch()
        self.fail = fail

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        self.changed.poke()
        if len(self.messages) >= self.n:
            self.done.set()
        if self.fail is not None and self.fail(msg):
            raise RuntimeError("handler failure (test)")

    async def wait(self) -> None:
        await asyncio.wait_for(self.done.wait(), WAIT)

    async def reach(self, n: int) -> None:
        """Wait for the ``n``-th message (beyond the ``n`` given at construction)."""
        await self.changed.until(lambda: len(self.messages) >= n, WAIT, f"{n} messages")


# -- basics ---------------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_consume_finishes_every_message(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("basic", channels=["ch"])
    bodies = [b"m%d" % i for i in range(50)]
    await publish(nsq_cluster, "basic", bodies)
    got = Collector(50)
    async with Consumer("basic", "ch", nsqd=[leader_address(nsq_cluster, "basic")],
                        handler=got) as consumer:
        await got.wait()
        channel = channel_of(nsq_cluster, "basic", "ch")
        await channel_reaches(channel, lambda: channel.finish_count == 50 and not channel.in_flight)
        stats = consumer.stats()
    assert sorted(m.body for m in got.messages) == sorted(bodies)
    assert stats.finished == 50  # the client counts a FIN when it sends it
    assert stats.requeued == 0 and stats.in_flight == 0
    first = got.messages[0]
    assert first.topic == "basic" and first.channel == "ch" and first.partition == 0
    assert first.node == leader_address(nsq_cluster, "basic")
    assert first.attempts == 1 and first.has_responded and first.finished
    assert first.queue_offset is None and first.headers == {}



def fast_retry() -> dict[str, Any]:
    """Requeue at once and without backoff windows: tests wait on events, not on policies."""
    from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
    return {"requeue_policy": RequeuePolicy(initial=0.0),
            "backoff_policy": BackoffPolicy(enabled=False)}


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_handler_error_requeues_and_redelivers_with_attempts_plus_one(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("retry", channels=["ch"])
    await publish(nsq_cluster, "retry", [b"once"])
    got = Collector(2, fail=lambda m: m.attempts == 1)
    async with Consumer("retry", "ch", nsqd=[leader_address(nsq_cluster, "retry")],
                        handler=got, **fast_retry()) as consumer:
        await got.wait()
        channel = channel_of(nsq_cluster, "retry", "ch")
        await channel_reaches(channel, lambda: channel.finish_count == 1)
        stats = consumer.stats()
    first, second = got.messages
    assert first.id == second.id and first.body == second.body == b"once"
    assert (first.attempts, second.attempts) == (1, 2)
    assert first.requeued and second.finished
    assert stats.finished == 1
    assert stats.requeued == 1 and stats.handler_errors == 1
    assert (channel.requeue_count, channel.finish_count, channel.in_flight) == (1, 1, 0)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_max_attempts_calls_the_give_up_hook_then_fins(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("poison", channels=["ch"])
    await publish(nsq_cluster, "poison", [b"bad"])
    given_up: list[Message] = []
    gave_up = asyncio.Event()

    def on_give_up(msg: Message) -> None:
        given_up.append(msg)
        gave_up.set()

    got = Collector(99, fail=lambda m: True)
    async with Consumer("poison", "ch", nsqd=[leader_address(nsq_cluster, "poison")],
                        handler=got, max_attempts=2, on_give_up=on_give_up,
                        **fast_retry()) as consumer:
        await asyncio.wait_for(gave_up.wait(), WAIT)
        channel = channel_of(nsq_cluster, "poison", "ch")
        await channel_reaches(channel, lambda: channel.finish_count == 1)
        assert consumer.stats().give_ups == 1
    assert [m.attempts for m in got.messages] == [1, 2]
    assert given_up[0].attempts == 3 and given_up[0].finished
    assert channel.in_flight == 0 and channel.depth == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_max_attempts_default_logs_and_fins(nsq_cluster: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("poison2", channels=["ch"])
    await publish(nsq_cluster, "poison2", [b"bad"])
    got = Collector(1, fail=lambda m: True)
    with caplog.at_level(logging.WARNING, "smartnsq.consumer"):
        async with Consumer("poison2", "ch", nsqd=[leader_address(nsq_cluster, "poison2")],
                            handler=got, max_attempts=1, **fast_retry()):
            channel = channel_of(nsq_cluster, "poison2", "ch")
            await channel_reaches(channel, lambda: channel.finish_count == 1)
    assert len(got.messages) == 1
    assert any("giving up" in r.getMessage() for r in caplog.records)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_manual_answers_without_auto_finish(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("manual", channels=["ch"])
    await publish(nsq_cluster, "manual", [b"a", b"b"])
    got = Collector(2)
    async with Consumer("manual", "ch", nsqd=[leader_address(nsq_cluster, "manual")],
                        handler=got, auto_finish=False, **fast_retry()) as consumer:
        await got.wait()
        channel = channel_of(nsq_cluster, "manual", "ch")
        assert consumer.stats().in_flight == 2
        a, b = sorted(got.messages, key=lambda m: m.body)
        assert not a.has_responded
        a.touch()
        a.fin()
        with pytest.raises(AlreadyResponded):
            a.fin()
        with pytest.raises(AlreadyResponded):
            a.req()
        with pytest.raises(AlreadyResponded):
            a.touch()
        b.req(0, backoff=False)
        await got.reach(3)
        assert len(got.messages) == 3
        again = got.messages[2]
        assert again.body == b"b" and again.attempts == 2
        again.fin()
        await channel_reaches(channel,
                              lambda: channel.finish_count == 2 and channel.in_flight == 0)
    assert channel.requeue_count == 1


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_async_iteration(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("iter", channels=["ch"])
    await publish(nsq_cluster, "iter", [b"%d" % i for i in range(5)])
    seen = []
    async with Consumer("iter", "ch", nsqd=[leader_address(nsq_cluster, "iter")]) as consumer:
        async def read() -> None:
            async for msg in consumer:
                seen.append(msg.body)
                msg.fin()
                if len(seen) == 5:
                    return
        await asyncio.wait_for(read(), WAIT)
    assert sorted(seen) == [b"%d" % i for i in range(5)]
    channel = channel_of(nsq_cluster, "iter", "ch")
    assert channel.finish_count == 5 and channel.in_flight == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_iteration_ends_when_closed(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("iterclose", channels=["ch"])
    consumer = Consumer("iterclose", "ch", nsqd=[leader_address(nsq_cluster, "iterclose")])
    await consumer.start()

    async def read() -> int:
        n = 0
        async for msg in consumer:
            msg.fin()
            n += 1
        return n

    reader = asyncio.ensure_future(read())
    channel = channel_of(nsq_cluster, "iterclose", "ch")
    # RDY on the server comes after the client registered the connection
    await channel_reaches(channel, lambda: any(c.rdy for c in channel.consumers))
    assert consumer.connection_count == 1
    await consumer.close()
    assert await asyncio.wait_for(reader, WAIT) == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_graceful_close_finishes_running_handlers_and_requeues_the_rest(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("drain", channels=["ch"])
    await publish(nsq_cluster, "drain", [b"%d" % i for i in range(20)])
    release = asyncio.Event()
    started: list[Message] = []
    all_started = asyncio.Event()

    async def slow(msg: Message) -> None:
        started.append(msg)
        if len(started) == 3:
            all_started.set()
        await release.wait()

    consumer = Consumer("drain", "ch", nsqd=[leader_address(nsq_cluster, "drain")],
                        handler=slow, concurrency=3, max_in_flight=10)
    await consumer.start()
    await asyncio.wait_for(all_started.wait(), WAIT)
    channel = channel_of(nsq_cluster, "drain", "ch")
    # what the client took in is its own state, which nothing signals: polled
    await wait_until(lambda: consumer.stats().received == 10)
    closing = asyncio.ensure_future(consumer.close(timeout=WAIT))
    await channel_reaches(channel, lambda: channel.requeue_count == 7)
    assert consumer.stats().requeued == 7
    assert not closing.done()
    release.set()
    await asyncio.wait_for(closing, WAIT)
    assert all(m.finished for m in started) and len(started) == 3
    await channel_reaches(channel, lambda: channel.in_flight == 0)
    assert channel.finish_count == 3 and channel.requeue_count == 7
    assert channel.depth == 17  # nothing lost: every unhandled message is back in the queue
    assert consumer.closed and consumer.stats().in_flight == 0


# -- ext, tags, advanced subscriptions, tracing --------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_ext_headers_and_desired_tag(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("exts", ext=True, channels=["tagged", "all"])
    await publish(nsq_cluster, "exts", [b"red"], headers={"##client_dispatch_tag": "red",
                                                          "k": "v"})
    await publish(nsq_cluster, "exts", [b"plain"], headers={"k": "w"})
    address = leader_address(nsq_cluster, "exts")
    tagged = Collector(1)
    every = Collector(2)
    async with Consumer("exts", "tagged", nsqd=[address], handler=tagged, desired_tag="red"), \
            Consumer("exts", "all", lookupd=nsq_cluster.lookupd_http_addresses, handler=every):
        await tagged.wait()
        await every.wait()
    assert [m.body for m in tagged.messages] == [b"red"]
    assert tagged.messages[0].headers == {"##client_dispatch_tag": "red", "k": "v"}
    assert sorted((m.body, m.headers["k"]) for m in every.messages) == [(b"plain", "w"),
                                                                         (b"red", "v")]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_ext_support_is_learnt_from_the_server_without_meta(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("extlearn", ext=True, channels=["ch"])
    await publish(nsq_cluster, "extlearn", [b"x"], headers={"a": "1"})
    got = Collector(1)
    async with Consumer("extlearn", "ch", nsqd=[leader_address(nsq_cluster, "extlearn")],
                        handler=got):
        await got.wait()
    assert got.messages[0].headers == {"a": "1"}


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_sub_advanced_from_a_queue_offset_and_a_message_count(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("adv", channels=["first"])
    bodies = [b"m%d" % i for i in range(10)]
    await publish(nsq_cluster, "adv", bodies)
    address = leader_address(nsq_cluster, "adv")
    every = Collector(10)
    async with Consumer("adv", "first", nsqd=[address], handler=every,
                        start=StartPosition.message_count(0)):
        await every.wait()
    by_body = {m.body: m for m in every.messages}
    assert all(m.queue_offset is not None and m.raw_size for m in every.messages)
    offset = by_body[b"m6"].queue_offset
    assert offset is not None
    tail = Collector(4)
    async with Consumer("adv", "from-offset", nsqd=[address], handler=tail,
                        start=StartPosition.queue_offset(offset)):
        await tail.wait()
    assert sorted(m.body for m in tail.messages) == bodies[6:]
    counted = Collector(7)  # msgcount counts from 1, as the real nsqd: the 4th message on
    async with Consumer("adv", "from-count", nsqd=[address], handler=counted,
                        start=StartPosition.message_count(4)):
        await counted.wait()
    assert sorted(m.body for m in counted.messages) == bodies[3:]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_trace_lines_for_traced_messages(nsq_cluster: Any,
                                               caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("traced", channels=["ch"])
    await publish(nsq_cluster, "traced", [b"t-body"], trace_id=424242)
    await publish(nsq_cluster, "traced", [b"untraced"])
    got = Collector(2)
    with caplog.at_level(logging.INFO, "smartnsq.trace"):
        async with Consumer("traced", "ch", nsqd=[leader_address(nsq_cluster, "traced")],
                            handler=got):
            await got.wait()
    lines = [r.getMessage() for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(lines) == 1
    assert "trace_id=424242" in lines[0] and "internal_id=" in lines[0]
    assert "attempts=1" in lines[0] and "local=127.0.0.1:" in lines[0]
    traced = next(m for m in got.messages if m.body == b"t-body")
    assert traced.trace_id == 424242


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_close_from_a_handler_drains_after_it_returns(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("selfclose", channels=["ch"])
    await publish(nsq_cluster, "selfclose", [b"%d" % i for i in range(10)])
    handled: list[bytes] = []
    consumer: Consumer

    async def handler(msg: Message) -> None:
        handled.append(msg.body)
        if len(handled) == 3:
            await consumer.close()  # returns at once; the drain waits for this handler

    consumer = Consumer("selfclose", "ch", nsqd=[leader_address(nsq_cluster, "selfclose")],
                        handler=handler, concurrency=1, max_in_flight=5)
    await consumer.start()
    await asyncio.wait_for(consumer.join(), WAIT)
    channel = channel_of(nsq_cluster, "selfclose", "ch")
    await channel_reaches(channel, lambda: channel.in_flight == 0)
    assert channel.finish_count == len(handled) >= 3
    assert channel.finish_count + channel.depth == 10


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_tag_on_a_plain_topic_falls_back_to_a_plain_subscription(
        nsq_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """...and says so once: the consumer gets untagged messages, which a user who asked for
    a tag would not expect silently."""
    await nsq_cluster.create_topic("plaintag", channels=["ch"])
    await publish(nsq_cluster, "plaintag", [b"x"])
    got = Collector(1)
    with caplog.at_level(logging.WARNING, "smartnsq.consumer"):
        async with Consumer("plaintag", "ch", nsqd=[leader_address(nsq_cluster, "plaintag")],
                            handler=got, desired_tag="red"):
            await got.wait()
    assert got.messages[0].body == b"x" and got.messages[0].headers == {}
    told = [r for r in caplog.records if "desired_tag='red' does nothing" in r.getMessage()]
    assert len(told) == 1


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_requeued_messages_are_not_order_regressions_on_advanced_subscriptions(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("advreq", channels=["ch"])
    await publish(nsq_cluster, "advreq", [b"%d" % i for i in range(6)])
    got = Collector(7, fail=lambda m: m.body == b"1" and m.attempts == 1)
    async with Consumer("advreq", "ch", nsqd=[leader_address(nsq_cluster, "advreq")],
                        handler=got, start=StartPosition.message_count(0),
                        **fast_retry()) as consumer:
        await got.wait()
        assert consumer.stats().order_errors == 0
    assert [m.attempts for m in got.messages if m.body == b"1"] == [1, 2]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_ordered_topic_is_learnt_from_the_server_without_meta(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ordlearn", ordered=True, channels=["ch"])
    await publish(nsq_cluster, "ordlearn", [b"a", b"b", b"c"])
    got = Collector(3)
    async with Consumer("ordlearn", "ch", nsqd=[leader_address(nsq_cluster, "ordlearn")],
                        partitions=[0], handler=got) as consumer:
        await got.wait()
        subs = consumer.stats().subscriptions
        assert subs and all(s.ordered for s in subs)
    assert [m.body for m in got.messages] == [b"a", b"b", b"c"]
    assert all(m.queue_offset is not None for m in got.messages)
