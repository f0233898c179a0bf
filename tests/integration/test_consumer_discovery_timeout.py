"""``discovery_timeout`` (off by default) makes a Consumer whose lookupds are all unreachable
fail fast; without it such a consumer retried and logged for ever and ``join()`` never
returned."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from support import bounded

from smartnsq import Consumer, sync
from smartnsq.errors import InvalidArgument, LookupFailed, TopicNotFound
from smartnsq.testing.hostile import SilentLookupd


def refused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_join_raises_when_no_lookupd_answered_within_discovery_timeout() -> None:
    consumer = Consumer("t", "c", lookupd=[refused_address(), refused_address()],
                        handler=lambda m: None, discovery_timeout=1.0)
    await consumer.start()
    try:
        with pytest.raises(LookupFailed) as info:
            async with bounded(1.0):
                await consumer.join()
        assert "discovery_timeout" in str(info.value)
        assert info.value.__cause__ is not None  # the last failure, attached
        assert consumer.closed and consumer.error is info.value
    finally:
        await consumer.close()


async def test_a_silent_lookupd_is_bounded_too() -> None:
    async with SilentLookupd() as lookupd:
        consumer = Consumer("t", "c", lookupd=[lookupd.address], handler=lambda m: None,
                            discovery_timeout=1.0)
        await consumer.start()
        try:
            with pytest.raises(LookupFailed):
                async with bounded(1.0):
                    await consumer.join()
        finally:
            await consumer.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_topic_never_found_ends_with_topic_not_found(nsq_cluster: Any) -> None:
    consumer = Consumer("never_created", "c", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=lambda m: None, discovery_timeout=1.0)
    await consumer.start()
    try:
        with pytest.raises(TopicNotFound) as info:
            async with bounded(1.0):
                await consumer.join()
        assert "discovery_timeout" in str(info.value)
    finally:
        await consumer.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_consumer_that_found_its_topic_outlives_its_discovery_timeout(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("found", channels=["c"])
    consumer = Consumer("found", "c", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=lambda m: None, discovery_timeout=0.5)
    await consumer.start()
    try:
        with pytest.raises(asyncio.TimeoutError):  # still running well past 0.5 s
            await asyncio.wait_for(asyncio.shield(consumer.join()), 1.5)
        assert not consumer.closed and consumer.error is None
    finally:
        await consumer.close()


def test_the_sync_iterator_raises_it_too() -> None:
    consumer = sync.Consumer("t", "c", lookupd=[refused_address()], discovery_timeout=0.5)
    try:
        with pytest.raises(LookupFailed):
            for _ in consumer:
                pass
    finally:
        consumer.close()


@pytest.mark.parametrize("value", [0, -1, "1", float("inf")])
def test_a_bad_discovery_timeout_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        Consumer("t", "c", lookupd=[refused_address()], handler=lambda m: None,
                 discovery_timeout=value)
    assert info.value.field == "discovery_timeout"
