"""The expansion hold's edges on the dev cluster (issue 33 item 8): an old partition that is
never consumed to the expansion point holds the new ones only until the bound (then a
WARNING says order may not hold), and an unordered subscription holds nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support import Watch, wait_until

import smartnsq.consumer.expansion as expansion
from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.message import Message
from smartnsq.model.expansion import BY_BOUND

FAST_LOOKUP = {"poll_interval": 0.3, "jitter": 0.0}


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_an_old_partition_never_consumed_holds_the_new_one_until_the_bound(
        nsq_cluster: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(expansion, "EXPANSION_HOLD_MAX", 1.5)
    cluster = nsq_cluster
    await cluster.create_topic("stuck", partitions=1, replicas=1, ordered=True, channels=["ch"])
    lookupd = cluster.lookupd_http_addresses
    handled: list[bytes] = []
    watch = Watch()

    def handle(message: Message) -> None:
        watch.poke()
        if message.body == b"poison":
            raise RuntimeError("never handled")  # partition 0 never gets past it
        handled.append(bytes(message.body))
        watch.poke()

    async with Producer(lookupd=lookupd, lookup_options=FAST_LOOKUP) as producer, \
            Consumer("stuck", "ch", lookupd=lookupd, handler=handle, max_attempts=0,
                     lookup_options=FAST_LOOKUP) as consumer, \
            AsyncAdmin(lookupd) as admin:
        await producer.publish("stuck", b"poison", partition=0)
        assert consumer._subs is not None
        watch_ = consumer._subs.expansion
        await watch.until(lambda: consumer.stats().received >= 1, 10, "the poison delivered")
        await admin.expand_topic("stuck", 2)
        await wait_until(  # (nothing signals the routes: polled)
            lambda: producer.pool.routes("stuck") is not None
            and producer.pool.routes("stuck").partition_num == 2, 10)  # type: ignore[union-attr]
        with caplog.at_level(logging.WARNING, "smartnsq.consumer"):
            await producer.publish("stuck", b"new", partition=1, timeout=10)
            await watch.until(lambda: b"new" in handled, 15, "the new partition's message")
        (release,) = watch_.releases
    assert release.why == BY_BOUND and release.new == {1} and release.late == {0}
    assert release.waited >= 1.5
    assert any("order may not hold" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_an_unordered_subscription_holds_nothing(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    await cluster.create_topic("plain", partitions=1, replicas=1, channels=["ch"])
    lookupd = cluster.lookupd_http_addresses
    handled: list[bytes] = []
    watch = Watch()

    def handle(message: Message) -> None:
        if message.body == b"slow":
            message.req(delay=30, backoff=False)  # the old partition keeps a backlog
        else:
            handled.append(bytes(message.body))
        watch.poke()

    async with Producer(lookupd=lookupd, lookup_options=FAST_LOOKUP) as producer, \
            Consumer("plain", "ch", lookupd=lookupd, handler=handle, max_in_flight=10,
                     lookup_options=FAST_LOOKUP) as consumer, \
            AsyncAdmin(lookupd) as admin:
        await producer.publish("plain", b"slow", partition=0)
        await watch.until(lambda: consumer.stats().received >= 1, 10, "the first delivery")
        await admin.expand_topic("plain", 2)
        await wait_until(  # (nothing signals the routes: polled)
            lambda: producer.pool.routes("plain") is not None
            and producer.pool.routes("plain").partition_num == 2, 10)  # type: ignore[union-attr]
        await producer.publish("plain", b"new", partition=1, timeout=10)
        await watch.until(lambda: b"new" in handled, 10, "the new partition's message")
        assert consumer._subs is not None
        assert consumer._subs.expansion.releases == []
        assert not consumer._subs.expansion.hold.active
