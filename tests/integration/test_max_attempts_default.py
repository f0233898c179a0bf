"""A failing handler gives up after 5 attempts by default, as pynsq's ``max_tries`` and go-nsq's
``MaxAttempts`` do, except on ordered subscriptions, which never skip a message unless told
to; and its traceback is logged once per message, whatever ``max_attempts`` is."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from support import channel_reaches

from smartnsq import BackoffPolicy, Consumer, Message, Producer, RequeuePolicy
from smartnsq.consumer.config import ConsumerConfig
from smartnsq.errors import InvalidArgument
from smartnsq.observability import logs

FAST = {"requeue_policy": RequeuePolicy(initial=0.0),
        "backoff_policy": BackoffPolicy(enabled=False)}


def test_the_default_is_five_attempts_and_dead_letter_needs_no_more() -> None:
    assert ConsumerConfig().max_attempts == 5
    assert ConsumerConfig(dead_letter="orders_dead").max_attempts == 5
    with pytest.raises(InvalidArgument, match="needs max_attempts"):
        ConsumerConfig(dead_letter="orders_dead", max_attempts=0)


async def _publish(cluster: Any, topic: str, body: bytes) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        await producer.publish(topic, body, partition=0)


def _failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "handler failed" in r.getMessage()]


def _with_traceback(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The failure records that carry the handler's traceback above DEBUG."""
    return [r for r in _failures(caplog) if r.exc_info and r.levelno > logging.DEBUG]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_by_default_a_message_is_given_up_after_five_attempts(
        nsq_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("poison5", channels=["ch"])
    node = nsq_cluster.node_info(nsq_cluster.leader_of("poison5", 0)).tcp_address
    attempts: list[int] = []

    def handler(message: Message) -> None:
        attempts.append(message.attempts)
        raise ValueError("no such order")

    logs.reset()
    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        async with Consumer("poison5", "ch", nsqd=[node], handler=handler, **FAST):
            await _publish(nsq_cluster, "poison5", b"bad")
            channel = nsq_cluster.state.topics["poison5"].partitions[0].channels["ch"]
            await channel_reaches(channel, lambda: channel.finish_count == 1)
    assert attempts == [1, 2, 3, 4, 5]  # the sixth delivery is given up on, unhandled
    assert [r.levelno for r in _failures(caplog)] == [logging.WARNING] * 4 + [logging.ERROR]
    traced = _with_traceback(caplog)
    assert len(traced) == 1 and "attempt 5 of 5" in traced[0].getMessage()
    assert any("giving up on message" in r.getMessage() for r in caplog.records)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_retrying_for_ever_still_logs_the_traceback_once(
        nsq_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("poison0", channels=["ch"])
    node = nsq_cluster.node_info(nsq_cluster.leader_of("poison0", 0)).tcp_address
    seventh = asyncio.Event()

    def handler(message: Message) -> None:
        if message.attempts == 7:
            seventh.set()
            return
        raise ValueError("no such order")

    logs.reset()
    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        async with Consumer("poison0", "ch", nsqd=[node], handler=handler, max_attempts=0,
                            **FAST):
            await _publish(nsq_cluster, "poison0", b"bad")
            await asyncio.wait_for(seventh.wait(), 30)
    failures = _failures(caplog)
    assert [r.levelno for r in failures] == [logging.WARNING] * 6
    traced = _with_traceback(caplog)
    assert len(traced) == 1 and ", attempt 1:" in traced[0].getMessage()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_an_ordered_message_is_never_skipped_by_default(
        nsq_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    await nsq_cluster.create_topic("poisonord", ordered=True, channels=["ch"])
    handled = asyncio.Event()
    attempts: list[int] = []

    def handler(message: Message) -> None:
        attempts.append(message.attempts)
        if message.attempts < 8:
            raise ValueError("not yet")
        handled.set()

    logs.reset()
    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        async with Consumer("poisonord", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                            handler=handler, ordered=True, **FAST):
            await _publish(nsq_cluster, "poisonord", b"blocked")
            await asyncio.wait_for(handled.wait(), 30)
    assert attempts == [1, 2, 3, 4, 5, 6, 7, 8]  # past max_attempts, handled again
    traced = _with_traceback(caplog)
    assert len(traced) == 1 and "attempt 5 of 5" in traced[0].getMessage()
