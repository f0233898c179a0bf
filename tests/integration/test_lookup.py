"""LookupManager against the embedded dev cluster: youzan, classic and mixed lookupds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smartnsq import Producer
from smartnsq.discovery.lookup import LookupManager, TopicChange
from smartnsq.discovery.route_source import LookupRouteSource
from smartnsq.errors import LookupFailed, TopicNotFound, TopicNotWritable
from smartnsq.model.routes import parse_address
from smartnsq.transport.http import HttpClient

# lookups are cheap locally; keep the background polling out of the way unless a test wants it
QUIET = {"poll_interval": 300.0, "discover_interval": 300.0}


def leader_address(cluster: Any, topic: str, partition: int) -> tuple[str, int]:
    node = cluster.node_info(cluster.leader_of(topic, partition))
    return (node.broadcast_address, node.tcp_port)


def status(lm: LookupManager, address: str) -> Any:
    return next(s for s in lm.health() if s.address == address)


class Changes:
    """Collects TopicChange notifications; ``await next()`` waits for the next one."""

    def __init__(self, lm: LookupManager) -> None:
        self.seen: list[TopicChange] = []
        self._event = asyncio.Event()
        lm.subscribe(self)

    def __call__(self, change: TopicChange) -> None:
        self.seen.append(change)
        self._event.set()

    async def next(self, timeout: float = 5.0) -> TopicChange:
        count = len(self.seen)
        while len(self.seen) == count:
            self._event.clear()
            await asyncio.wait_for(self._event.wait(), timeout)
        return self.seen[count]


# -- youzan -------------------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=3, lookupds=2)
async def test_youzan_views_and_discovery(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=3, replicas=1, ext=True)
    await cluster.create_topic("seq", partitions=2, replicas=1, ordered=True)
    seed = cluster.lookupd_http_addresses[0]
    async with LookupManager([seed], **QUIET) as lm:
        # one seed is enough: /listlookup names the other lookupd
        assert sorted(lm.lookupds) == sorted(cluster.lookupd_http_addresses)
        assert [s.classic for s in lm.health()] == [False, False]
        view = await lm.view("orders")
        assert view.youzan and view.access == "w"
        assert view.partition_num == 3 and view.extend_support and not view.ordered
        assert sorted(view.partitions) == [0, 1, 2]
        for pid, part in view.partitions.items():
            assert part.leader is not None and part.leader.youzan
            assert part.leader.address == leader_address(cluster, "orders", pid)
        assert len(view.producers) == 3
        assert sorted(view.lookupds) == sorted(cluster.lookupd_http_addresses)  # both asked
        assert await lm.view("orders") is view  # cached
        readers = await lm.view("orders", "r")
        assert readers.access == "r" and readers.partitions == view.partitions
        seq = await lm.view("seq")
        assert seq.ordered and seq.partition_num == 2
        routes = LookupRouteSource.view_routes(seq)
        assert routes.ordered and routes.youzan and sorted(routes.leaders) == [0, 1]


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_missing_topics(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("silent", partitions=1, channels=[])
    async with LookupManager(nsq_cluster.lookupd_http_addresses, **QUIET) as lm:
        for access in ("w", "r"):
            with pytest.raises(TopicNotFound):
                await lm.view("never_created", access)
        with pytest.raises(TopicNotWritable, match="no channel"):
            await lm.view("silent", "w")
        assert (await lm.view("silent", "r")).partitions  # readers see it
        assert lm.counters["rounds"] == 4
        with pytest.raises(ValueError):
            await lm.view("bad topic!")
        with pytest.raises(ValueError):
            await lm.view("silent", "x")


# -- classic and mixed --------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=2, lookupds=2, mode="classic")
async def test_classic_lookupds(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("clicks", channels=["c"])
    async with LookupManager(cluster.lookupd_http_addresses, **QUIET) as lm:
        # no /listlookup on classic lookupds: each seed is used as it is
        assert lm.lookupds == cluster.lookupd_http_addresses
        assert all(s.classic for s in lm.health())
        view = await lm.view("clicks")
        assert not view.youzan and view.meta is None and view.partitions == {}
        assert {n.address for n in view.producers} == {
            parse_address(a) for a in cluster.nsqd_tcp_addresses}
        assert not any(n.youzan for n in view.producers)
        assert view.channels == ("c",)
        with pytest.raises(TopicNotFound):
            await lm.view("nothing_here")


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, classic_nodes=1, mode="mixed")
async def test_mixed_cluster(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=2, replicas=1)
    classic = cluster.node_info(cluster.classic_nodes[0])
    # a classic nsqd creates a topic on first publish and registers it with the lookupd
    async with Producer(nsqd=[f"{classic.broadcast_address}:{classic.tcp_port}"]) as p:
        await p.publish("legacy", b"x")
    async with LookupManager(cluster.lookupd_http_addresses, **QUIET) as lm:
        orders = await lm.view("orders")
        assert orders.youzan and sorted(orders.partitions) == [0, 1]
        assert all(n.youzan for n in orders.producers)
        changes = Changes(lm)
        # readers see the classic node as a producer without a partition (pseudo partition)
        legacy = await asyncio.wait_for(_until_listed(lm, "legacy"), 5)
        assert legacy.youzan and legacy.partitions == {}
        assert [n.address for n in legacy.unpartitioned] == [
            (classic.broadcast_address, classic.tcp_port)]
        assert not legacy.unpartitioned[0].youzan
        assert changes.seen and changes.seen[-1].new == legacy


async def _until_listed(lm: LookupManager, topic: str) -> Any:
    while True:  # registration is asynchronous on a real cluster; each try is one round
        try:
            view = await lm.view(topic, "r", refresh=True)
        except TopicNotFound:
            view = None
        if view is not None and view.producers:
            return view
        await lm.refresh(topic, "r")


# -- changes ------------------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=3, lookupds=2)
async def test_leader_move_is_notified(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=2, replicas=2)
    async with LookupManager(cluster.lookupd_http_addresses, **QUIET) as lm:
        changes = Changes(lm)
        before = await lm.view("orders")
        first = changes.seen[-1]
        assert first.old is None and first.added == {0, 1}
        old_leader = before.leader(1)
        cluster.move_leader("orders", 1)
        new_address = leader_address(cluster, "orders", 1)
        assert old_leader is not None and new_address != old_leader.address
        await lm.refresh("orders")  # settles once the round is done
        change = changes.seen[-1]
        assert change.old == before and change.new == lm.cached("orders")
        assert set(change.leaders_moved) == {1}
        was, now = change.leaders_moved[1]
        assert was == old_leader and now is not None and now.address == new_address
        assert not change.added and not change.removed

        # a leader that dies with no replica taking over: the partition leaves the view...
        await cluster.stop_node(cluster.leader_of("orders", 0))
        await lm.refresh("orders")
        assert changes.seen[-1].removed == {0}
        assert sorted(lm.cached("orders").partitions) == [1]  # type: ignore[union-attr]


@pytest.mark.nsq_cluster(nodes=3, lookupds=1)
async def test_watched_topics_are_polled(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=2, replicas=2)
    async with LookupManager(cluster.lookupd_http_addresses, poll_interval=0.05,
                             jitter=0.5) as lm:
        changes = Changes(lm)
        lm.watch("orders")  # looked up at once, then polled
        first = await changes.next()
        assert first.old is None and first.new is not None
        cluster.move_leader("orders", 0)
        moved = await changes.next()
        assert set(moved.leaders_moved) == {0}
        assert lm.counters["polls"] >= 1
        lm.unwatch("orders")
        assert lm.stats()["watched"] == []


@pytest.mark.nsq_cluster(nodes=2, lookupds=2)
async def test_refresh_bursts_are_coalesced(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("orders", partitions=2)
    async with LookupManager(nsq_cluster.lookupd_http_addresses, **QUIET) as lm:
        await lm.view("orders")
        rounds, requests = lm.counters["rounds"], lm.counters["requests"]
        # a burst of publish errors: each asks for a refresh
        done = [lm.refresh("orders", "w") for _ in range(100)]
        await asyncio.wait_for(asyncio.gather(*done), 5)
        assert lm.counters["rounds"] == rounds + 1
        assert lm.counters["refresh_rounds"] == 1
        assert lm.counters["refresh_coalesced"] == 99
        assert lm.counters["requests"] == requests + 2  # one request per lookupd
        # access=None refreshes what is known of the topic; nothing known, nothing done
        await lm.refresh("orders")
        assert lm.counters["refresh_rounds"] == 2
        await lm.refresh("unknown_topic")
        assert lm.counters["refresh_rounds"] == 2


# -- lookupd health -----------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=2, lookupds=2)
async def test_dead_lookupd_is_skipped_and_seed_kept(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=2)
    seed, other = cluster.lookupd_http_addresses
    async with LookupManager([seed], **QUIET) as lm:
        assert set(lm.lookupds) == {seed, other}
        await cluster.stop_lookupd(0)  # the seed (and leader) dies
        view = await lm.view("orders", refresh=True)  # the other one answers
        assert view.lookupds == (other,)
        dead = status(lm, seed)
        assert dead.failures == 1 and dead.retry_in > 0 and dead.seed and dead.errors == 1
        asked = dead.requests
        # while its back-off runs, the dead lookupd is not asked at all
        await lm.view("orders", refresh=True)
        assert status(lm, seed).requests == asked
        assert status(lm, other).failures == 0
        # the healthy one is asked first
        assert [s.address for s in lm.health()] == [seed, other]  # seeds listed first


@pytest.mark.nsq_cluster(nodes=2, lookupds=2)
async def test_lookupd_recovers_and_non_seed_is_forgotten(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=2)
    seed, other = cluster.lookupd_http_addresses
    async with LookupManager([seed], backoff=0.01, backoff_max=0.02, forget_after=2,
                             **QUIET) as lm:
        await cluster.stop_lookupd(0)
        await lm.view("orders", refresh=True)
        assert status(lm, seed).failures == 1
        await cluster.start_lookupd(0)

        async def until_healthy() -> None:
            while status(lm, seed).failures:  # each try is one lookup round (no sleep)
                await lm.view("orders", refresh=True)

        await asyncio.wait_for(until_healthy(), 5)
        assert status(lm, seed).requests > 1

        # a discovered lookupd failing forget_after times in a row is dropped; seeds never are
        await cluster.stop_lookupd(1)

        async def until_forgotten() -> None:
            while other in lm.lookupds:
                await lm.view("orders", refresh=True)

        await asyncio.wait_for(until_forgotten(), 5)
        assert lm.lookupds == [seed]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_no_lookupd_answers(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("orders")
    async with LookupManager(nsq_cluster.lookupd_http_addresses, attempts=2,
                             retry_delay=0.01, retry_delay_max=0.02, **QUIET) as lm:
        await lm.view("orders")
        await nsq_cluster.stop_lookupd(0)
        with pytest.raises(LookupFailed, match="no lookupd answered") as info:
            await lm.view("orders", refresh=True)
        assert not isinstance(info.value, TopicNotFound)
        assert lm.cached("orders") is not None  # the last good view is kept
        assert status(lm, nsq_cluster.lookupd_http_addresses[0]).errors >= 2


# -- as the producer's route source -------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=3, lookupds=2)
async def test_shared_manager_with_producers(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("orders", partitions=3)
    async with LookupManager(cluster.lookupd_http_addresses, **QUIET) as lm:
        for _ in range(2):
            async with Producer(lookup=lm) as producer:
                result = await producer.publish("orders", b"x", partition=2)
                assert result.partition == 2
        assert not lm.closed  # producers do not close a manager they were given
        assert lm.counters["rounds"] == 1  # the second producer used the cached view
        assert lm.stats()["watched"] == []  # and both stopped watching on close


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_shared_http_client(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("orders")
    async with HttpClient() as client:  # no Accept header of its own
        async with LookupManager(nsq_cluster.lookupd_http_addresses, client=client,
                                 **QUIET) as lm:
            view = await lm.view("orders")
            assert view.youzan and view.partition_num == 1
        assert not client.closed  # the caller's client stays open
