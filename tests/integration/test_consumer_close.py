"""``Consumer.close(timeout)`` is one deadline for the whole close.

Nodes stall after the consumer subscribed (the proxied dev cluster's ``stall``): CLS is never
answered and nothing the consumer writes is read. The drain, CLS, the connection closes and
the subscription stops share ``timeout``; whatever is not done by then is aborted, and a
message whose handler did not succeed is never FINed: the server redelivers it.

Every public call is bounded (``tests/support.py``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support import WAIT, Watch, bounded, keeps_deadline, wait_until

from smartnsq import Consumer, Producer, sync
from smartnsq.errors import InvalidArgument
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.testing.hostile import SilentNsqd, StallingNsqd

PARTITIONS = 4
FAST: dict[str, Any] = {"requeue_policy": RequeuePolicy(initial=0.0),
                        "backoff_policy": BackoffPolicy(enabled=False),
                        "reconnect_delay": 0.05, "reconnect_delay_max": 0.5}


async def _topic(cluster: Any, topic: str, messages: int = 0) -> None:
    """A topic with a partition per connection spread over the nodes, holding ``messages``
    (spread over the partitions)."""
    await cluster.create_topic(topic, partitions=PARTITIONS, replicas=1, channels=["ch"])
    if messages:
        async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
            for i in range(messages):
                await producer.publish(topic, b"%d" % i, partition=i % PARTITIONS)


async def _redelivered(cluster: Any, topic: str, expected: set[bytes]) -> None:
    """Every message is still on the server: a fresh consumer gets them all."""
    seen: set[bytes] = set()
    changed = Watch()

    def handler(msg: Message) -> None:
        seen.add(msg.body)
        changed.poke()

    async with Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handler, **FAST) as again:
        await changed.until(lambda: seen >= expected, WAIT)
        async with bounded(again.drain_timeout):
            await again.close()


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_close_keeps_its_deadline_when_every_node_stalls(nsq_cluster: Any) -> None:
    """Subscribed to 4 partitions on 2 nodes, idle; the nodes stall: CLS is never answered.
    Each connection's CLS used to wait ``close_timeout`` (5 s) past the close's own 1 s."""
    await _topic(nsq_cluster, "stalled")
    consumer = Consumer("stalled", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=lambda m: None, **FAST)
    async with bounded(1.0):
        await consumer.start()
    await wait_until(lambda: consumer.connection_count == PARTITIONS, WAIT)
    nsq_cluster.stall()
    async with bounded(1.0):
        await consumer.close(timeout=1.0)
    assert consumer.closed and consumer.connection_count == 0
    nsq_cluster.resume()


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_close_with_slow_handlers_in_flight_keeps_its_deadline_and_fins_nothing(
        nsq_cluster: Any) -> None:
    """Handlers hold every message when the nodes stall: the drain, CLS and the closes share
    the 2 s; the handlers' messages are left to the server, which redelivers all of them."""
    bodies = {b"%d" % i for i in range(2 * PARTITIONS)}
    await _topic(nsq_cluster, "slow", len(bodies))
    started: set[bytes] = set()
    release = asyncio.Event()
    changed = Watch()

    async def slow(msg: Message) -> None:
        started.add(msg.body)
        changed.poke()
        await release.wait()

    consumer = Consumer("slow", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=slow, **FAST)
    await consumer.start()
    await changed.until(lambda: started == bodies, WAIT)
    nsq_cluster.stall()
    async with bounded(2.0):
        await consumer.close(timeout=2.0)
    release.set()  # too late: the connections are gone
    await asyncio.sleep(0)
    assert consumer.closed and consumer.stats().finished == 0
    nsq_cluster.resume()
    await _redelivered(nsq_cluster, "slow", bodies)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_handlers_that_succeed_during_the_drain_are_fined_the_others_redelivered(
        nsq_cluster: Any) -> None:
    """Half the handlers finish during the close (their FIN goes out, nodes healthy); the
    other half never do. The close ends in time, having FINed exactly the first half."""
    bodies = {b"%d" % i for i in range(2 * PARTITIONS)}
    await _topic(nsq_cluster, "half", len(bodies))
    started: dict[bytes, asyncio.Event] = {}
    changed = Watch()

    async def handler(msg: Message) -> None:
        gate = started[msg.body] = asyncio.Event()
        changed.poke()
        await gate.wait()

    consumer = Consumer("half", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, **FAST)
    await consumer.start()
    await changed.until(lambda: set(started) == bodies, WAIT)
    done = sorted(bodies)[:PARTITIONS]
    closing = asyncio.get_running_loop().create_task(consumer.close(timeout=2.0))
    async with bounded(2.0):
        for body in done:
            started[body].set()
        await closing
    assert consumer.stats().finished == len(done)
    await _redelivered(nsq_cluster, "half", bodies - set(done))


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_async_with_exit_keeps_the_drain_timeout(nsq_cluster: Any) -> None:
    """Leaving ``async with`` closes within ``drain_timeout``, stalled nodes or not."""
    bodies = {b"%d" % i for i in range(PARTITIONS)}
    await _topic(nsq_cluster, "exit", len(bodies))
    started: set[bytes] = set()
    changed = Watch()

    async def stuck(msg: Message) -> None:
        started.add(msg.body)
        changed.poke()
        await asyncio.Event().wait()

    consumer = Consumer("exit", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=stuck, drain_timeout=1.0, **FAST)
    await consumer.start()
    await changed.until(lambda: started == bodies, WAIT)
    nsq_cluster.stall()
    async with bounded(1.0), consumer:
        pass
    assert consumer.closed
    nsq_cluster.resume()


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_a_second_close_with_a_shorter_timeout_keeps_its_own(nsq_cluster: Any) -> None:
    """A close under way with a long timeout; a second close(1) must not wait for it."""
    bodies = {b"%d" % i for i in range(PARTITIONS)}
    await _topic(nsq_cluster, "twice", len(bodies))
    started: set[bytes] = set()
    changed = Watch()

    async def stuck(msg: Message) -> None:
        started.add(msg.body)
        changed.poke()
        await asyncio.Event().wait()

    consumer = Consumer("twice", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=stuck, **FAST)
    await consumer.start()
    await changed.until(lambda: started == bodies, WAIT)
    nsq_cluster.stall()
    first = asyncio.get_running_loop().create_task(consumer.close(timeout=60.0))
    await asyncio.sleep(0)
    async with bounded(1.0):
        await consumer.close(timeout=1.0)
    assert consumer.closed
    async with bounded(1.0):
        await first
    nsq_cluster.resume()
    await _redelivered(nsq_cluster, "twice", bodies)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_close_with_no_time_left_aborts_at_once(nsq_cluster: Any) -> None:
    """``close(0)``: no drain, no CLS; everything aborted; nothing FINed."""
    bodies = {b"%d" % i for i in range(PARTITIONS)}
    await _topic(nsq_cluster, "zero", len(bodies))
    started: set[bytes] = set()
    changed = Watch()

    async def stuck(msg: Message) -> None:
        started.add(msg.body)
        changed.poke()
        await asyncio.Event().wait()

    consumer = Consumer("zero", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=stuck, **FAST)
    await consumer.start()
    await changed.until(lambda: started == bodies, WAIT)
    nsq_cluster.stall()
    async with bounded(0.0):
        await consumer.close(timeout=0)
    assert consumer.closed and consumer.stats().finished == 0
    nsq_cluster.resume()
    await _redelivered(nsq_cluster, "zero", bodies)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_sync_consumer_close_keeps_its_deadline(nsq_cluster: Any) -> None:
    """The blocking facade: handlers block in threads, the nodes stall, ``close(1)``."""
    bodies = {b"%d" % i for i in range(PARTITIONS)}
    await _topic(nsq_cluster, "blocking", len(bodies))
    started: set[bytes] = set()
    gate = threading.Event()

    def blocking(msg: Message) -> None:
        started.add(msg.body)
        gate.wait(WAIT)

    lookupd = nsq_cluster.lookupd_http_addresses
    consumer = await asyncio.to_thread(
        lambda: sync.Consumer("blocking", "ch", lookupd=lookupd, handler=blocking,
                              threads=PARTITIONS, **FAST))
    try:
        await wait_until(lambda: started == bodies, WAIT)
        nsq_cluster.stall()

        def close() -> None:
            with keeps_deadline(1.0):
                consumer.close(timeout=1.0)

        await asyncio.to_thread(close)
        assert consumer.closed
    finally:
        gate.set()
        nsq_cluster.resume()
    assert consumer.async_consumer.stats().finished == 0
    await _redelivered(nsq_cluster, "blocking", bodies)


@pytest.mark.parametrize("timeout", [-1, float("inf"), float("nan"), "1", True])
async def test_a_bad_close_timeout_is_refused_naming_it(timeout: Any) -> None:
    consumer = Consumer("t", "ch", nsqd=["127.0.0.1:4150"], handler=lambda m: None)
    with pytest.raises(InvalidArgument, match="timeout"):
        await consumer.close(timeout=timeout)
    async with bounded(0.0):
        await consumer.close(timeout=0)
    assert consumer.closed


@pytest.mark.parametrize("peer", [SilentNsqd, StallingNsqd])
async def test_close_keeps_its_deadline_against_hostile_nsqds(peer: Any) -> None:
    """Three hostile nodes: one never answers, the others stall mid-frame after the
    handshake; the consumer is stuck subscribing to each when it closes."""
    async with peer() as a, peer() as b, peer() as c:
        consumer = Consumer("t", "ch", nsqd=[a.address, b.address, c.address],
                            handler=lambda m: None, **FAST)
        async with bounded(1.0):
            await consumer.start()
        await wait_until(lambda: min(a.connections, b.connections, c.connections) > 0, WAIT)
        async with bounded(1.0):
            await consumer.close(timeout=1.0)
        assert consumer.closed and consumer.connection_count == 0
