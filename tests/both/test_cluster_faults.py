"""The client through the youzan cluster's faults, on the dev cluster and the real servers.

A partition leader dies (SIGKILL) or leaves (SIGTERM) while a ``Producer`` publishes to both
partitions of a 2-replica topic and a ``Consumer`` reads them; then the leader lookupd dies.
What must hold on both clusters:

* nothing acknowledged is lost: every publish that returned is consumed;
* every publish ends within its timeout (``keeps_deadline``), failing only with the
  documented retriable errors (``Timeout``, a retriable ``ServerError``, a connection
  error), or succeeds once the partition has a leader again;
* a graceful leave costs well under a few seconds and fails no publish;
* with the leader lookupd gone, the client keeps discovering through the other one, and a
  topic created through the new leader lookupd is found and served.

On the real cluster a SIGKILL leaves the partitions paused for 21-49 s (docs/devcluster.md,
"Node loss (SIGKILL)"), so there is exactly one SIGKILL test; the dev cluster plays
the same sequence on a fast profile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from support import Watch, bounded, fresh_name, keeps_deadline

from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.devcluster.profile import FaultProfile
from smartnsq.errors import ConnectionFailed, NSQError, ServerError, Timeout
from smartnsq.message import Message

FAST_LOOKUP = {"poll_interval": 0.5, "discover_interval": 5.0}
CONSUMER_OPTIONS = {"reconnect_delay": 0.1, "reconnect_delay_max": 1.0,
                    "lookup_options": FAST_LOOKUP}

FAST = FaultProfile(
    name="both-faults", leaderless_window=(1.5, 2.5), elect_not_writable=(0.3, 0.3),
    replica_stall=(2.0, 2.0), isr_shrink=(2.5, 3.0), replica_catchup=(3.5, 3.5),
    leave_handoff=(0.07, 0.33), leave_slow_handoff=(0.5, 1.0), leave_stall=(0.5, 0.5))
"""The real sequence (docs/devcluster.md, "Real failure modes, on a clock") in a few seconds,
for the dev case."""

PUBLISH_TIMEOUT = 10.0
"""Each publish's deadline: shorter than the real cluster's pause after a SIGKILL, so
publishes in flight then must end with a documented error on time."""

KILL_BOUND = 180.0
"""How long the SIGKILL test may wait for both partitions to take publishes again. The real
leaderless window is 21-49 s, but a 2-replica partition left with one in-sync replica is below
its write quorum and takes writes only once a spare node has caught up: 93-139 s after the
kill (112 s measured here), plus a loaded machine."""

LEAVE_COST = 8.0
"""The longest a graceful leave may hold a partition's publishes (real: handoffs of 0.07-4.1 s
and a 3.1 s stall on a partition whose leader stays up, on a loaded machine)."""

WORKERS = 4  # publishers at once (two per partition), so publishes are in flight at the fault
AFTER = 5  # acknowledged publishes per partition after the fault before the test stops

DOCUMENTED = (Timeout, ServerError, ConnectionFailed)


@dataclass
class Traffic:
    """What the publishers and the consumer did."""

    acked: dict[bytes, int] = field(default_factory=dict)  # body -> partition
    acked_at: dict[int, list[tuple[float, float]]] = field(
        default_factory=lambda: defaultdict(list))  # partition -> (started, ended) per ack
    failures: list[tuple[str, float, NSQError]] = field(default_factory=list)
    consumed: set[bytes] = field(default_factory=set)
    fault_at: float | None = None
    in_flight: int = 0  # publishes awaiting their answer now
    in_flight_at_fault: int = 0
    watch: Watch = field(default_factory=Watch)

    def describe(self) -> str:
        since = self.fault_at or 0.0
        return (f"acknowledged per partition after the fault "
                f"{[self.acked_after(p, since) for p in (0, 1)]}, failures "
                f"{[(body, round(took, 2), repr(exc)) for body, took, exc in self.failures[-6:]]}")

    def acked_after(self, partition: int, moment: float) -> int:
        return sum(1 for started, _ in self.acked_at[partition] if started >= moment)

    def longest_gap(self, partition: int, after: float) -> float:
        """The longest time the partition went without an acknowledgement, from ``after``."""
        ends = sorted(end for _, end in self.acked_at[partition])
        longest, last = 0.0, after
        for end in ends:
            if end >= after:
                longest = max(longest, end - last)
                last = end
        return longest


async def _publisher(producer: Producer, topic: str, worker: int, traffic: Traffic,
                     stop: asyncio.Event) -> None:
    """Publish to partition ``worker % 2`` without a pause until the fault (so publishes are
    in flight when it comes) and after it until the partition has ``AFTER`` acknowledgements
    started after the fault; then wait for the others: enough traffic to see the fault, not
    a flood to consume afterwards."""
    partition = worker % 2

    def done() -> bool:
        since = traffic.fault_at
        return since is not None and traffic.acked_after(partition, since) >= AFTER

    n = 0
    while not stop.is_set():
        if done():
            await traffic.watch.until(stop.is_set, KILL_BOUND + 60, "the end of the test")
            continue
        body = b"w%d-%d" % (worker, n)
        n += 1
        started = time.monotonic()
        traffic.in_flight += 1
        try:
            with keeps_deadline(PUBLISH_TIMEOUT):
                result = await producer.publish(topic, body, partition=partition,
                                                timeout=PUBLISH_TIMEOUT)
        except NSQError as exc:
            traffic.failures.append((body.decode(), time.monotonic() - started, exc))
            traffic.watch.poke()
            continue
        finally:
            traffic.in_flight -= 1
        assert result.partition == partition
        traffic.acked[body] = partition
        traffic.acked_at[partition].append((started, time.monotonic()))
        traffic.watch.poke()


async def _run_through(cluster: Any, fault: str, replicas: int) -> tuple[Traffic, float]:
    """Publish and consume a 2-partition topic while the leader of partition 0 is killed or
    leaves. Returns what happened and when the fault was made."""
    topic = fresh_name("fault")
    await cluster.create_topic(topic, partitions=2, replicas=replicas, channels=["ch"])
    traffic = Traffic()

    def handle(message: Message) -> None:
        traffic.consumed.add(bytes(message.body))
        traffic.watch.poke()

    stop = asyncio.Event()
    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle,
                        **CONSUMER_OPTIONS)
    async with bounded(10):
        await consumer.start()
    try:
        async with Producer(lookupd=cluster.lookupd_http_addresses,
                            lookup_options=FAST_LOOKUP) as producer:
            workers = [asyncio.create_task(_publisher(producer, topic, w, traffic, stop))
                       for w in range(WORKERS)]
            try:
                await traffic.watch.until(
                    lambda: all(len(traffic.acked_at[p]) >= AFTER for p in (0, 1)),
                    30, "publishes before the fault")
                async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
                    view = await admin.lookup(topic, "w")
                leader = view.partitions[0].leader
                assert leader is not None
                victim = "{}:{}".format(*leader.address)
                at = time.monotonic()
                traffic.fault_at = at
                traffic.in_flight_at_fault = traffic.in_flight
                if fault == "kill":
                    await cluster.kill_node(_node_index(cluster, victim))
                else:
                    await cluster.leave_node(_node_index(cluster, victim))
                bound = KILL_BOUND if fault == "kill" else 30.0
                try:
                    await traffic.watch.until(
                        lambda: all(traffic.acked_after(p, at) >= AFTER for p in (0, 1)),
                        bound, f"{AFTER} acknowledged publishes per partition after the "
                        f"{fault}")
                except TimeoutError as exc:
                    raise AssertionError(f"{exc}; {traffic.describe()}") from None
            finally:
                stop.set()
                traffic.watch.poke()
                async with bounded(PUBLISH_TIMEOUT + 5):
                    await asyncio.gather(*workers)
        await traffic.watch.until(lambda: set(traffic.acked) <= traffic.consumed, 60,
                                  "every acknowledged publish consumed")
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    return traffic, at


def _node_index(cluster: Any, address: str) -> int:
    """The index of the nsqd whose TCP address is ``address``."""
    return list(cluster.nsqd_tcp_addresses).index(address)


def _lost(traffic: Traffic) -> list[bytes]:
    return sorted(body for body in traffic.acked if body not in traffic.consumed)


@pytest.mark.nsq_cluster(nodes=3, lookupds=2, fresh=True, profile=FAST)
async def test_leader_sigkill_while_publishing_and_consuming(nsq_any_cluster: Any) -> None:
    traffic, at = await _run_through(nsq_any_cluster, "kill", replicas=2)
    assert traffic.in_flight_at_fault > 0
    assert _lost(traffic) == []
    wrong = [(body, exc) for body, _, exc in traffic.failures
             if not isinstance(exc, DOCUMENTED) or not exc.retriable]
    assert wrong == [], wrong
    paused = max(traffic.longest_gap(p, at) for p in (0, 1))
    print(f"\nSIGKILL: {traffic.in_flight_at_fault} publishes in flight at the kill, "
          f"{len(traffic.acked)} acknowledged, {len(traffic.failures)} failed "
          f"({sorted({type(e).__name__ for _, _, e in traffic.failures})}), longest pause "
          f"{paused:.1f}s")


@pytest.mark.nsq_cluster(nodes=3, lookupds=2, fresh=True, profile=FAST)
async def test_leader_sigterm_while_publishing_and_consuming(nsq_any_cluster: Any) -> None:
    # 3 replicas: the partition keeps its write quorum (2) after the leave; with 2 replicas it
    # does not, see test_leave_below_the_write_quorum
    traffic, at = await _run_through(nsq_any_cluster, "leave", replicas=3)
    gaps = {p: traffic.longest_gap(p, at) for p in (0, 1)}
    print(f"\nSIGTERM: {len(traffic.acked)} acknowledged, longest pause per partition "
          + ", ".join(f"p{p} {gap:.2f}s" for p, gap in gaps.items()) + "; "
          + traffic.describe())
    assert traffic.in_flight_at_fault > 0
    assert _lost(traffic) == []
    assert traffic.failures == []
    assert max(gaps.values()) < LEAVE_COST, gaps


SLOW_CATCHUP = dataclasses.replace(FAST, replica_catchup=(60.0, 60.0))
"""The dev case of the below-quorum leave: the real catch-up takes ~110 s, longer than the
test looks."""


@pytest.mark.nsq_cluster(nodes=3, lookupds=2, fresh=True, profile=SLOW_CATCHUP)
async def test_leave_below_the_write_quorum(nsq_any_cluster: Any) -> None:
    """SIGTERM of the leader of a 2-replica partition: the leadership moves at once, but the
    partition, left with one in-sync replica, takes no write until a spare node has caught up
    (the real servers: ~112 s; not waited for here). Reads go on; nothing acknowledged is lost;
    a publish meanwhile ends on time with a retriable error."""
    cluster = nsq_any_cluster
    topic = fresh_name("below-quorum")
    await cluster.create_topic(topic, partitions=1, replicas=2, channels=["ch"])
    consumed: set[bytes] = set()
    watch = Watch()

    def handle(message: Message) -> None:
        consumed.add(bytes(message.body))
        watch.poke()

    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        lookup_options=FAST_LOOKUP) as producer, \
            Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle,
                     **CONSUMER_OPTIONS), \
            AsyncAdmin(cluster.lookupd_http_addresses, timeout=2.0) as admin:
        acked = set()
        for i in range(5):
            async with bounded(10):
                await producer.publish(topic, b"before-%d" % i, partition=0, timeout=10)
            acked.add(b"before-%d" % i)
        old = (await admin.lookup(topic, "w")).partitions[0].leader
        assert old is not None
        left_at = time.monotonic()
        await cluster.leave_node(_node_index(cluster, "{}:{}".format(*old.address)))
        views: list[Any] = []

        def moved() -> bool:
            view = views[-1] if views else None
            leader = view.partitions.get(0) if view is not None else None
            return leader is not None and leader.leader not in (None, old)

        async def moved_now() -> bool:
            try:
                views.append(await admin.lookup(topic, "r", timeout=2.0))
            except NSQError:
                return False
            return moved()

        while not await moved_now():  # lookups change on the server: nothing to watch
            assert time.monotonic() - left_at < LEAVE_COST, "the leadership did not move"
            await asyncio.sleep(0.1)
        took = time.monotonic() - left_at
        with pytest.raises(Timeout) as raised, keeps_deadline(3.0):
            await producer.publish(topic, b"during", partition=0, timeout=3.0)
        assert raised.value.retriable
        await watch.until(lambda: acked <= consumed, 30, "the acknowledged messages")
    print(f"\nleave below quorum: leader moved in {took:.2f}s; not writable "
          f"{time.monotonic() - left_at:.1f}s after the leave")


@pytest.mark.nsq_cluster(nodes=3, lookupds=2, fresh=True)
async def test_leader_lookupd_loss(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    before, after = fresh_name("lk-before"), fresh_name("lk-after")
    await cluster.create_topic(before, partitions=2, replicas=2, channels=["ch"])
    consumed: set[bytes] = set()
    watch = Watch()

    def handle(message: Message) -> None:
        consumed.add(bytes(message.body))
        watch.poke()

    async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
        leader = await admin.leader_lookupd()
    assert leader is not None
    index = next(i for i, a in enumerate(cluster.lookupd_http_addresses) if leader.endswith(a))
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        lookup_options=FAST_LOOKUP) as producer, \
            Consumer(before, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle,
                     **CONSUMER_OPTIONS):
        async with bounded(10):
            await producer.publish(before, b"before-0", timeout=10)
        await cluster.stop_lookupd(index)
        for i in range(1, 6):
            async with bounded(10):
                await producer.publish(before, b"before-%d" % i, timeout=10)
        # creation needs the new leader lookupd (create_topic asks /listlookup for it)
        async with bounded(60):
            await cluster.create_topic(after, partitions=2, replicas=2, channels=["ch"],
                                       timeout=60)
        async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
            new_leader = await admin.leader_lookupd()
        assert new_leader is not None and not new_leader.endswith(
            cluster.lookupd_http_addresses[index])
        for i in range(6):
            async with bounded(10):
                await producer.publish(after, b"after-%d" % i, timeout=10)
        await watch.until(lambda: {b"before-%d" % i for i in range(6)} <= consumed, 30,
                          "the first topic's messages")
    got: set[bytes] = set()
    watch2 = Watch()

    def handle_after(message: Message) -> None:
        got.add(bytes(message.body))
        watch2.poke()

    async with Consumer(after, "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle_after, **CONSUMER_OPTIONS):
        await watch2.until(lambda: len(got) >= 6, 30, "the new topic's messages")
    assert got == {b"after-%d" % i for i in range(6)}
