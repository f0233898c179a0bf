"""Per-key order across a 2 -> 4 partition expansion while the ordered consumer lags, on the
real youzan servers. The dev cluster's case is ``tests/integration/test_expansion_order.py``;
here the dev case is skipped.

What the real servers add to the dev cluster's run, and the operator's calls that keep the
run within a minute (measured: stable 7 s after the creation, both new partitions taking
writes 7-10 s after the expansion):

* the lookupd refuses an expansion while "the cluster is unstable", a flag only a full topic
  check clears; left alone, its periodic check (every 60 s) cleared it 112-113 s after the
  topic's creation. ``POST /topic/meta/update?topic=T`` with no parameter changes nothing and
  runs that check at once: the test asks for it each second until the leader lookupd's
  ``/cluster/stats`` says ``stable``, before it publishes the backlog;
* an accepted expansion's new partitions refuse SUB and channel creation with
  ``E_FAILED_ON_NOT_LEADER`` until a lookupd check tells their nsqd its leader session (100 s
  and more measured, left alone), and writes with ``E_FAILED_ON_NOT_WRITABLE`` while they have
  no channel (still refused 200 s after the expansion in three runs with no channel created
  on them). Every 3 s until the new partitions take writes, the test asks for the check again
  and creates the channel on each new partition's leader, as ``expand_topic(..., wait=True)``
  does (docs/admin.md);
* the consumer drains 240 messages in about a second, long before the new partitions take
  writes, so the backlog is kept up while they do not: a second producer, whose lookup polls
  every 60 s, writes every key at the consumer's pace until the first producer's routes list
  the new partitions (a publish the servers refuse meanwhile makes it look up and move its
  keys too); then it stops, and the first producer (a 1 s poll) writes the rest. Each key is
  written by one producer at a time and never to an old partition after its producer moved
  it, so its order is the order it was acknowledged in.

Nothing sleeps to wait: the handler pokes a watch, and the servers' state, which nothing
pushes, is polled with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict
from typing import Any

import pytest
from both_support import FAST, is_real
from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.errors import AdminError, LookupFailed
from smartnsq.message import Message
from smartnsq.model.expansion import BY_CONSUMED
from smartnsq.transport.http import HttpClient

KEYS = 24
BEFORE = 10  # messages per key published before the expansion (the backlog)
AFTER = 5  # ... and after it, by the producer that moved the keys
LAG = 0.005  # the handler's work per message (s): the consumer lags its backlog
LOOKUP = {"poll_interval": 1.0, "jitter": 0.0}
EXPAND_WITHIN = 60.0  # from the topic's creation to an accepted expansion (s)
USABLE_WITHIN = 90.0  # from the accepted expansion to every message handled (s)
UNSTABLE = "the cluster is unstable"

pytestmark = pytest.mark.nsq_cluster(nodes=3, lookupds=2, fresh=True)


@pytest.fixture(autouse=True)
def _real_only(request: pytest.FixtureRequest) -> None:
    """Skip the dev case before its cluster starts: the dev test covers it."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("nsq_any_cluster") == "dev":
        pytest.skip("the dev cluster's case is tests/integration/test_expansion_order.py")


class Timeline:
    """What the run measured, in seconds from the topic's creation (printed for the report)."""

    def __init__(self) -> None:
        self.created = time.monotonic()
        self.marks: list[tuple[float, str]] = []
        self.refusals: list[float] = []

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.created, what))

    def report(self) -> str:
        lines = [f"  {at:7.2f} s  {what}" for at, what in self.marks]
        if self.refusals:
            lines.append(f"  expansion refused ({UNSTABLE!r}) {len(self.refusals)} times, "
                         f"{self.refusals[0]:.1f}..{self.refusals[-1]:.1f} s")
        return "\n".join(lines)


async def _leader_call(http: HttpClient, admin: AsyncAdmin, method: str, path: str) -> Any:
    leader = await admin.leader_lookupd()
    assert leader is not None
    answer = await http.request(method, f"http://{leader}{path}", timeout=5, max_body=1 << 20)
    assert answer.status == 200, (path, answer.status, bytes(answer.body)[:200])
    return json.loads(answer.body) if answer.body else None


async def _until_stable(http: HttpClient, admin: AsyncAdmin, topic: str, timeline: Timeline,
                        deadline: float) -> None:
    """Until the leader lookupd would take an expansion (its ``/cluster/stats``), having it
    check its topics each second (a meta update that changes nothing runs the check)."""
    while time.monotonic() < deadline:
        await _leader_call(http, admin, "POST", f"/topic/meta/update?topic={topic}")
        if (await _leader_call(http, admin, "GET", "/cluster/stats")).get("stable") is True:
            timeline.mark("the leader lookupd reports the cluster stable")
            return
        await asyncio.sleep(1.0)  # a server flag, flipped by the check: polled
    raise AssertionError("the lookupd never reported the cluster stable")


async def _expand(admin: AsyncAdmin, topic: str, timeline: Timeline, deadline: float) -> None:
    """Expand to 4 partitions, asking again while the lookupd says the cluster is unstable."""
    while True:
        try:
            async with bounded(15):
                await admin.expand_topic(topic, 4)
        except AdminError as exc:
            if exc.message != UNSTABLE or time.monotonic() + 1.0 >= deadline:
                raise
            timeline.refusals.append(time.monotonic() - timeline.created)
            await asyncio.sleep(1.0)  # refused until the lookupd's next check: asked again
            continue
        timeline.mark(f"expansion accepted (attempt {len(timeline.refusals) + 1})")
        return


async def test_a_lagging_ordered_consumer_keeps_every_keys_order_across_a_real_expansion(
        nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    assert is_real(cluster)
    topic = fresh_name("grow")
    async with bounded(60):
        await cluster.create_topic(topic, partitions=2, replicas=2, ordered=True,
                                   channels=["ch"])
    timeline = Timeline()
    lookupd = cluster.lookupd_http_addresses
    handled: dict[int, list[int]] = defaultdict(list)
    ids: dict[tuple[int, int], set[bytes]] = defaultdict(set)  # (key, seq) -> message ids
    sent = [0] * KEYS
    marks: dict[str, float] = {}
    old_after_write = 0  # old partitions' messages handled after a write to a new one
    watch = Watch()

    def first(what: str) -> None:
        if what not in marks:
            marks[what] = time.monotonic()
            timeline.mark(what)

    async def handle(message: Message) -> None:
        nonlocal old_after_write
        await asyncio.sleep(LAG)
        key, seq = (int(x) for x in bytes(message.body).split(b":"))
        handled[key].append(seq)
        ids[key, seq].add(bytes(message.id))
        if message.partition is not None and message.partition >= 2:
            first("first delivery from a new partition")
        elif "first publish acknowledged on a new partition" in marks:
            old_after_write += 1
        watch.poke()

    def count() -> int:
        return sum(map(len, handled.values()))

    async def round_(producer: Producer, deadline: float) -> None:
        for key in range(KEYS):
            # (a publish the servers refuse for a moment, as while the lookupd pushes the
            # sessions, is retried: its producer may then move the key too, and waits)
            receipt = await producer.publish(topic, b"%d:%d" % (key, sent[key]),
                                             sharding_key=key,
                                             timeout=max(deadline - time.monotonic(), 1.0))
            sent[key] += 1
            if receipt.partition is not None and receipt.partition >= 2:
                first("first publish acknowledged on a new partition")

    async def publish_after(key: int, deadline: float) -> None:
        for _ in range(AFTER):
            receipt = await mover.publish(topic, b"%d:%d" % (key, sent[key]), sharding_key=key,
                                          timeout=max(deadline - time.monotonic(), 1.0))
            sent[key] += 1
            if receipt.partition is not None and receipt.partition >= 2:
                first("first publish acknowledged on a new partition")

    def moved() -> bool:  # the moving producer's writer view lists the new partitions
        routes = mover.pool.routes(topic)
        return routes is not None and {2, 3} <= set(routes.leaders)

    pushes = [0]  # checks asked for after the expansion

    async def push_sessions(http: HttpClient, admin: AsyncAdmin) -> None:
        """Every 3 s until the new partitions take writes, what ``expand_topic(...,
        wait=True)`` does (not used here: the producers must run meanwhile): the channel on
        each new partition's leader (refused until it leads) and the lookupd's check."""
        while True:
            for partition in (2, 3):
                with contextlib.suppress(AdminError, LookupFailed):
                    await admin.create_channel(topic, "ch", partition=partition)
            await _leader_call(http, admin, "POST", f"/topic/meta/update?topic={topic}")
            pushes[0] += 1
            await asyncio.sleep(3.0)  # the servers' own pace: nothing to wait on

    deadline = timeline.created + EXPAND_WITHIN
    try:
        async with AsyncAdmin(lookupd, timeout=5) as admin, HttpClient() as http, \
                Producer(lookupd=lookupd, timeout=10) as steady, \
                Producer(lookupd=lookupd, lookup_options=LOOKUP, timeout=10) as mover:
            await _until_stable(http, admin, topic, timeline, deadline)
            await mover.routes(topic)  # its 1 s lookup poll follows the topic from now on
            async with bounded(30):
                for _ in range(BEFORE):
                    await round_(steady, time.monotonic() + 30)
            async with Consumer(topic, "ch", lookupd=lookupd, handler=handle,
                                lookup_options=LOOKUP, **FAST) as consumer:
                assert consumer._subs is not None
                expansion = consumer._subs.expansion
                await watch.until(lambda: count() >= 1, 20, "the first delivery")
                await _expand(admin, topic, timeline, deadline)
                timeline.mark(f"(backlog at the expansion: {sum(sent) - count()} messages)")
                usable = time.monotonic() + USABLE_WITHIN
                async with bounded(USABLE_WITHIN + 5):
                    pushing = asyncio.create_task(push_sessions(http, admin))
                    try:
                        while not moved():  # the steady producer keeps the consumer lagging
                            await round_(steady, usable)
                            await watch.until(lambda: count() >= sum(sent) - BEFORE * KEYS,
                                              max(usable - time.monotonic(), 1.0),
                                              "the backlog consumed")
                    finally:
                        pushing.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await pushing  # (a refused push fails the test here)
                    assert expansion.hold.active, "the consumer did not see the growth"
                    timeline.mark(f"the moving producer's routes list partitions 2 and 3 "
                                  f"(backlog: {sum(sent) - count()} messages)")
                    await asyncio.gather(*(publish_after(key, usable) for key in range(KEYS)))
                    timeline.mark(f"{KEYS * AFTER} publishes after the move acknowledged")
                    await watch.until(
                        lambda: all(set(handled[k]) >= set(range(sent[k]))
                                    for k in range(KEYS)),
                        max(usable - time.monotonic(), 1.0), "every message handled")
                timeline.mark("every message handled")
                releases = list(expansion.releases)
                stats = consumer.stats()
    finally:
        print(f"\n{topic}: 2 -> 4 partitions on the real cluster\n{timeline.report()}\n"
              f"  the lookupd was asked for {pushes[0]} checks after the expansion")
    print(f"  held {[round(r.waited, 2) for r in releases]} s (growth seen -> release); "
          f"{old_after_write} old-partition messages handled after the first write to a new "
          f"one; {sum(sent)} published; duplicates dropped {stats.duplicates_dropped}")
    # the new partitions waited for the old ones' backlog, then were let go (not the bound)
    assert [(sorted(r.new), r.why) for r in releases] == [([2, 3], BY_CONSUMED)], releases
    lost = {k: sorted(set(range(sent[k])) - set(seqs)) for k, seqs in handled.items()
            if set(range(sent[k])) - set(seqs)}
    assert lost == {}, f"lost: {lost}"
    # a message handled twice is the server's redelivery of the one stored message
    twice = {k: v for k, v in ids.items() if len(v) > 1}
    assert twice == {}, twice
    broken = {k: seqs for k, seqs in handled.items() if seqs != sorted(seqs)}
    assert broken == {}, f"{len(broken)} of {KEYS} keys out of order: {broken}"
    assert stats.order_errors == 0
