"""Bad inputs give a clear InvalidArgument before anything is sent (one test per case).

"Nothing sent" is checked twice: the producer opened no connection to any nsqd, and no
partition log of the cluster grew.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from smartnsq import Producer, ProducerConfig
from smartnsq.errors import InvalidArgument, TopicNotFound, TopicNotWritable

pytestmark = pytest.mark.nsq_cluster(nodes=2, lookupds=1)


@pytest.fixture
async def cluster(nsq_cluster: Any) -> Any:
    await nsq_cluster.create_topic("orders", partitions=4, replicas=1)
    await nsq_cluster.create_topic("ordered", partitions=2, replicas=1, ordered=True)
    return nsq_cluster


@pytest.fixture
async def producer(cluster: Any) -> AsyncIterator[Producer]:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        yield p
        assert p.pool.connections == {}, "a connection was opened"
    for topic in cluster.state.topics.values():
        for partition in topic.partitions:
            assert len(partition.log) == 0, "a message was written"


async def test_bad_topic_name(producer: Producer) -> None:
    for bad in ("", "has space", "slash/topic", "x" * 65, "ünïcode", "a#b"):
        with pytest.raises(InvalidArgument, match="topic"):
            await producer.publish(bad, b"x")
    with pytest.raises(InvalidArgument, match="topic"):
        await producer.publish_many("bad topic", [b"x"])


async def test_oversize_body(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="exceeds max_msg_size"):
        await producer.publish("orders", b"x" * (1024 * 1024 + 1))
    with pytest.raises(InvalidArgument, match="exceeds max_msg_size"):
        await producer.publish_many("orders", [b"ok", b"x" * (1024 * 1024 + 1)])


async def test_oversize_body_against_a_configured_limit(cluster: Any) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses, max_msg_size=100,
                        max_body_size=1000) as p:
        with pytest.raises(InvalidArgument, match="max_msg_size 100"):
            await p.publish("orders", b"x" * 101)
        with pytest.raises(InvalidArgument, match="max_body_size 1000"):
            await p.publish_many("orders", [b"x" * 100] * 10)
        assert p.pool.connections == {}


async def test_empty_or_non_bytes_body(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="empty"):
        await producer.publish("orders", b"")
    with pytest.raises(InvalidArgument, match="bytes"):
        await producer.publish("orders", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="at least one"):
        await producer.publish_many("orders", [])


async def test_trace_id_out_of_range(producer: Producer) -> None:
    for bad in (-1, 2**64, 1.5, "7", True):
        with pytest.raises(InvalidArgument, match="trace_id"):
            await producer.publish("orders", b"x", trace_id=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="trace_id"):
        await producer.publish_many("orders", [b"a", b"b"], trace_id=[1, 2**64])
    with pytest.raises(InvalidArgument, match="one id per message"):
        await producer.publish_many("orders", [b"a", b"b"], trace_id=[1])


async def test_bad_header_names(producer: Producer) -> None:
    for bad in ({"": "v"}, {"has space": "v"}, {"naïve": "v"}, {"k v": "v"}, {1: "v"}):
        with pytest.raises(InvalidArgument, match="header name"):
            await producer.publish("orders", b"x", headers=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="value must be a str"):
        await producer.publish("orders", b"x", headers={"k": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match="trace_id"):
        await producer.publish("orders", b"x", headers={"##trace_id": "-3"})
    with pytest.raises(InvalidArgument, match="disagrees"):
        await producer.publish("orders", b"x", headers={"##trace_id": "3"}, trace_id=4)


async def test_headers_on_a_topic_without_ext(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="not an ext topic"):
        await producer.publish("orders", b"x", headers={"color": "red"})


async def test_unknown_partition(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match=r"4 partitions \(0\.\.3\)"):
        await producer.publish("orders", b"x", partition=4)
    with pytest.raises(InvalidArgument, match="partition"):
        await producer.publish("orders", b"x", partition=-1)
    with pytest.raises(InvalidArgument, match="partition"):
        await producer.publish("orders", b"x", partition=1024)
    with pytest.raises(InvalidArgument, match="not both"):
        await producer.publish("orders", b"x", partition=1, sharding_key="k")


async def test_dpub_on_youzan(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="DPUB"):
        await producer.publish("orders", b"x", delay=5)
    with pytest.raises(InvalidArgument, match="delay"):
        await producer.publish("orders", b"x", delay=-1)


async def test_ordered_topic_refuses_unsharded_publishes(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="ordered"):
        await producer.publish("ordered", b"x")
    with pytest.raises(InvalidArgument, match="ordered"):
        await producer.publish_many("ordered", [b"x"])


async def test_unknown_topic(producer: Producer) -> None:
    with pytest.raises(TopicNotFound):
        await producer.publish("never_created", b"x")


async def test_topic_without_channel(cluster: Any, producer: Producer) -> None:
    await cluster.create_topic("silent", channels=[])  # lookupd hides it from writers
    with pytest.raises(TopicNotWritable, match="no channel"):
        await producer.publish("silent", b"x")


async def test_bad_timeout_and_sharding_key(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        await producer.publish("orders", b"x", timeout=0)
    with pytest.raises(InvalidArgument, match="sharding_key"):
        await producer.publish("orders", b"x", sharding_key=1.5)  # type: ignore[arg-type]


def test_bad_configuration() -> None:
    with pytest.raises(InvalidArgument, match="sharding"):
        ProducerConfig(sharding="md5")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="timeout"):
        ProducerConfig(timeout=-1)
    with pytest.raises(InvalidArgument, match="unknown option"):
        Producer(nsqd=["127.0.0.1:4150"], no_such_option=1)
    with pytest.raises(InvalidArgument, match="exactly one"):
        Producer()
    with pytest.raises(InvalidArgument, match="exactly one"):
        Producer(lookupd=["127.0.0.1:4161"], nsqd=["127.0.0.1:4150"])
    with pytest.raises(InvalidArgument, match="host:port"):
        Producer(nsqd=["no-port"])
