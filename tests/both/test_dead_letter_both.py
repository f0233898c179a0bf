"""``Consumer(dead_letter=...)`` and ``smartnsq dead-letter replay``, on the dev cluster and
the real youzan servers from the same bodies.

A message its handler always fails is parked on the dead-letter topic past ``max_attempts``
and FINed only after that publish was acknowledged; on an ordered topic (with the opt-in) its
partition then moves on, in order. The copy names its origin in ``smartnsq.dl.*`` ext headers
and keeps its own; a park that cannot be published leaves the message requeued, never FINed;
the replay command puts parked messages back on their origin topic, and nothing is lost on
the way.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from both_support import (
    Collector,
    channel_drained,
    consume,
    consuming,
    producer,
    until_clients,
)
from support import bounded, cli, fresh_name, poke_on_log, rows

from smartnsq.consumer.deadletter import HEADER_PREFIX
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.protocol import body_compression

TWICE = {"ordered_first_delivery_twice": True}
QUICK: dict[str, Any] = {"backoff_policy": BackoffPolicy(enabled=False),
                         "requeue_policy": RequeuePolicy(initial=0.0, cap=0.1)}
"""A failed message comes back at once (an ordered one after the consumer's 0.1 s hold)."""


def origin(message: Message) -> dict[str, str]:
    return {k: v for k, v in message.headers.items() if k.startswith(HEADER_PREFIX)}


def parked_lines(caplog: pytest.LogCaptureFixture, what: str) -> int:
    return sum(1 for r in caplog.records if r.name == "smartnsq.consumer" and what in r.message)


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_an_always_failing_ordered_message_is_parked_and_its_partition_moves_on(
        nsq_any_cluster: Any) -> None:
    """Ordered, 2 partitions, the handler always fails ``a0``: with ``dead_letter_ordered``
    it is parked at attempt 3 (``max_attempts=2``) and ``a1``, ``a2`` follow in order; the
    other partition never waited. The copy carries the origin and the original headers."""
    cluster = nsq_any_cluster
    topic, dead = fresh_name("dlord"), fresh_name("dlord-dead")
    await cluster.create_topic(topic, partitions=2, replicas=1, ordered=True, ext=True,
                               channels=["ch"])
    await cluster.create_topic(dead, partitions=1, replicas=1, ext=True, channels=["ch"])
    got = Collector(lambda m: m.body == b"a0")
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, max_attempts=2, dead_letter=dead,
                             dead_letter_ordered=True, **QUICK) as consumer:
            await until_clients(cluster, topic, "ch", 2)
            async with producer(cluster) as pub:
                for i in range(3):
                    for key in ("a", "b"):
                        async with bounded(10):
                            await pub.publish(topic, f"{key}{i}".encode(), sharding_key=key,
                                              headers={"k": "v"}, trace_id=77 + i)
            await got.until(lambda: {b"a2", b"b2"} <= set(got.bodies),
                            "both partitions past the poison")
            await got.until(lambda: consumer.stats().dead_lettered == 1, "one parked")
            await channel_drained(cluster, topic, "ch")
            stats = consumer.stats()
    assert (stats.dead_lettered, stats.give_ups, stats.order_errors) == (1, 1, 0)
    lane = [(m.body, m.attempts) for m in got.messages if m.partition == 0]
    assert lane == [(b"a0", 1), (b"a0", 2), (b"a1", 1), (b"a2", 1)]
    assert [m.body for m in got.messages if m.partition == 1] == [b"b0", b"b1", b"b2"]
    poison = next(m for m in got.messages if m.body == b"a0")
    (copy,) = await consume(cluster, dead, "ch", 1)
    assert bytes(copy.body) == b"a0" and copy.trace_id == 77
    assert origin(copy) == {
        "smartnsq.dl.topic": topic, "smartnsq.dl.channel": "ch", "smartnsq.dl.partition": "0",
        "smartnsq.dl.offset": str(poison.queue_offset), "smartnsq.dl.attempts": "3",
        "smartnsq.dl.error": "RuntimeError: failing b'a0' on purpose",
        "smartnsq.dl.trace_id": "77", "smartnsq.dl.id": str(poison.internal_id)}
    assert {k: v for k, v in copy.headers.items() if k not in origin(copy)} == {"k": "v"}


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_without_the_opt_in_an_ordered_message_is_still_never_skipped(
        nsq_any_cluster: Any) -> None:
    """``dead_letter`` alone does not skip on an ordered subscription: the poison keeps its
    partition until it succeeds, and nothing is parked."""
    cluster = nsq_any_cluster
    topic, dead = fresh_name("dlnoopt"), fresh_name("dlnoopt-dead")
    await cluster.create_topic(topic, partitions=1, replicas=1, ordered=True, ext=True,
                               channels=["ch"])
    await cluster.create_topic(dead, partitions=1, replicas=1, ext=True, channels=["ch"])
    failures = [0]

    def fail(message: Message) -> bool:
        if message.body == b"x0" and failures[0] < 3:
            failures[0] += 1
            return True
        return False

    got = Collector(fail)
    async with consuming(cluster, topic, "ch", got, max_attempts=1, dead_letter=dead,
                         **QUICK) as consumer:
        await until_clients(cluster, topic, "ch", 1)
        async with producer(cluster) as pub, bounded(10):
            await pub.publish(topic, b"x0", partition=0)
            await pub.publish(topic, b"x1", partition=0)
        await got.until(lambda: b"x1" in got.bodies, "past the poison once it succeeds")
        assert consumer.stats().dead_lettered == 0
    assert [(m.body, m.attempts) for m in got.messages] == [
        (b"x0", 1), (b"x0", 2), (b"x0", 3), (b"x0", 4), (b"x1", 1)]


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_parked_message_goes_back_to_its_origin_with_the_replay_command(
        nsq_any_cluster: Any, ordered: bool) -> None:
    """Poison -> dead-letter topic -> ``smartnsq dead-letter replay`` -> the origin topic,
    where a fixed handler takes it: 0 lost, the origin headers gone, its own kept, the
    dead-letter channel drained."""
    cluster = nsq_any_cluster
    topic, dead = fresh_name("dlround"), fresh_name("dlround-dead")
    await cluster.create_topic(topic, partitions=1, replicas=1, ordered=ordered, ext=True,
                               channels=["ch"])
    await cluster.create_topic(dead, partitions=1, replicas=1, ext=True, channels=["ch"])
    broken = Collector(lambda m: m.body == b"poison")
    with poke_on_log(broken.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", broken, max_attempts=1, dead_letter=dead,
                             dead_letter_ordered=ordered, **QUICK) as consumer:
            await until_clients(cluster, topic, "ch", 1)
            async with producer(cluster) as pub, bounded(10):
                for body in (b"before", b"poison", b"after"):
                    await pub.publish(topic, body, partition=0, headers={"k": "v"})
            await broken.until(lambda: consumer.stats().dead_lettered == 1
                               and b"after" in broken.bodies, "parked, and the next handled")
    code, out, err = await cli("dead-letter", "replay", dead, "--channel", "ch", "-n", "1",
                               "--json", "--lookupd", cluster.lookupd_http_addresses[0])
    assert code == 0, err
    row, total = rows(out)
    assert (row["to"], row["partition"], total["republished"]) == (topic, 0, 1)
    assert row["origin_id"] is not None and row["attempts"] == 1
    await channel_drained(cluster, dead, "ch")
    fixed = Collector()
    async with consuming(cluster, topic, "ch", fixed):
        await fixed.count(1)
    (back,) = fixed.messages
    assert bytes(back.body) == b"poison" and back.headers == {"k": "v"}
    assert sorted(broken.bodies) == [b"after", b"before", b"poison"]


async def test_a_dead_letter_publish_that_fails_leaves_the_message_requeued(
        nsq_any_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The dead-letter topic does not exist: every park fails, the message is requeued (never
    FINed) and tried again; a consumer without the fault gets it."""
    cluster = nsq_any_cluster
    topic = fresh_name("dlfail")
    await cluster.create_topic(topic, partitions=1, replicas=1, ext=True, channels=["ch"])
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, b"poison", headers={"k": "v"})
    got = Collector(lambda m: True)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, max_attempts=1,
                             dead_letter=fresh_name("dlfail-missing"), **QUICK) as consumer:
            await got.until(lambda: parked_lines(caplog, "could not be parked") >= 2,
                            "two failed parks")
            stats = consumer.stats()
    assert stats.dead_lettered == 0 and stats.finished == 0 and stats.requeued >= 3
    assert "not FINed" in next(r.message for r in caplog.records
                                         if "could not be parked" in r.message)
    later = Collector()
    async with consuming(cluster, topic, "ch", later):
        await later.count(1)
    assert later.bodies == [b"poison"] and later.messages[0].attempts >= 3


async def test_an_undecodable_body_is_parked_as_stored_with_its_reason(
        nsq_any_cluster: Any) -> None:
    """A body marked gzip that is not: past ``max_attempts`` it is parked with its marks and
    the decoder's reason as its last error (no handler ever saw it); the replay puts it back
    as stored, marks included."""
    cluster = nsq_any_cluster
    topic, dead = fresh_name("dlzip"), fresh_name("dlzip-dead")
    await cluster.create_topic(topic, partitions=1, replicas=1, ext=True, channels=["ch"])
    await cluster.create_topic(dead, partitions=1, replicas=1, ext=True,
                               channels=["ch", "look"])
    marks = {body_compression.CODEC_HEADER: "1", body_compression.SIZE_HEADER: "100"}
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, b"not gzip at all", headers=marks)
    got = Collector()
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, max_attempts=1, dead_letter=dead,
                             **QUICK) as consumer:
            await got.until(lambda: consumer.stats().dead_lettered == 1, "parked")
    assert got.messages == []
    (copy,) = await consume(cluster, dead, "look", 1, decompress=False)
    assert bytes(copy.body) == b"not gzip at all"
    assert {k: copy.headers[k] for k in marks} == marks
    assert copy.headers["smartnsq.dl.error"].startswith("undecodable body: ")
    assert "gzip" in copy.headers["smartnsq.dl.error"]
    assert copy.headers["smartnsq.dl.attempts"] == "2"
    code, _, err = await cli("dead-letter", "replay", dead, "--channel", "ch", "-n", "1",
                             "--lookupd", cluster.lookupd_http_addresses[0])
    assert code == 0, err
    (back,) = await consume(cluster, topic, "ch", 1, decompress=False)
    assert bytes(back.body) == b"not gzip at all" and back.headers == marks


async def test_a_dead_letter_topic_without_ext_gets_the_body_and_the_log_the_origin(
        nsq_any_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A dead-letter topic created without ext: the copy is the body alone, the origin is in
    one WARNING line, and the replay needs ``--to``."""
    cluster = nsq_any_cluster
    topic, dead = fresh_name("dlplain"), fresh_name("dlplain-dead")
    await cluster.create_topic(topic, partitions=1, replicas=1, ext=True, channels=["ch"])
    await cluster.create_topic(dead, partitions=1, replicas=1, channels=["ch"])
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, b"poison", headers={"k": "v"})
    got = Collector(lambda m: True)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, max_attempts=1, dead_letter=dead,
                             **QUICK) as consumer:
            await got.until(lambda: consumer.stats().dead_lettered == 1, "parked")
    line = next(r.message for r in caplog.records if "carries no ext headers" in r.message)
    assert f"topic={topic!r}" in line and "RuntimeError: failing b'poison'" in line
    code, _, err = await cli("dead-letter", "replay", dead, "--channel", "ch", "-n", "1",
                             "--lookupd", cluster.lookupd_http_addresses[0])
    assert code == 1 and "names no origin topic" in err and "give --to TOPIC" in err, err
    code, out, err = await cli("dead-letter", "replay", dead, "--channel", "ch", "-n", "1",
                               "--to", topic, "--lookupd", cluster.lookupd_http_addresses[0])
    assert code == 0, err
    line, total = out.splitlines()
    assert line.startswith("re-published message ") and line.endswith(f" to {topic} (partition 0)")
    assert total == f"re-published 1 message from {dead} (channel ch) to {topic}"
    fixed = Collector()
    async with consuming(cluster, topic, "ch", fixed):
        await fixed.count(1)
    assert fixed.bodies == [b"poison"] and fixed.messages[0].headers == {}


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_classic_nsq_parks_the_body_and_logs_the_origin(
        nsq_any_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Classic NSQ has no ext headers: the copy is the body, the origin (with the message's
    16-character id) is in the WARNING line, and ``--to`` puts it back."""
    cluster = nsq_any_cluster
    topic, dead = fresh_name("dlclassic"), fresh_name("dlclassic-dead")
    await cluster.create_topic(topic, channels=["ch"])
    await cluster.create_topic(dead, channels=["ch", "look"])
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, b"poison")
    got = Collector(lambda m: True)
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, max_attempts=1, dead_letter=dead,
                             **QUICK) as consumer:
            await got.until(lambda: consumer.stats().dead_lettered == 1, "parked")
    poison = got.messages[0]
    line = next(r.message for r in caplog.records if "carries no ext headers" in r.message)
    assert f"id={poison.id.decode()!r}" in line and "partition=" not in line
    (copy,) = await consume(cluster, dead, "look", 1)
    assert bytes(copy.body) == b"poison" and copy.headers == {}
    code, out, err = await cli("dead-letter", "replay", dead, "--channel", "ch", "-n", "1",
                               "--to", topic, "--json",
                               "--lookupd", cluster.lookupd_http_addresses[0])
    assert code == 0, err
    row, total = rows(out)
    assert (row["to"], row["partition"], row["origin_id"], total["republished"]) == (
        topic, None, None, 1)
    fixed = Collector()
    async with consuming(cluster, topic, "ch", fixed):
        await fixed.count(1)
    assert fixed.bodies == [b"poison"]
