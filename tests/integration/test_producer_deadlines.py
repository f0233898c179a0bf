"""Every producer call keeps its one deadline, and a stall costs only its own partition.

The comment above each test says what went wrong without the rule it checks; every public
call runs inside ``bounded``/``keeps_deadline`` (ends within its timeout + 1 s).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from support import Watch, bounded, poke_on_log, stored

from smartnsq import Producer
from smartnsq.errors import InvalidArgument, NSQError, Timeout
from smartnsq.model.sharding import murmur3_partition

WAIT = 10.0


def producer(cluster: Any, **options: Any) -> Producer:
    return Producer(lookupd=cluster.lookupd_http_addresses, **options)


def key_for(partition: int, partitions: int) -> str:
    return next(k for k in (f"key-{i}" for i in range(1000))
                if murmur3_partition(k, partitions) == partition)


CALLS = ("publish", "publish_nowait", "publish_many")


async def call(p: Producer, how: str, topic: str, body: bytes, timeout: float,
               **kwargs: Any) -> Any:
    if how == "publish":
        return await p.publish(topic, body, timeout=timeout, **kwargs)
    if how == "publish_nowait":
        return await p.publish_nowait(topic, body, timeout=timeout, **kwargs)
    return await p.publish_many(topic, [body], timeout=timeout, **kwargs)


# The implicit start (lookupd discovery) runs inside the call's deadline: against a silent
# lookupd, a publish with timeout=3 once took 8.1 s.
@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
@pytest.mark.parametrize("how", CALLS)
async def test_the_deadline_covers_the_implicit_start(nsq_cluster: Any, how: str) -> None:
    await nsq_cluster.create_topic("silent_lookupd")
    lookupd = nsq_cluster.lookupds[0].http
    lookupd.pause()  # connections accepted, nothing answered
    p = producer(nsq_cluster)
    try:
        with pytest.raises(Timeout):
            async with bounded(1.0):
                await call(p, how, "silent_lookupd", b"x", 1.0)
        lookupd.resume()
        async with bounded(5.0):  # the start interrupted by the deadline is not half-done
            result = await call(p, how, "silent_lookupd", b"y", 5.0)
        assert result.partition == 0
    finally:
        lookupd.resume()
        await p.close()


@contextmanager
def loop_blocked_when_backing_off(seconds: float) -> Iterator[list[float]]:
    """The first time the producer says it backs off, block the event loop for ``seconds``:
    a loaded machine waking the back-off late (the real runs were on a loaded 2-core box)."""
    blocked: list[float] = []

    class Block(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not blocked and "next in" in record.getMessage():
                blocked.append(seconds)
                time.sleep(seconds)

    target = logging.getLogger("smartnsq.producer")
    handler, level = Block(logging.DEBUG), target.level
    target.addHandler(handler)
    target.setLevel(logging.DEBUG)
    try:
        yield blocked
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


# No retry is sent after its deadline has passed: one once was, the connection timed it out at
# once and closed a healthy shared connection ('timed out after -0.03s; closing').
@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
@pytest.mark.parametrize("how", CALLS)
async def test_no_retry_is_sent_with_no_time_left(nsq_cluster: Any, how: str) -> None:
    await nsq_cluster.create_topic("late", partitions=2, replicas=2)
    async with producer(nsq_cluster) as p:
        for partition in (0, 1):
            await p.publish("late", b"warm-up", partition=partition)
        old = nsq_cluster.node_info(nsq_cluster.leader_of("late", 0))
        new = nsq_cluster.node_info(nsq_cluster.move_leader("late", 0))
        assert old.node_id != new.node_id
        healthy = dict(p.pool.connections)
        assert len(healthy) == 2  # both nodes' connections open and shared
        # the old leader answers E_FAILED_ON_NOT_LEADER; the back-off wakes past the
        # deadline: the retry must not be sent
        with loop_blocked_when_backing_off(1.2) as blocked, pytest.raises(Timeout):
            async with bounded(1.0):
                await call(p, how, "late", b"late", 1.0, partition=0)
        assert blocked
        assert not any(conn.is_closed for conn in healthy.values())
        assert b"late" not in stored(nsq_cluster, "late")


# On a dead replica the real server leaves PUBs unanswered for ~12 s (longer than the 10 s
# request timeout): the stall ends in a retriable error and a retry in the same partition,
# never a re-route of a sharded message. Scaled down: a 0.5 s request timeout, a stall of the
# leader's node until the first attempt timed out, then E_FAILED_ON_NOT_WRITABLE until
# writable again.
@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
@pytest.mark.parametrize("how", ("publish", "publish_nowait"))
async def test_a_dead_replicas_stall_retries_in_the_same_partition(nsq_cluster: Any,
                                                                  how: str) -> None:
    await nsq_cluster.create_topic("replica", partitions=2, replicas=1)
    key = key_for(0, 2)
    stalled_node = nsq_cluster.leader_of("replica", 0)
    other = 1 if nsq_cluster.leader_of("replica", 1) is not stalled_node else None
    watch = Watch()
    async with producer(nsq_cluster, request_timeout=0.5) as p:
        for partition in (0, 1):
            await p.publish("replica", b"warm-up", partition=partition)
        nsq_cluster.set_writable("replica", 0, False)  # the ISR is short of the dead replica
        nsq_cluster.stall(stalled_node)  # ... and the leader leaves the PUB unanswered
        with poke_on_log(watch, "smartnsq.producer"):
            sharded = asyncio.ensure_future(call(p, how, "replica", b"sharded", 8.0,
                                                 sharding_key=key))
            async with bounded(8.0):
                await watch.until(lambda: p.retry_count >= 1 or sharded.done(),
                                  what="the first attempt timed out")
                assert not sharded.done()
                if other is not None:  # the other partition's node is not held up
                    await p.publish("replica", b"elsewhere", partition=other, timeout=2.0)
                nsq_cluster.resume(stalled_node)  # the held PUB: E_FAILED_ON_NOT_WRITABLE
                await watch.until(lambda: p.retry_count >= 2 or sharded.done(),
                                  what="a retry after the stall")
                nsq_cluster.set_writable("replica", 0, True)
                result = await sharded
    assert result.partition == 0
    assert stored(nsq_cluster, "replica")[b"sharded"] == [0]


# Bad input is refused by validation, not deep inside: a lone-surrogate sharding key once
# raised UnicodeEncodeError, delay=inf OverflowError, and timeout=inf retried forever.
@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
@pytest.mark.parametrize("how", CALLS)
@pytest.mark.parametrize(("field", "kwargs"), [
    ("sharding_key", {"sharding_key": "\ud800"}),
    ("sharding_key", {"sharding_key": "ok\udfff"}),
    ("timeout", {"timeout": math.inf}),
    ("timeout", {"timeout": math.nan}),
    ("timeout", {"timeout": -1.0}),
    ("delay", {"delay": math.inf}),
    ("delay", {"delay": math.nan}),
    ("delay", {"delay": -math.inf}),
])
async def test_bad_input_is_an_invalid_argument_naming_it(nsq_cluster: Any, how: str,
                                                          field: str,
                                                          kwargs: dict[str, Any]) -> None:
    if how == "publish_many" and field == "delay":
        return  # batches have no delay
    await nsq_cluster.create_topic("escapes")
    async with producer(nsq_cluster) as p:
        await p.publish("escapes", b"warm-up")
        kwargs = dict(kwargs)
        timeout = kwargs.pop("timeout", 2.0)
        with pytest.raises(InvalidArgument) as caught:
            async with bounded(2.0):
                await call(p, how, "escapes", b"x", timeout, **kwargs)
        assert caught.value.field == field
    assert b"x" not in stored(nsq_cluster, "escapes")


# A certificate that does not verify will not verify on the next attempt: the publish fails at
# once (it was once retried like a network error and raised only at its deadline).
@pytest.mark.parametrize("how", CALLS)
async def test_a_certificate_that_does_not_verify_fails_at_once(nsq_cluster_factory: Any,
                                                                 how: str) -> None:
    import ssl

    trustme = pytest.importorskip("trustme")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(server)  # a CA the client lacks
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, tls=server)
    await cluster.create_topic("tls_untrusted")
    async with producer(cluster, tls=True) as p:
        with pytest.raises(NSQError) as caught:
            async with bounded(0.0, slack=2.0):  # "at once": not at the 5 s deadline
                await call(p, how, "tls_untrusted", b"x", 5.0)
    assert not isinstance(caught.value, Timeout)
    assert "certificate" in str(caught.value).lower()


# Every public call finishes within its timeout, routes() too: it looks the topic up (and
# starts the producer), and once had no deadline at all against a silent lookupd.
@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_routes_keeps_its_deadline(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("routes_silent")
    lookupd = nsq_cluster.lookupds[0].http
    p = producer(nsq_cluster, timeout=1.0)
    try:
        lookupd.pause()
        with pytest.raises(Timeout):
            async with bounded(1.0):
                await p.routes("routes_silent")  # config.timeout by default
        with pytest.raises(Timeout):
            async with bounded(0.5):
                await p.routes("routes_silent", timeout=0.5)
        lookupd.resume()
        async with bounded(5.0):
            routes = await p.routes("routes_silent", timeout=5.0)
        assert routes.partition_num == 1
    finally:
        lookupd.resume()
        await p.close()
