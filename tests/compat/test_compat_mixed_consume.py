"""One Consumer over both kinds of cluster, and the consumer rows of the feature table.

* two clusters (a classic one and a youzan one) given to one Consumer: a topic present on
  both during a migration is read from both;
* a youzan cluster with classic nsqd registered beside the youzan ones (DevCluster mixed
  mode): the classic nodes' copy of a topic is read too;
* ordered consumption and start positions on classic nodes: ClassicPolicy's answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import WAIT

from smartnsq import Consumer, Producer
from smartnsq.compat import ClassicPolicy
from smartnsq.errors import InvalidArgument
from smartnsq.message import Message
from smartnsq.protocol.commands import StartPosition

HOOK_WAIT = 3.0  # the refusal comes right after the first lookup


async def collect(consumer: Consumer, count: int) -> list[Message]:
    got: list[Message] = []

    async def read() -> None:
        async for message in consumer:
            got.append(message)
            message.fin()
            if len(got) == count:
                return

    await asyncio.wait_for(read(), WAIT)
    return got


async def test_one_consumer_reads_a_topic_on_both_clusters(nsq_cluster_factory: Any) -> None:
    classic = await nsq_cluster_factory(nodes=2, lookupds=1, mode="classic")
    youzan = await nsq_cluster_factory(nodes=2, lookupds=1)
    await classic.create_topic("moving", channels=["c"])
    await youzan.create_topic("moving", partitions=2, channels=["c"])
    async with Producer(nsqd=classic.nsqd_tcp_addresses) as old, \
            Producer(lookupd=youzan.lookupd_http_addresses) as new:
        for i in range(4):
            await old.publish("moving", b"old%d" % i)
            await new.publish("moving", b"new%d" % i)
    lookupds = [*classic.lookupd_http_addresses, *youzan.lookupd_http_addresses]
    async with Consumer("moving", "c", lookupd=lookupds, max_in_flight=20) as consumer:
        got = await collect(consumer, 8)
    assert sorted(m.body for m in got) == sorted([b"old%d" % i for i in range(4)]
                                                 + [b"new%d" % i for i in range(4)])
    assert {m.partition for m in got if m.body.startswith(b"new")} == {0, 1}
    assert all(not m.youzan for m in got if m.body.startswith(b"old"))


async def test_classic_nodes_beside_youzan_ones(nsq_cluster_factory: Any) -> None:
    """A youzan lookupd lists classic nsqd registered to it (partition -11) to readers."""
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, classic_nodes=1, mode="mixed")
    classic_node = cluster.nsqd_tcp_addresses[-1]
    assert cluster.node_info(len(cluster.nodes) - 1).classic
    await cluster.create_topic("new", partitions=1, channels=["c"])
    async with Producer(nsqd=[classic_node]) as p:
        await p.publish("legacy", b"from classic")  # created on first use, as classic does
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        await p.publish("new", b"from youzan")
    lookupd = cluster.lookupd_http_addresses
    async with Consumer("legacy", "c", lookupd=lookupd) as old, \
            Consumer("new", "c", lookupd=lookupd) as new:
        got = await collect(old, 1) + await collect(new, 1)
    assert [(m.body, m.youzan) for m in got] == [(b"from classic", False),
                                                 (b"from youzan", True)]


# -- the consumer rows of the feature table -------------------------------------------------------
# The Consumer asks ClassicPolicy.classic_subscription() before subscribing to a classic node.


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_ordered_on_classic_is_refused(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("plain", channels=["c"])
    consumer = Consumer("plain", "c", lookupd=nsq_cluster.lookupd_http_addresses,
                        ordered=True)
    with pytest.raises(InvalidArgument, match="best_effort_order"):
        async with consumer:
            await asyncio.wait_for(consumer.join(), HOOK_WAIT)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_start_position_on_classic_is_refused(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("plain", channels=["c"])
    consumer = Consumer("plain", "c", lookupd=nsq_cluster.lookupd_http_addresses,
                        start=StartPosition.end())
    with pytest.raises(InvalidArgument, match="SUB_ADVANCED"):
        async with consumer:
            await asyncio.wait_for(consumer.join(), HOOK_WAIT)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_best_effort_order_on_classic(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("plain", channels=["c"])
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses) as p:
        for i in range(5):
            await p.publish("plain", b"%d" % i)
    async with Consumer("plain", "c", lookupd=nsq_cluster.lookupd_http_addresses,
                        ordered=True, max_in_flight=10,
                        classic=ClassicPolicy(best_effort_order=True)) as consumer:
        got = await collect(consumer, 5)
        subs = consumer.stats().subscriptions
        assert subs and all(s.rdy <= 1 for s in subs)  # RDY 1 per classic node
    assert [m.body for m in got] == [b"%d" % i for i in range(5)]
