"""A publish waiting out a failover resumes when the partition can take writes again, not at
the end of its own back-off.

Each test makes the only timely way to succeed the mechanism under test: the back-offs or the
lookup's spacing are set far longer than the publish's deadline, so a publish that relied on
them would end in ``Timeout``. Nothing here measures time; ``bench/failover.py`` does.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from support import Watch, bounded, channel_reaches, poke_on_log, wait_until

from smartnsq import Consumer, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.profile import FaultProfile
from smartnsq.discovery.lookup import LookupManager

TIMEOUT = 8.0


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_refused_partition_is_probed_on_its_live_leader(nsq_cluster: Any) -> None:
    """A live leader refusing writes (the replica stall's aftermath, an ISR shrink) is asked
    again directly: a publish waiting for the partition is acknowledged by that leader once
    writes work again, although the writers' lookup (then stopped) never lists it again."""
    cluster = nsq_cluster
    await cluster.create_topic("held", partitions=2, replicas=1)
    lookup = LookupManager(cluster.lookupd_http_addresses)
    async with lookup, Producer(lookup=lookup, retry_delay_max=0.2) as producer:
        await producer.publish("held", b"before", partition=0)
        cluster.set_writable("held", 0, False)
        with poke_on_log(Watch(), "smartnsq.producer") as failed:
            async with bounded(TIMEOUT):
                waiting = producer.publish_nowait("held", b"during", partition=0,
                                                  timeout=TIMEOUT)
                # refused, and the lookup has dropped the partition from the writers' view
                await failed.until(lambda: producer.retry_count >= 2)
                await wait_until(lambda: _hidden(lookup, "held", 0))
                # from now on no lookup answer can tell that writes work again
                await cluster.stop_lookupd(0)
                cluster.set_writable("held", 0, True)
                result = await waiting
        assert result.partition == 0
        assert _hidden(lookup, "held", 0)
        routes = producer.pool.routes("held")
        assert routes is not None and routes.held == {0}
        assert [p for p, _ in routes.targets] == [1], "round-robin skips a held partition"


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_partition_dropped_while_its_leader_stalled_is_held_again(
        nsq_cluster: Any) -> None:
    """A partition lookup drops while its leader is stalled is not held there (a retry would
    queue behind the stalled request); once the leader answers again, the waiting publish
    asks it directly, although the (then stopped) lookupd never lists the partition again."""
    cluster = nsq_cluster
    await cluster.create_topic("stalled", partitions=2, replicas=1)
    node = cluster.leader_of("stalled", 0)
    lookup = LookupManager(cluster.lookupd_http_addresses)
    async with lookup, Producer(lookup=lookup, retry_delay_max=0.2,
                                request_timeout=0.5) as producer:
        await producer.publish("stalled", b"before", partition=0)
        (conn,) = producer.pool.connections.values()
        cluster.set_writable("stalled", 0, False)
        cluster.stall(node)
        with _records("smartnsq.producer") as records, \
                poke_on_log(Watch(), "smartnsq.producer") as logged:
            async with bounded(TIMEOUT):
                waiting = producer.publish_nowait("stalled", b"during", partition=0,
                                                  timeout=TIMEOUT)
                # no answer in time; lookup has dropped the partition meanwhile
                await logged.until(lambda: any("attempt 1 failed" in r for r in records))
                await wait_until(lambda: _hidden(lookup, "stalled", 0))
                routes = producer.pool.routes("stalled")
                assert routes is not None and 0 not in routes.leaders, "held on a stalled node"
                await cluster.stop_lookupd(0)
                cluster.resume(node)  # the stalled PUB is answered (refused: not writable)
                await wait_until(lambda: conn.timed_out_count == 0)
                cluster.set_writable("stalled", 0, True)
                result = await waiting
        assert result.partition == 0
        assert _hidden(lookup, "stalled", 0)
    bodies = [m.body for m in cluster.state.partition("stalled", 0).log.messages]
    assert bodies == [b"before", b"during"]


@pytest.mark.nsq_cluster(nodes=2)
async def test_leaderless_wait_ends_when_lookup_names_a_leader(nsq_cluster: Any) -> None:
    """A publish to a partition without leader waits on the route change, and the routes are
    looked up again while it waits: with back-offs longer than its deadline it is still
    acknowledged once the leader is back."""
    cluster = nsq_cluster
    await cluster.create_topic("leaderless", partitions=2, replicas=1)
    lookup = LookupManager(cluster.lookupd_http_addresses)
    async with lookup, Producer(lookup=lookup, retry_delay=30.0,
                                retry_delay_max=30.0) as producer:
        await producer.publish("leaderless", b"before", partition=0)
        victim = cluster.leader_of("leaderless", 0)
        await cluster.stop_node(victim)
        await wait_until(lambda: 0 not in (producer.pool.routes("leaderless")
                                           or _none()).leaders)
        # (the records first: the poke checks the condition after they are kept)
        with _records("smartnsq.producer") as records, \
                poke_on_log(Watch(), "smartnsq.producer") as logged:
            async with bounded(TIMEOUT):
                waiting = producer.publish_nowait("leaderless", b"during", partition=0,
                                                  timeout=TIMEOUT)
                # its first attempt found no leader: it waits (a back-off of 15-30 s)
                await logged.until(lambda: any("attempt 1 failed" in r for r in records))
                # the refresh that failure asked for is done (and found no leader): only a
                # lookup made while the publish waits can see the leader come back
                await lookup.refresh("leaderless", "w")
                await cluster.start_node(victim)
                result = await waiting
        assert result.partition == 0


@contextlib.contextmanager
def _records(logger: str) -> Iterator[list[str]]:
    """The messages logged on ``logger`` while in the block."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep(logging.DEBUG)
    log = logging.getLogger(logger)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _hidden(lookup: LookupManager, topic: str, partition: int) -> bool:
    view = lookup.cached(topic, "w")
    return view is not None and partition not in {
        p for p, info in view.partitions.items() if info.leader is not None}


def _none() -> Any:
    class Empty:
        leaders: dict[int, Any] = {}
        held: frozenset[int] = frozenset()
    return Empty()


LEAVE = FaultProfile(name="slow-handoff", leave_handoff=(1.0, 1.0),
                     leave_slow_handoff=(1.0, 1.0))


async def test_consumer_follows_a_graceful_handoff_before_its_reconnect_backoff() -> None:
    """A leave drops the consumer's connection at once but hands the partition over a second
    later: the consumer learns the new leader from lookup as soon as lookup knows it, not at
    its next reconnect attempt (a back-off of 30 s here, the lookup's regular poll a minute)."""
    async with DevCluster(nodes=2, lookupds=1, profile=LEAVE) as cluster:
        await cluster.create_topic("moving", partitions=1, replicas=2, channels=["c"])
        seen: list[bytes] = []
        got = Watch()

        def handle(message: Any) -> None:
            seen.append(message.body)
            got.poke()

        async with Producer(lookupd=cluster.lookupd_http_addresses) as producer, \
                Consumer("moving", "c", lookupd=cluster.lookupd_http_addresses,
                         handler=handle, reconnect_delay=30.0, reconnect_delay_max=30.0):
            await producer.publish("moving", b"before", partition=0)
            await got.until(lambda: b"before" in seen)
            # the FIN must reach the server before it leaves, or the handoff rightly redelivers
            channel = cluster.state.topics["moving"].partitions[0].channels["c"]
            await channel_reaches(channel, lambda: channel.finish_count == 1)
            old = cluster.leader_of("moving", 0)
            with _records("smartnsq.consumer") as records, \
                    poke_on_log(Watch(), "smartnsq.consumer") as logged:
                await cluster.leave_node(old)
                await logged.until(lambda: any("connection lost" in r for r in records))
            async with bounded(TIMEOUT):
                await producer.publish("moving", b"after", partition=0, timeout=TIMEOUT)
                await got.until(lambda: b"after" in seen, timeout=TIMEOUT)
            assert cluster.leader_of("moving", 0) is not old
        assert seen == [b"before", b"after"]


async def test_publish_waiting_on_a_leaving_nodes_backoff_follows_the_new_leader() -> None:
    """A leaving node refuses new connections before its partitions are handed over, so a
    publish whose connection to it is gone backs off from that node; the back-off (30 s here,
    past the deadline) ends when the routes move, and the publish goes to the new leader
    (before: it slept the node's back-off out: a Timeout here, +0.3 to +1.2 s on the slow
    handoff in bench/failover.py)."""
    async with DevCluster(nodes=2, lookupds=1, profile=LEAVE, proxied=True) as cluster:
        await cluster.create_topic("leaving", partitions=1, replicas=2)
        lookup = LookupManager(cluster.lookupd_http_addresses)
        async with lookup, Producer(lookup=lookup, reconnect_delay=30.0,
                                    reconnect_delay_max=30.0) as producer:
            await producer.publish("leaving", b"before", partition=0)
            old = cluster.leader_of("leaving", 0)
            with _records("smartnsq.producer") as records, \
                    poke_on_log(Watch(), "smartnsq.producer") as logged:
                await cluster.leave_node(old)
                assert cluster.cut_connections(old) > 0  # its connection is gone: redial
                async with bounded(TIMEOUT):
                    waiting = producer.publish_nowait("leaving", b"during", partition=0,
                                                      timeout=TIMEOUT)
                    # the node refuses: the publish backs off from it, before the handoff
                    await logged.until(lambda: any("is backing off" in r for r in records),
                                       timeout=TIMEOUT)
                    assert cluster.leader_of("leaving", 0) is old
                    result = await waiting
            assert result.partition == 0
            assert cluster.leader_of("leaving", 0) is not old
