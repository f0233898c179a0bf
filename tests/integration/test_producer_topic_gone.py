"""A deleted or unknown topic fails a publish at once with ``TopicNotFound``; a topic lookup
still lists (being created, re-created) is waited for within the call's deadline.

Every publish here has a deadline long enough (``TIMEOUT``) that a call retrying until it
would end in ``Timeout``: the error's class says which path the call took, and the retry
count says that no attempt was sent after lookup said the topic is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import bounded, slow_topic_creation, wait_until

from smartnsq import Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.errors import ServerError, TopicNotFound

TIMEOUT = 8.0
YOUZAN = pytest.mark.nsq_cluster(nodes=3, lookupds=2)
BODY = b"order-event-0001"


def _how_to_create(error: TopicNotFound, topic: str) -> None:
    assert type(error) is TopicNotFound and error.topic == topic
    assert "create it first" in str(error) and "create_topic" in str(error)


@YOUZAN
async def test_a_publish_to_a_deleted_topic_fails_at_once(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("gone", partitions=2, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=TIMEOUT) as producer:
        await producer.publish("gone", BODY)  # the routes are known, connections open
        await cluster.delete_topic("gone")
        async with bounded(TIMEOUT):
            with pytest.raises(TopicNotFound) as first:
                await producer.publish("gone", BODY)
        _how_to_create(first.value, "gone")
        assert "E_TOPIC_NOT_EXIST" in str(first.value)
        cause = first.value.__cause__
        assert isinstance(cause, ServerError) and cause.code == "E_TOPIC_NOT_EXIST"
        assert producer.retry_count == 0  # nothing was sent again after lookup's answer
        # the routes are forgotten: the next calls fail at their lookup, every call alike
        async with bounded(TIMEOUT):
            with pytest.raises(TopicNotFound) as sharded:
                await producer.publish("gone", BODY, sharding_key=7)
            with pytest.raises(TopicNotFound):
                await producer.publish_nowait("gone", BODY)
            with pytest.raises(TopicNotFound):
                await producer.publish_many("gone", [BODY, BODY])
        _how_to_create(sharded.value, "gone")
        assert producer.retry_count == 0
        assert producer.stats().failed.get("TopicNotFound") == 4


@YOUZAN
async def test_every_kind_of_call_fails_at_once_on_its_first_refusal(nsq_cluster: Any) -> None:
    """publish_nowait's fast path, publish_many and a pinned publish each meet the node's
    refusal themselves (separate producers: no forgotten routes between them)."""
    cluster = nsq_cluster
    calls: dict[str, Callable[[Producer], Awaitable[Any]]] = {
        "nowait": lambda p: p.publish_nowait("gone2", BODY),
        "many": lambda p: p.publish_many("gone2", [BODY, BODY]),
        "pinned": lambda p: p.publish("gone2", BODY, partition=1),
    }
    await cluster.create_topic("gone2", partitions=2, channels=["ch"])
    producers = [Producer(lookupd=cluster.lookupd_http_addresses, timeout=TIMEOUT)
                 for _ in calls]
    try:
        for producer in producers:
            await producer.publish("gone2", BODY, partition=1)
            await producer.publish("gone2", BODY, partition=0)
        await cluster.delete_topic("gone2")
        for producer, (name, call) in zip(producers, calls.items(), strict=True):
            async with bounded(TIMEOUT):
                with pytest.raises(TopicNotFound) as info:
                    await call(producer)
            assert isinstance(info.value.__cause__, ServerError), name
            assert producer.retry_count == 0, name
    finally:
        for producer in producers:
            await producer.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_topic_never_created_fails_at_once_with_nsqd(nsq_cluster: Any) -> None:
    """With ``nsqd=`` there is no lookup: the node's answer is the last word."""
    node = nsq_cluster.nsqd_tcp_addresses[0]
    async with Producer(nsqd=[node], timeout=TIMEOUT) as producer:
        for _ in range(2):
            async with bounded(TIMEOUT):
                with pytest.raises(TopicNotFound) as info:
                    await producer.publish("never_made", BODY)
            _how_to_create(info.value, "never_made")
            assert node in str(info.value) and "lookupd=" in str(info.value)
        assert producer.retry_count == 0


@YOUZAN
async def test_a_re_created_topic_is_published_to(nsq_cluster: Any) -> None:
    """Deleted and created again with fewer partitions: the node refuses the old partition,
    lookup lists the topic, so the call retries on the new routes and succeeds."""
    cluster = nsq_cluster
    await cluster.create_topic("again", partitions=2, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=TIMEOUT) as producer:
        assert {(await producer.publish("again", BODY, partition=p)).partition
                for p in (0, 1)} == {0, 1}
        await cluster.delete_topic("again")
        await cluster.create_topic("again", partitions=1, channels=["ch"])
        results = []
        async with bounded(TIMEOUT):
            for _ in range(2):  # round-robin: one of them goes to the old partition 1
                results.append(await producer.publish("again", BODY))
        assert {r.partition for r in results} == {0}
        assert max(r.attempts for r in results) >= 2  # (one was refused, then retried)


@YOUZAN
async def test_a_topic_being_created_is_waited_for(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    sends = slow_topic_creation(cluster, 2, topics=["slowly"])
    async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
        await admin.create_topic("slowly", 1, 1, wait=False)  # no leader until a 2nd send
        async with Producer(lookupd=cluster.lookupd_http_addresses,
                            timeout=TIMEOUT) as producer:
            publish = asyncio.ensure_future(producer.publish("slowly", BODY))
            await wait_until(lambda: producer.retry_count >= 2, TIMEOUT)
            assert not publish.done()
            await admin.create_topic("slowly", 1, 1, channels=["ch"], timeout=TIMEOUT)
            async with bounded(TIMEOUT):
                result = await publish
    assert result.partition == 0 and result.attempts > 1
    assert len(sends) >= 2


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_classic_nodes_create_a_deleted_topic_again(nsq_cluster: Any) -> None:
    """Classic nsqd creates a topic on its first PUB: a deleted topic is published to, on
    both paths (nothing here says the topic is gone)."""
    cluster = nsq_cluster
    async with Producer(nsqd=cluster.nsqd_tcp_addresses, timeout=TIMEOUT) as direct:
        await direct.publish("cgone", BODY)
        async with Producer(lookupd=cluster.lookupd_http_addresses,
                            timeout=TIMEOUT) as looked_up:
            await looked_up.publish("cgone", BODY)
            async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
                await admin.delete_topic("cgone")
            async with bounded(TIMEOUT):
                assert (await looked_up.publish("cgone", BODY)).attempts == 1
                assert (await direct.publish("cgone", BODY)).attempts == 1
