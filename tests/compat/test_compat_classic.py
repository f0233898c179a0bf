"""The feature table on classic nodes, publishing side (docs/compat.md), against a classic cluster.

What a publish claims is checked against what the classic nsqd stored (the cluster state).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from smartnsq import Producer
from smartnsq.compat import ClassicPolicy
from smartnsq.errors import InvalidArgument
from smartnsq.model.dialect import rendezvous
from smartnsq.model.routes import parse_address


def stored(cluster: Any, topic: str) -> dict[str, list[Any]]:
    """Messages each classic node holds for ``topic``, by "host:tcp_port"."""
    out = {}
    for i, address in enumerate(cluster.nsqd_tcp_addresses):
        node_id = cluster.node_info(i).node_id
        copy = cluster.state.classic_partition(topic, node_id, create=False)
        out[address] = [] if copy is None else list(copy.log.messages)
    return out


@pytest.mark.nsq_cluster(nodes=3, lookupds=1, mode="classic")
async def test_sharding_key_goes_to_one_node_per_key(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("keyed")
    nodes = [parse_address(a) for a in nsq_cluster.nsqd_tcp_addresses]
    keys = [f"order-{i}" for i in range(30)]
    async with Producer(nsqd=list(reversed(nsq_cluster.nsqd_tcp_addresses))) as p:
        for round_ in range(2):
            for key in keys:
                result = await p.publish("keyed", b"%s/%d" % (key.encode(), round_),
                                         sharding_key=key)
                expected = rendezvous(key.encode(), nodes)
                assert result.node == f"{expected[0]}:{expected[1]}"
                assert result.partition is None
    held = stored(nsq_cluster, "keyed")
    assert all(held.values())  # 30 keys spread over all 3 nodes
    for key in keys:
        where = {a for a, msgs in held.items()
                 for m in msgs if m.body.startswith(key.encode() + b"/")}
        assert len(where) == 1  # every message of a key on one node, in publish order
        bodies = [m.body for m in held[where.pop()] if m.body.startswith(key.encode() + b"/")]
        assert bodies == [key.encode() + b"/0", key.encode() + b"/1"]


def test_rendezvous_moves_few_keys_when_a_node_goes() -> None:
    nodes = [("10.0.0.1", 4150), ("10.0.0.2", 4150), ("10.0.0.3", 4150), ("10.0.0.4", 4150)]
    keys = [b"k%d" % i for i in range(2000)]
    before = {k: rendezvous(k, nodes) for k in keys}
    after = {k: rendezvous(k, nodes[:3]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == nodes[3] for k in moved)  # only the gone node's keys move
    assert {rendezvous(k, list(reversed(nodes))) for k in keys[:50]} == \
        {before[k] for k in keys[:50]}  # the node list order does not matter


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_sharding_refused_when_the_policy_says_so(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("keyed")
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses,
                        classic=ClassicPolicy(shard_over_nodes=False)) as p:
        with pytest.raises(InvalidArgument, match="no partitions"):
            await p.publish("keyed", b"x", sharding_key="k")
    assert stored(nsq_cluster, "keyed") == {nsq_cluster.nsqd_tcp_addresses[0]: []}


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_trace_id_is_logged_not_sent(nsq_cluster: Any,
                                          caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("traced")
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses) as p:
        result = await p.publish("traced", b"hello", trace_id=777)
        batch = await p.publish_many("traced", [b"a", b"b"], trace_id=[1, 2])
    assert result.trace_id == 777 and result.internal_id is None
    assert batch.count == 2 and batch.internal_id is None
    held = stored(nsq_cluster, "traced")[nsq_cluster.nsqd_tcp_addresses[0]]
    assert [m.body for m in held] == [b"hello", b"a", b"b"]  # plain PUB / MPUB arrived
    lines = [r.getMessage() for r in caplog.records if r.name == "smartnsq.trace"]
    assert any("topic=traced" in line and "trace_id=777" in line and "no receipt" in line
               for line in lines)
    assert any(line.startswith("MPUB topic=traced") for line in lines)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_trace_everything_on_classic(nsq_cluster: Any,
                                           caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("traced")
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses, trace=True) as p:
        await p.publish("traced", b"plain")
    assert any("topic=traced" in r.getMessage() for r in caplog.records
               if r.name == "smartnsq.trace")


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_headers_refused_by_default(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("headed")
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses) as p:
        with pytest.raises(InvalidArgument, match="drop_headers"):
            await p.publish("headed", b"x", headers={"k": "v"})
        with pytest.raises(InvalidArgument, match="classic nsqd"):
            await p.publish_many("headed", [b"x", b"y"], headers={"k": "v"})
        await p.publish("headed", b"no headers")  # the connection is still fine
    held = stored(nsq_cluster, "headed")[nsq_cluster.nsqd_tcp_addresses[0]]
    assert [m.body for m in held] == [b"no headers"]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_headers_dropped_on_opt_in(nsq_cluster: Any,
                                         caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("headed")
    policy = ClassicPolicy(drop_headers=True)
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses, classic=policy) as p:
        await p.publish("headed", b"one", headers={"k": "v"}, trace_id=5)
        await p.publish("headed", b"two", headers={"k": "v"})
        await p.publish_many("headed", [b"three", b"four"], headers=[{"k": "v"}, None])
    held = stored(nsq_cluster, "headed")[nsq_cluster.nsqd_tcp_addresses[0]]
    assert [(m.body, m.ext) for m in held] == [(b"one", None), (b"two", None),
                                               (b"three", None), (b"four", None)]
    warnings = [r for r in caplog.records if r.name == "smartnsq.compat"
                and "headers are dropped" in r.getMessage()]
    assert len(warnings) == 1  # once per topic


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, mode="classic")
async def test_dpub_on_classic(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("later")
    async with Producer(nsqd=nsq_cluster.nsqd_tcp_addresses) as p:
        result = await p.publish("later", b"soon", delay=0.05, sharding_key="k")
    held = stored(nsq_cluster, "later")
    assert [m.body for m in held[result.node]] == [b"soon"]
    assert held[result.node][0].deliver_after > 0


def test_policy_consumer_hooks() -> None:
    strict = ClassicPolicy()
    assert strict.classic_subscription("t").rdy_cap is None
    with pytest.raises(InvalidArgument, match="best_effort_order"):
        strict.classic_subscription("t", ordered=True)
    with pytest.raises(InvalidArgument, match="SUB_ADVANCED"):
        strict.classic_subscription("t", start=object())
    lax = ClassicPolicy(best_effort_order=True)
    plan = lax.classic_subscription("t", ordered=True, node="h:1")
    assert plan.rdy_cap == 1 and plan.best_effort_order
    with pytest.raises(InvalidArgument, match="SUB_ADVANCED"):
        lax.classic_subscription("t", ordered=True, start=object())
    with pytest.raises(InvalidArgument):
        ClassicPolicy(drop_headers="yes")  # type: ignore[arg-type]
