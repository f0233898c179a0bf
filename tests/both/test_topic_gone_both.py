"""A deleted or never-created topic, on both clusters (dev and the real servers).

What the real servers answer (and the dev cluster does alike): youzan nsqd refuses a PUB for
a topic it does not have with a fatal ``E_TOPIC_NOT_EXIST``, and a writers' lookup answers
404 at once after ``/topic/delete`` (readers' lookups list the topic a few tenths of a second
longer); classic nsqd creates a topic on its first PUB, deleted or not. So on youzan a publish
fails at once with ``TopicNotFound``, and on classic it is accepted. The deadline of every
publish (``TIMEOUT``) is long enough that a call retrying until it would end in ``Timeout``.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import bounded, fresh_name

from smartnsq import Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.errors import ServerError, TopicNotFound

TIMEOUT = 8.0
BODY = b"order-event-0001"


async def _delete(cluster: Any, topic: str) -> None:
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin, bounded(10):
        await admin.delete_topic(topic)


def _refused(error: TopicNotFound, topic: str) -> None:
    assert type(error) is TopicNotFound and error.topic == topic
    assert "create it first" in str(error)
    cause = error.__cause__
    assert isinstance(cause, ServerError) and cause.code == "E_TOPIC_NOT_EXIST"


@pytest.mark.nsq_cluster(nodes=3, lookupds=2)
async def test_youzan_publish_after_delete_fails_at_once(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("gone")
    async with bounded(60):
        await cluster.create_topic(topic, partitions=2, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=TIMEOUT) as producer:
        async with bounded(TIMEOUT):
            await producer.publish(topic, BODY)
        await _delete(cluster, topic)
        async with bounded(TIMEOUT):
            with pytest.raises(TopicNotFound) as info:
                await producer.publish(topic, BODY)
        _refused(info.value, topic)
        async with bounded(TIMEOUT):  # the routes are gone: the next call fails at lookup
            with pytest.raises(TopicNotFound):
                await producer.publish(topic, BODY, sharding_key=3)
        assert producer.retry_count == 0


@pytest.mark.nsq_cluster(nodes=3, lookupds=2)
async def test_youzan_never_created_topic_with_nsqd_fails_at_once(nsq_any_cluster: Any) -> None:
    node = nsq_any_cluster.nsqd_tcp_addresses[0]
    topic = fresh_name("never")
    async with Producer(nsqd=[node], timeout=TIMEOUT) as producer, bounded(TIMEOUT):
        with pytest.raises(TopicNotFound) as info:
            await producer.publish(topic, BODY)
    _refused(info.value, topic)
    assert node in str(info.value)
    assert producer.retry_count == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_classic_publish_after_delete_creates_the_topic_again(
        nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("cgone")
    async with Producer(nsqd=cluster.nsqd_tcp_addresses, timeout=TIMEOUT) as direct:
        async with bounded(TIMEOUT):
            await direct.publish(topic, BODY)  # created by its first PUB
        async with Producer(lookupd=cluster.lookupd_http_addresses,
                            timeout=TIMEOUT) as looked_up:
            async with bounded(TIMEOUT):
                await looked_up.publish(topic, BODY)
            await _delete(cluster, topic)
            async with bounded(TIMEOUT):
                assert (await looked_up.publish(topic, BODY)).attempts == 1
            await _delete(cluster, topic)
            async with bounded(TIMEOUT):
                assert (await direct.publish(topic, BODY)).attempts == 1
