"""A stream through a partition leader's death, on the dev cluster and on the real youzan servers.

Four partitions, two replicas, three nodes; a publisher writes to every partition all along.
A node leading a partition (the lost one) is SIGKILLed between two micro-batches: of the nodes
that lead one, the one holding the fewest replicas, so that at least two partitions have no
replica on it (untouched). On the real servers the lost partition has no leader until etcd's
session expires (23-27 s), and then its new leader, and the leaders of the partitions that had
a replica on the dead node, refuse consumption ("Consume is disabled currently") until about
113 s after the kill (bench/leader_loss.py). What must hold:

* the untouched partitions keep flowing: every message acknowledged there while the lost
  partition is out reaches the sink within ``FLOW_BOUND`` seconds (the stream plans no range
  on a leader that refuses reads, so no micro-batch waits for one);
* the query stopped and started again from its checkpoint during the outage goes on, and a
  new query (a fresh checkpoint, ``startingOffsets=earliest``) started during the outage
  reads the other partitions at once instead of waiting for the lost partition's leader;
* in the end both have every acknowledged message exactly once (per batch id, as a
  ``foreachBatch`` sink keyed by batch id keeps them).

The dev cluster plays the real timing scaled down (the ``realistic`` profile at 0.1: no
leader for 2-5 s); it has no "Consume is disabled", so there the test checks the planning
around a leaderless partition only. About 135 s on the real servers, 35 s on the dev
cluster (2-core machine).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import spark_support
from support import fresh_name

from smartnsq import sync
from smartnsq.admin import AsyncAdmin
from smartnsq.devcluster.profile import profile_named
from smartnsq.errors import NSQError

pytestmark = pytest.mark.spark

HAVE_SPARK = spark_support.HAVE_SPARK
PARTITIONS = 4
FLOW_BOUND = 40.0  # s from an acknowledged publish to its row in the sink, while one waits
OUTAGE_WAIT = 420.0  # s for the lost partition to be read again (real: 2-4 minutes)
SPARK_WAIT = 180.0  # a query's start on a loaded 2-core machine


spark_session = spark_support.spark_session  # this module's SparkSession


@dataclass
class Sink:
    """A ``foreachBatch`` sink: the rows of each batch id (a re-run batch replaces its first
    run, as a sink keyed by batch id does), when each body first arrived, and a condition
    poked per batch."""

    name: str
    batches: dict[int, list[tuple[int, int, bytes]]] = field(default_factory=dict)
    arrived: dict[bytes, float] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)
    query: Any = None  # the streaming query writing here (the last one started)

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = [(r.partition, r.queue_offset, bytes(r.body))
                for r in frame.select("partition", "queue_offset", "body").collect()]
        now = time.monotonic()
        with self.changed:
            self.batches[batch_id] = rows
            for _, _, body in rows:
                self.arrived.setdefault(body, now)
            self.changed.notify_all()

    def wait(self, condition: Any, timeout: float, what: str) -> None:
        """Until ``condition()`` (re-checked per batch), or the query failed (its state is
        read once a second: Spark signals nothing here)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition():
                query = self.query
                if query is not None and not query.isActive:
                    raise AssertionError(f"{self.name} ended waiting for {what}: "
                                         f"{query.exception()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: {what} not within {timeout:g}s")
                self.changed.wait(min(1.0, left))

    def rows(self) -> list[tuple[int, int, bytes]]:
        with self.changed:
            return [row for rows in self.batches.values() for row in rows]


class Publisher(threading.Thread):
    """Publishes to every partition in turn, all along; keeps what was acknowledged and when
    (publishes a dead partition times out are given up: they may or may not be stored)."""

    def __init__(self, lookupd: list[str], topic: str) -> None:
        super().__init__(name="leader-loss-publisher", daemon=True)
        self.lookupd, self.topic = lookupd, topic
        self.acked: dict[bytes, tuple[int, float]] = {}
        self.lock = threading.Condition()
        self.halt = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with sync.Producer(lookupd=self.lookupd, timeout=3.0) as producer:
                for i in range(10**9):
                    if self.halt.is_set():
                        return
                    partition = i % PARTITIONS
                    body = b"%d|%d" % (partition, i)
                    try:
                        producer.publish(self.topic, body, partition=partition, timeout=2.0)
                    except NSQError:
                        continue
                    with self.lock:
                        self.acked[body] = (partition, time.monotonic())
                        self.lock.notify_all()
                    self.halt.wait(0.05)  # the publishing pace, not a wait for anything
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def until_each(self, count: int, timeout: float) -> None:
        """Until every partition has ``count`` acknowledged messages."""
        def done() -> bool:
            got = [p for p, _ in self.acked.values()]
            return all(got.count(p) >= count for p in range(PARTITIONS))

        with self.lock:
            assert self.lock.wait_for(done, timeout), f"{count} publishes per partition"

    def of(self, partitions: set[int], since: float = 0.0) -> dict[bytes, float]:
        with self.lock:
            return {b: t for b, (p, t) in self.acked.items() if p in partitions and t >= since}


async def _layout(cluster: Any, topic: str) -> tuple[int, int, set[int]]:
    """The node to kill, the partition it leads that is lost, and the partitions with no
    replica on that node (untouched by its death). The node is, of those that lead a
    partition, the one holding the fewest (the nodes' own ``/stats`` list the partitions
    each holds, led or not): 8 replicas on 3 nodes leave at least 2 partitions untouched."""
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        view = await admin.lookup(topic, "r")
        led: dict[int, set[int]] = {}
        for p, part in view.partitions.items():
            assert part.leader is not None, f"{topic}/{p} has no leader"
            node = cluster.nsqd_tcp_addresses.index(f"{part.leader.broadcast_address}:"
                                                    f"{part.leader.tcp_port}")
            led.setdefault(node, set()).add(p)
        held = {}
        for node in led:
            stats = await admin.stats(cluster.nsqd_http_addresses[node], topic)
            held[node] = {entry.partition for entry in stats.partitions(topic)}
    victim = min(led, key=lambda n: (len(held[n]), n))
    return victim, min(led[victim]), set(range(PARTITIONS)) - held[victim]


async def _new_leader(cluster: Any, topic: str, lost: int, victim: int,
                      timeout: float) -> None:
    """Until lookup names a leader of the lost partition other than the dead node."""
    old_port = int(cluster.nsqd_tcp_addresses[victim].rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        while True:
            try:
                view = await admin.lookup(topic, "r")
                part = view.partitions.get(lost)
                if part is not None and part.leader is not None \
                        and part.leader.tcp_port != old_port:
                    return
            except NSQError:
                pass  # a lookupd between answers: asked again
            if time.monotonic() >= deadline:
                raise AssertionError(f"no new leader of {topic}/{lost} within {timeout:g}s")
            await asyncio.sleep(0.2)  # lookup pushes nothing: poll


@pytest.mark.nsq_cluster(nodes=3, fresh=True, profile=profile_named("realistic", 0.1, 1))
async def test_the_other_partitions_keep_flowing_while_a_leader_is_lost(
        nsq_any_cluster: Any, spark_session: Any, tmp_path: Any) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("spark-ll")
    await cluster.create_topic(topic, partitions=PARTITIONS, replicas=2, channels=["ch"])
    victim, lost, untouched = await _layout(cluster, topic)
    assert untouched, f"every partition has a replica on the node leading {topic}/{lost}"
    lookupd = ",".join(cluster.lookupd_http_addresses)

    def start(sink: Sink, checkpoint: str) -> Any:
        frame = (spark_session.readStream.format("nsq").option("lookupd", lookupd)
                 .option("topic", topic).option("startingOffsets", "earliest").load())
        return (frame.writeStream.foreachBatch(sink).queryName(sink.name)
                .option("checkpointLocation", str(tmp_path / checkpoint))
                .trigger(processingTime="1 second").start())

    publisher = Publisher(cluster.lookupd_http_addresses, topic)
    publisher.start()
    first, fresh = Sink("first"), Sink("fresh")
    queries: list[Any] = []
    try:
        # a few messages in every partition first: a read started on a fresh topic's first
        # publishes was seen to get its first message past its start on the real servers
        await asyncio.to_thread(publisher.until_each, 20, 60)
        queries.append(await asyncio.to_thread(start, first, "ck-first"))
        await asyncio.to_thread(first.wait, lambda: {p for p, _, _ in first.rows()}
                                == set(range(PARTITIONS)), SPARK_WAIT, "rows of every partition")

        # the kill, between two micro-batches
        batches = len(first.batches)
        await asyncio.to_thread(first.wait, lambda: len(first.batches) > batches, 30,
                                "a micro-batch")
        await cluster.kill_node(victim)
        killed = time.monotonic()

        # during the outage: the query restarted from its checkpoint, and a new one
        await _new_leader(cluster, topic, lost, victim, OUTAGE_WAIT)
        await asyncio.to_thread(queries[0].stop)
        queries[0] = await asyncio.to_thread(start, first, "ck-first")
        queries.append(await asyncio.to_thread(start, fresh, "ck-fresh"))

        # both read the lost partition again in the end (messages published after the kill)
        def lost_back(sink: Sink) -> bool:
            after = publisher.of({lost}, killed + 1)
            return bool(after) and any(b in sink.arrived for b in after)

        for sink in (first, fresh):
            await asyncio.to_thread(sink.wait, lambda s=sink: lost_back(s), OUTAGE_WAIT,
                                    f"a row of {topic}/{lost} published after the kill")
        back = time.monotonic()
        publisher.halt.set()
        await asyncio.to_thread(publisher.join, 30)
        assert publisher.failure is None, publisher.failure
        acked = publisher.of(set(range(PARTITIONS)))
        for sink in (first, fresh):
            await asyncio.to_thread(sink.wait, lambda s=sink: set(acked) <= set(s.arrived),
                                    OUTAGE_WAIT, "every acknowledged message")
    finally:
        publisher.halt.set()
        for query in queries:
            await asyncio.to_thread(query.stop)

    # the untouched partitions flowed while the lost one was out: first at every moment
    # (across its restart), the fresh query from its start on
    restarted = min(fresh.arrived.values())
    for sink, since in ((first, killed), (fresh, restarted)):
        late = {body.decode(): round(sink.arrived[body] - at, 1)
                for body, at in publisher.of(untouched, since).items()
                if at < back - FLOW_BOUND and sink.arrived[body] - at > FLOW_BOUND}
        assert not late, (f"{sink.name}: rows of partitions {sorted(untouched)} arrived "
                          f"later than {FLOW_BOUND:g}s after their publish while "
                          f"{topic}/{lost} was out (body: seconds): "
                          f"{dict(list(late.items())[:10])}")
    for sink in (first, fresh):
        rows = sink.rows()
        positions = [(p, o) for p, o, _ in rows]
        assert len(positions) == len(set(positions)), f"{sink.name}: duplicated rows"
        assert set(acked) <= {b for _, _, b in rows}, f"{sink.name}: lost rows"
