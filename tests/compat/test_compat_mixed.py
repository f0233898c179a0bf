"""One Producer given the lookupds of a classic and a youzan cluster (a migration).

Topics live on the classic cluster only, on the youzan cluster only, or on both; every claim is
checked against what the servers stored.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support import classic_bodies

from smartnsq import Producer
from smartnsq.compat import MigrationChooser, MigrationPolicy
from smartnsq.compat.migration import split_routes
from smartnsq.errors import InvalidArgument, TopicNotFound
from smartnsq.model.routes import TopicRoutes


def youzan_bodies(cluster: Any, topic: str) -> list[bytes]:
    info = cluster.state.topics.get(topic)
    if info is None or info.classic:
        return []
    return [m.body for p in info.partitions for m in p.log.messages]


@pytest.fixture
async def two_clusters(nsq_cluster_factory: Any) -> tuple[Any, Any]:
    classic = await nsq_cluster_factory(nodes=2, lookupds=1, mode="classic")
    youzan = await nsq_cluster_factory(nodes=2, lookupds=1)
    await classic.create_topic("old_only")
    await youzan.create_topic("new_only", partitions=2)
    await classic.create_topic("moving")
    await youzan.create_topic("moving", partitions=2)
    return classic, youzan


def lookupds(classic: Any, youzan: Any) -> list[str]:
    return [*classic.lookupd_http_addresses, *youzan.lookupd_http_addresses]


async def test_each_topic_goes_where_it_lives(two_clusters: tuple[Any, Any]) -> None:
    classic, youzan = two_clusters
    async with Producer(lookupd=lookupds(classic, youzan)) as p:
        old = await p.publish("old_only", b"to classic")
        new = await p.publish("new_only", b"to youzan", sharding_key="k")
        moving = await p.publish("moving", b"default side")
        keyed_old = await p.publish("old_only", b"keyed", sharding_key="k")
        with pytest.raises(TopicNotFound):
            await p.publish("nowhere", b"x", timeout=2)
    assert old.partition is None and new.partition is not None
    assert moving.partition is not None  # no policy: youzan
    assert keyed_old.partition is None
    assert sorted(classic_bodies(classic, "old_only")) == [b"keyed", b"to classic"]
    assert youzan_bodies(youzan, "new_only") == [b"to youzan"]
    assert youzan_bodies(youzan, "moving") == [b"default side"]
    assert classic_bodies(classic, "moving") == []


@pytest.mark.parametrize(("policy", "expect_youzan"), [
    (MigrationPolicy(prefer="youzan"), 20),
    (MigrationPolicy(prefer="classic"), 0),
    (MigrationPolicy(youzan_percent=100), 20),
    (MigrationPolicy(youzan_percent=0), 0),
])
async def test_prefer_policies(two_clusters: tuple[Any, Any], policy: MigrationPolicy,
                               expect_youzan: int) -> None:
    classic, youzan = two_clusters
    async with Producer(lookupd=lookupds(classic, youzan), migration=policy) as p:
        for i in range(20):
            await p.publish("moving", b"m%d" % i)
        await p.publish("old_only", b"unaffected")
    assert len(youzan_bodies(youzan, "moving")) == expect_youzan
    assert len(classic_bodies(classic, "moving")) == 20 - expect_youzan
    assert classic_bodies(classic, "old_only") == [b"unaffected"]


async def test_percentage_and_sticky_keys(two_clusters: tuple[Any, Any]) -> None:
    classic, youzan = two_clusters
    chooser = MigrationChooser(MigrationPolicy(youzan_percent=50))
    async with Producer(lookupd=lookupds(classic, youzan), migration=chooser) as p:
        for i in range(40):
            await p.publish("moving", b"u%d" % i)
        keyed: dict[str, set[str | None]] = {}
        for round_ in range(3):
            for k in range(10):
                result = await p.publish("moving", b"k%d/%d" % (k, round_),
                                         sharding_key=f"key{k}")
                keyed.setdefault(f"key{k}", set()).add(
                    "youzan" if result.partition is not None else "classic")
    both = youzan_bodies(youzan, "moving") + classic_bodies(classic, "moving")
    assert len(both) == 70  # nothing lost, nothing doubled
    unkeyed_youzan = [b for b in youzan_bodies(youzan, "moving") if b.startswith(b"u")]
    assert 0 < len(unkeyed_youzan) < 40  # a random half, within reason
    assert all(len(sides) == 1 for sides in keyed.values())  # a key stays on its side
    assert chooser.counts[("moving", "youzan")] + chooser.counts[("moving", "classic")] == 70


async def test_per_topic_policy(two_clusters: tuple[Any, Any]) -> None:
    classic, youzan = two_clusters
    policy = MigrationPolicy(prefer="youzan",
                             topics={"moving": MigrationPolicy(prefer="classic")})
    async with Producer(lookupd=lookupds(classic, youzan), migration=policy) as p:
        await p.publish("moving", b"x")
    assert classic_bodies(classic, "moving") == [b"x"]


async def test_unkeyed_publish_falls_over_to_the_other_side(
        two_clusters: tuple[Any, Any]) -> None:
    classic, youzan = two_clusters
    async with Producer(lookupd=lookupds(classic, youzan),
                        migration=MigrationPolicy(prefer="classic")) as p:
        await p.publish("moving", b"first")
        for node in range(len(classic.nodes)):
            await classic.stop_node(node)
        async def classic_gone() -> None:
            while (routes := p.pool.routes("moving")) is not None and routes.nodes:
                p.pool.refresh("moving")
                await p.pool.changed("moving", 0.5)

        await asyncio.wait_for(classic_gone(), 10)
        await p.publish("moving", b"second")
    assert classic_bodies(classic, "moving") == [b"first"]
    assert youzan_bodies(youzan, "moving") == [b"second"]


def test_policy_validation_and_chooser() -> None:
    with pytest.raises(InvalidArgument):
        MigrationPolicy(prefer="both")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        MigrationPolicy(youzan_percent=101)
    with pytest.raises(InvalidArgument):
        MigrationPolicy(topics={"t": "classic"})  # type: ignore[dict-item]
    routes = TopicRoutes("t", partition_num=2, youzan=True,
                         leaders={0: ("a", 1), 1: ("b", 1)}, nodes=(("c", 1),))
    yz, cl = split_routes(routes)
    assert yz.leaders == routes.leaders and not yz.nodes and yz.youzan
    assert cl.nodes == routes.nodes and not cl.leaders and cl.youzan is False
    draws = iter([0.1, 0.9, 0.29, 0.31])
    chooser = MigrationChooser(MigrationPolicy(youzan_percent=30),
                               random_source=lambda: next(draws))
    sides = ["youzan" if chooser.choose(routes).leaders else "classic" for _ in range(4)]
    assert sides == ["youzan", "classic", "youzan", "classic"]
    only_youzan = TopicRoutes("t", partition_num=1, youzan=True, leaders={0: ("a", 1)})
    assert chooser.choose(only_youzan) is only_youzan
    # keys: a stable side each, about the configured share over many keys
    keyed = MigrationChooser(MigrationPolicy(youzan_percent=30))
    sides_by_key = Counter(keyed.side_for("t", f"k{i}") for i in range(4000))
    assert 0.25 < sides_by_key["youzan"] / 4000 < 0.35
    assert all(keyed.side_for("t", f"k{i}") == keyed.side_for("t", f"k{i}")
               for i in range(100))
    # raising the share only moves keys towards youzan
    more = MigrationChooser(MigrationPolicy(youzan_percent=60))
    assert all(more.side_for("t", f"k{i}") == "youzan" for i in range(500)
               if keyed.side_for("t", f"k{i}") == "youzan")


async def test_a_lookupd_changing_kind(nsq_cluster_factory: Any) -> None:
    """A migration in place: the address answers classic, then youzan; the next lookup decides."""
    classic = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic")
    await classic.create_topic("t")
    address = classic.lookupd_http_addresses[0]
    port = int(address.rsplit(":", 1)[1])
    async with Producer(lookupd=[address],
                        lookup_options={"poll_interval": 0.2, "discover_interval": 0.2}) as p:
        before = await p.publish("t", b"to classic")
        await classic.stop()
        youzan = await nsq_cluster_factory(nodes=1, lookupds=1, lookupd_http_ports=[port])
        await youzan.create_topic("t", partitions=2)
        after = await p.publish("t", b"to youzan", timeout=10)
    assert before.partition is None and after.partition is not None
    assert youzan_bodies(youzan, "t") == [b"to youzan"]
