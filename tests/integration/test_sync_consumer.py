"""The blocking Consumer facade: handlers in threads, run()/stop(), iteration, answers from
other threads. The dev cluster runs on the test's event loop; the facade on its own loop
thread, so blocking calls are made from a worker thread (``asyncio.to_thread``)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from support import WAIT, channel_reaches

from smartnsq import sync
from smartnsq.errors import AlreadyResponded
from smartnsq.message import Message
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection


async def publish(cluster: Any, topic: str, bodies: list[bytes]) -> str:
    address = str(cluster.node_info(cluster.leader_of(topic, 0)).tcp_address)
    host, port = address.rsplit(":", 1)
    conn = await Connection.connect(host, int(port))
    for body in bodies:
        await conn.request(commands.pub(topic, body, 0))
    await conn.close()
    return address


def channel_of(cluster: Any, topic: str) -> Any:
    return cluster.state.topics[topic].partitions[0].channels["ch"]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_blocking_handlers_run_in_threads_until_stop(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("sync", channels=["ch"])
    bodies = [b"%d" % i for i in range(30)]
    address = await publish(nsq_cluster, "sync", bodies)
    seen: list[bytes] = []
    threads: set[str] = set()
    lock = threading.Lock()
    consumer: sync.Consumer | None = None
    problems: list[str] = []  # asserted below: an assert in a handler would only REQ

    def handler(msg: Message) -> None:
        time.sleep(0.002)  # a blocking call, as real handlers make
        with lock:
            seen.append(msg.body)
            threads.add(threading.current_thread().name)
            if len(seen) == len(bodies):
                if consumer is None:
                    problems.append("a handler ran before the consumer existed")
                else:
                    consumer.stop()  # from a handler thread: must not block

    def run() -> dict[str, Any]:
        nonlocal consumer
        consumer = sync.Consumer("sync", "ch", nsqd=[address], handler=handler, threads=4,
                                 max_in_flight=8)
        with consumer:
            assert consumer.run(timeout=WAIT)
            return consumer.async_consumer.stats()

    stats = await asyncio.to_thread(run)
    assert not problems
    assert sorted(seen) == sorted(bodies)
    assert all(name.startswith("smartnsq-handler-sync") for name in threads)
    assert stats.finished == len(bodies) and stats.in_flight == 0
    channel = channel_of(nsq_cluster, "sync")
    await channel_reaches(channel,
                          lambda: channel.finish_count == len(bodies) and channel.in_flight == 0)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_failing_blocking_handler_requeues(nsq_cluster: Any) -> None:
    from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
    await nsq_cluster.create_topic("syncfail", channels=["ch"])
    address = await publish(nsq_cluster, "syncfail", [b"x"])
    attempts: list[int] = []
    done = threading.Event()

    def handler(msg: Message) -> None:
        attempts.append(msg.attempts)
        if msg.attempts == 1:
            raise ValueError("first time fails")
        done.set()

    def run() -> None:
        with sync.Consumer("syncfail", "ch", nsqd=[address], handler=handler,
                           requeue_policy=RequeuePolicy(initial=0.0),
                           backoff_policy=BackoffPolicy(enabled=False)):
            assert done.wait(WAIT)

    await asyncio.to_thread(run)
    assert attempts == [1, 2]
    channel = channel_of(nsq_cluster, "syncfail")
    await channel_reaches(channel,
                          lambda: channel.finish_count == 1 and channel.requeue_count == 1)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_blocking_iteration_and_answers_from_the_calling_thread(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("synciter", channels=["ch"])
    address = await publish(nsq_cluster, "synciter", [b"a", b"b", b"c"])

    def run() -> list[bytes]:
        got = []
        with sync.Consumer("synciter", "ch", nsqd=[address]) as consumer:
            for msg in consumer:
                got.append(msg.body)
                msg.fin()
                with pytest.raises(AlreadyResponded):
                    msg.fin()
                if len(got) == 3:
                    break
        return got

    got = await asyncio.to_thread(run)
    assert sorted(got) == [b"a", b"b", b"c"]
    channel = channel_of(nsq_cluster, "synciter")
    await channel_reaches(channel, lambda: channel.finish_count == 3 and channel.in_flight == 0)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_answers_later_from_another_thread_and_close_is_refused_in_handlers(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("synclater", channels=["ch"])
    address = await publish(nsq_cluster, "synclater", [b"job"])
    taken: list[Message] = []
    refused: list[BaseException] = []
    closed_from_handler: list[bool] = []  # asserted below: an assert in a handler would only REQ
    ready = threading.Event()
    consumer: sync.Consumer | None = None

    def handler(msg: Message) -> None:
        try:
            if consumer is not None:
                consumer.close()
                closed_from_handler.append(True)
        except RuntimeError as exc:
            refused.append(exc)
        msg.disable_auto_response()  # answered later, by another thread
        taken.append(msg)
        ready.set()

    def run() -> dict[str, Any]:
        nonlocal consumer
        consumer = sync.Consumer("synclater", "ch", nsqd=[address], handler=handler)
        with consumer:
            assert ready.wait(WAIT)
            worker = threading.Thread(target=taken[0].fin)
            worker.start()
            worker.join()
        # the drain on close waited for the answer to reach the loop
        return consumer.async_consumer.stats()

    stats = await asyncio.to_thread(run)
    assert not closed_from_handler
    assert len(refused) == 1 and "stop()" in str(refused[0])
    assert stats.finished == 1 and stats.in_flight == 0
    channel = channel_of(nsq_cluster, "synclater")
    await channel_reaches(channel, lambda: channel.finish_count == 1 and channel.in_flight == 0)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_the_final_stats_can_be_read_after_close(nsq_cluster: Any) -> None:
    """``with sync.Consumer(...) as c: ...`` then ``print(c.stats())``: the last snapshot
    (as ``sync.Producer.stats()`` and the async Consumer's give it); only a ``lag=True`` read,
    which asks the nodes, needs an open consumer."""
    from smartnsq.errors import ClientClosed

    await nsq_cluster.create_topic("syncstats", channels=["ch"])
    address = await publish(nsq_cluster, "syncstats", [b"x"])
    done = threading.Event()

    def run() -> Any:
        with sync.Consumer("syncstats", "ch", nsqd=[address],
                           handler=lambda m: done.set()) as consumer:
            assert done.wait(WAIT)
        final = consumer.stats()
        with pytest.raises(ClientClosed):
            consumer.stats(lag=True)
        return final

    final = await asyncio.to_thread(run)
    assert final.received == 1 and final.finished == 1
