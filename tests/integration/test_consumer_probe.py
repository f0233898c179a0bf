"""The back-off probe goes where messages are: with 2+ partitions a requeued message once
waited ~11 s because the probe (RDY 1 after a back-off window) went to an idle connection and
moved on only after ``low_rdy_idle_timeout``."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from support import Watch, bounded

from smartnsq import Consumer, Producer
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy

WAIT = 10.0


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_the_probe_goes_to_the_partition_of_the_failed_message(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("probe", partitions=4, channels=["ch"])
    producer = Producer(lookupd=cluster.lookupd_http_addresses, timeout=10)
    async with bounded(10):
        await producer.start()
        await producer.publish("probe", b"flaky", partition=2, timeout=10)
    async with bounded(5):
        await producer.close()
    calls: dict[bytes, int] = defaultdict(int)
    watch = Watch()

    async def handle(message: Message) -> None:
        calls[message.body] += 1
        watch.poke()
        if calls[message.body] <= 2:
            raise RuntimeError("fails twice, then succeeds")

    # the idle-probe rotation (low_rdy_idle_timeout) is far away: only a well-placed probe
    # brings the message back in time (a probe to any connection: 1 chance in 4 per window)
    consumer = Consumer("probe", "ch", lookupd=cluster.lookupd_http_addresses, handler=handle,
                        backoff_policy=BackoffPolicy(initial=0.2, max=0.4, jitter=0.0),
                        requeue_policy=RequeuePolicy(initial=0.0), low_rdy_idle_timeout=60,
                        reconnect_delay=0.05, lookup_options={"poll_interval": 5.0})
    async with bounded(1):
        await consumer.start()
    try:
        async with bounded(WAIT):
            await watch.until(lambda: calls[b"flaky"] >= 3, WAIT,
                              "the requeued message handled again after each window")
    finally:
        async with bounded(5):
            await consumer.close(timeout=3)
