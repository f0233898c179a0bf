"""Producer.close() lets publishes already on the wire be answered (the server may have
accepted them: failing them invites a duplicate retry), within its drain timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support import WAIT

from smartnsq import Producer
from smartnsq.errors import ConnectionFailed


async def wait_until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), WAIT)


def on_wire(producer: Producer) -> int:
    return sum(c.pending_count for c in producer.pool.connections.values())


def stored(cluster: Any, topic: str) -> int:
    return len(cluster.state.topics[topic].partitions[0].log)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_close_waits_for_publishes_on_the_wire(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("closewait", channels=["ch"])
    producer = Producer(lookupd=nsq_cluster.lookupd_http_addresses)
    await producer.start()
    await producer.publish("closewait", b"warm-up")
    nsq_cluster.stall(0)  # the next publish is written but not answered yet
    pending = asyncio.ensure_future(producer.publish("closewait", b"in flight"))
    await wait_until(lambda: on_wire(producer) == 1)
    closing = asyncio.ensure_future(producer.close(timeout=WAIT * 3))
    await wait_until(lambda: producer.closed)
    with pytest.raises(ConnectionFailed):
        await producer.publish("closewait", b"after close")  # nothing new once closing
    assert not closing.done() and not pending.done()
    nsq_cluster.resume(0)
    result = await asyncio.wait_for(pending, WAIT)  # answered, not failed
    await asyncio.wait_for(closing, WAIT)
    assert result.node and result.attempts == 1
    assert stored(nsq_cluster, "closewait") == 2


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_close_fails_what_is_unanswered_after_its_timeout(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("closegiveup", channels=["ch"])
    producer = Producer(lookupd=nsq_cluster.lookupd_http_addresses)
    await producer.start()
    await producer.publish("closegiveup", b"warm-up")
    nsq_cluster.stall(0)
    try:
        pending = asyncio.ensure_future(producer.publish("closegiveup", b"stuck"))
        await wait_until(lambda: on_wire(producer) == 1)
        await asyncio.wait_for(producer.close(timeout=0.05), WAIT)
        with pytest.raises(ConnectionFailed):
            await asyncio.wait_for(pending, WAIT)
    finally:
        nsq_cluster.resume(0)
