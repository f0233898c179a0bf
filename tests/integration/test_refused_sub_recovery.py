"""A SUB refused because the partition is not writable is asked again at the server's pace
(issue 33 item 9), over real sockets on the dev cluster.

The real youzan leader disables its channels while it is below its write quorum or catching
up and refuses a SUB with ``E_FAILED_ON_NOT_WRITABLE``; the dev cluster plays it with
``set_writable(..., False, refuse_sub=True)``. Before, such a refusal counted as a failed
node: the reconnect back-off doubled up to ``reconnect_delay_max`` (60 s) and nothing woke the
subscription when writes came back (the real cluster's consumer resumed 10-37 s late).

As in ``test_failover_recovery.py``, each test makes the mechanism under test the only timely
way to pass: a first reconnect delay far longer than the bound.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from support import Watch, bounded, poke_on_log, wait_until

from smartnsq import Consumer, Producer
from smartnsq.discovery.lookup import LookupManager
from smartnsq.message import Message
from smartnsq.model.failover import SUB_PROBE_MAX

RESUME = 2.5
"""Seconds from writes coming back to the message's delivery: the writer view is asked every
``WRITERS_LOOK_EVERY`` (1 s) while a SUB is refused, plus a lookup, a SUB and a loaded
machine. The consumer's own back-off (10 s, at least 5 with jitter) cannot make it."""


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_refused_sub_resumes_when_lookup_lists_the_partition_for_writers(
        nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("refused", partitions=1, replicas=1, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        await producer.publish("refused", b"before", partition=0)
    cluster.set_writable("refused", 0, False, refuse_sub=True)
    got = asyncio.get_running_loop().create_future()

    def handle(message: Message) -> None:
        if not got.done():
            got.set_result(asyncio.get_running_loop().time())

    consumer = Consumer("refused", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, reconnect_delay=10.0, reconnect_delay_max=60.0)
    with poke_on_log(Watch(), "smartnsq.consumer") as logged:
        async with consumer:
            await logged.until(lambda: consumer.stats().subscribe_failures >= 1, 10,
                               "the first refused SUB")
            back = asyncio.get_running_loop().time()
            cluster.set_writable("refused", 0, True)
            async with bounded(RESUME + 5):
                delivered = await asyncio.wait_for(got, RESUME + 5)
    resumed = delivered - back
    print(f"\nresumed {resumed:.2f}s after writes came back")
    assert resumed < RESUME, f"resumed {resumed:.2f}s after writes came back"


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_refused_subs_go_on_at_a_bounded_pace(nsq_cluster: Any) -> None:
    """While the partition refuses, its SUBs are at most ``SUB_PROBE_MAX`` apart: the
    reconnect back-off (here 0.05 s doubling to 60 s) would have reached 3.2 s by the 8th."""
    cluster = nsq_cluster
    await cluster.create_topic("pace", partitions=1, replicas=1, channels=["ch"])
    cluster.set_writable("pace", 0, False, refuse_sub=True)
    loop = asyncio.get_running_loop()
    refusals: list[float] = []

    def counted(consumer: Consumer) -> bool:
        n = consumer.stats().subscribe_failures
        while len(refusals) < n:
            refusals.append(loop.time())
        return n >= 9

    consumer = Consumer("pace", "ch", lookupd=cluster.lookupd_http_addresses,
                        reconnect_delay=0.05, reconnect_delay_max=60.0)
    async with consumer:
        # polled: repeated log records are folded, so a log hook would not see each refusal
        await wait_until(lambda: counted(consumer), 30, interval=0.01)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(refusals)]
    assert max(gaps) <= SUB_PROBE_MAX + 0.5, gaps


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_the_writer_view_is_asked_again_while_a_sub_is_refused(nsq_cluster: Any) -> None:
    """The consumer has seen the writers' lookup without the partition; writes come back
    with no other news: its own periodic look at the writer view (``WRITERS_LOOK_EVERY``)
    finds the partition listed again and wakes the refused SUB."""
    cluster = nsq_cluster
    # two partitions: the writers' view of partition 1 stands while partition 0 is hidden
    await cluster.create_topic("looked", partitions=2, replicas=1, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        await producer.publish("looked", b"before", partition=0)
    cluster.set_writable("looked", 0, False, refuse_sub=True)
    loop = asyncio.get_running_loop()
    got = loop.create_future()
    hidden = Watch()
    writers: list[set[int]] = []

    def on_change(change: Any) -> None:
        if change.topic == "looked" and change.access == "w" and change.new is not None:
            writers.append({p for p, part in change.new.partitions.items()
                            if part.leader is not None})
            hidden.poke()

    def handle(message: Message) -> None:
        if message.partition == 0 and not got.done():
            got.set_result(loop.time())

    lookup = LookupManager(cluster.lookupd_http_addresses)
    lookup.subscribe(on_change)
    async with lookup, Consumer("looked", "ch", lookup=lookup, handler=handle,
                                reconnect_delay=10.0, reconnect_delay_max=60.0):
        await hidden.until(lambda: bool(writers) and 0 not in writers[-1], 10,
                           "the consumer's look at the writer view without partition 0")
        back = loop.time()
        cluster.set_writable("looked", 0, True)
        async with bounded(RESUME + 5):
            delivered = await asyncio.wait_for(got, RESUME + 5)
    resumed = delivered - back
    print(f"\nresumed {resumed:.2f}s after writes came back")
    assert resumed < RESUME, f"resumed {resumed:.2f}s after writes came back"


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_probes_of_a_refusing_partition_back_off_and_resume_promptly(
        nsq_cluster: Any) -> None:
    """A publish pinned to a partition whose live leader refuses writes probes it at a pace
    that backs off to one probe a second (before: the partition's probe turn, free every
    ``retry_delay`` (50 ms), cut each retry's own back-off short, for as long as it
    refused), and is acknowledged within about that second of writes coming back."""
    cluster = nsq_cluster
    await cluster.create_topic("probed", partitions=2, replicas=1, channels=["ch"])
    loop = asyncio.get_running_loop()
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        await producer.publish("probed", b"before", partition=0)
        cluster.set_writable("probed", 0, False)
        began = loop.time()
        waiting = [asyncio.ensure_future(producer.publish("probed", b"during", partition=0,
                                                          timeout=30))]

        def refused() -> int:
            return producer.stats().retried.get("E_FAILED_ON_NOT_WRITABLE", 0)

        await wait_until(lambda: refused() >= 10, 20, interval=0.01)
        took = loop.time() - began
        print(f"\n10 refused probes in {took:.2f}s")
        # 50 ms apart, 10 refusals take 0.5 s; at the backed-off pace (the first attempt,
        # 2 at 50 ms, then 0.1, 0.2, 0.4, 0.8 and 1 s apart) about 4.5 s
        assert took > 2.0, f"10 refused probes in {took:.2f}s"
        back = loop.time()
        cluster.set_writable("probed", 0, True)
        async with bounded(5):
            results = await asyncio.gather(*waiting)
        resumed = loop.time() - back
    assert {r.partition for r in results} == {0}
    assert resumed < 1.5, f"acknowledged {resumed:.2f}s after writes came back"
