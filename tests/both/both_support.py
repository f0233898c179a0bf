"""Helpers of the both-cluster tests (``tests/both``): publish, collect, and read the servers'
own counters, the same way on a ``DevCluster`` and on a ``RealCluster``.

Everything here is bounded (``support.bounded``) and waits on events (a handler's poke), except
:func:`channel_drained`, which polls the nodes' ``/stats``: nothing pushes a server counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from support import Watch, bounded

from smartnsq import Consumer, Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.message import Message
from smartnsq.protocol.admin import ChannelStats

WAIT = 30.0
"""Bound of a wait for deliveries: a real cluster on a loaded 2-core box (no test waits it)."""

FAST: dict[str, Any] = {"reconnect_delay": 0.1, "reconnect_delay_max": 1.0}
"""Consumer options that retry a subscription quickly (a real partition can refuse a first
SUB for a moment after its topic was created)."""


def first_copies(messages: list[Message]) -> dict[bytes, Message]:
    """Body -> the first delivery of it (bodies are unique in these tests)."""
    out: dict[bytes, Message] = {}
    for m in messages:
        out.setdefault(bytes(m.body), m)
    return out


def is_real(cluster: Any) -> bool:
    """Whether ``cluster`` is the real servers (``RealCluster``) rather than the dev cluster."""
    from smartnsq.testing.realcluster import RealCluster

    return isinstance(cluster, RealCluster)


@contextlib.asynccontextmanager
async def producer(cluster: Any, **options: Any) -> AsyncIterator[Producer]:
    """A started producer on the cluster's lookupds, every step bounded."""
    made = Producer(lookupd=cluster.lookupd_http_addresses, timeout=10, **options)
    async with bounded(10):
        await made.start()
    try:
        yield made
    finally:
        async with bounded(10):
            await made.close()


class Collector:
    """A plain-function handler keeping every message it is given (in arrival order) and
    poking a watch; ``fail(message)`` may raise to make the handler fail that delivery."""

    def __init__(self, fail: Callable[[Message], bool] | None = None) -> None:
        self.messages: list[Message] = []
        self.received: list[float] = []  # time.time() of each call
        self.watch = Watch()
        self._fail = fail

    def __call__(self, message: Message) -> None:
        self.messages.append(message)
        self.received.append(time.time())
        self.watch.poke()
        if self._fail is not None and self._fail(message):
            raise RuntimeError(f"failing {message.body!r} on purpose")

    @property
    def bodies(self) -> list[bytes]:
        return [bytes(m.body) for m in self.messages]

    async def until(self, condition: Callable[[], bool], what: str,
                    timeout: float = WAIT) -> None:
        async with bounded(timeout):
            await self.watch.until(condition, timeout, what)

    @property
    def distinct(self) -> int:
        """How many different bodies were given (a redelivery or a copy counts once)."""
        return len({bytes(m.body) for m in self.messages})

    async def count(self, count: int, timeout: float = WAIT) -> None:
        """Until ``count`` different bodies were given."""
        await self.until(lambda: self.distinct >= count, f"{count} messages", timeout)


@contextlib.asynccontextmanager
async def consuming(cluster: Any, topic: str, channel: str, handler: Any,
                    **options: Any) -> AsyncIterator[Consumer]:
    """A started consumer on the cluster's lookupds, closed (bounded) on the way out."""
    consumer = Consumer(topic, channel, lookupd=cluster.lookupd_http_addresses,
                        handler=handler, **{**FAST, **options})
    async with bounded(10):
        await consumer.start()
    try:
        yield consumer
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)


async def consume(cluster: Any, topic: str, channel: str, count: int,
                  **options: Any) -> list[Message]:
    """What a consumer of ``channel`` is given until it has ``count`` different messages
    (copies and redeliveries included, and the few that may arrive before it is closed), in
    arrival order."""
    got = Collector()
    async with consuming(cluster, topic, channel, got, **options):
        await got.count(count)
    return got.messages


async def channel_stats(cluster: Any, topic: str, channel: str) -> list[ChannelStats]:
    """``channel`` on each partition's leader, from the nodes' own ``/stats`` (a replica's
    counters are not the consumers')."""
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        answers = await admin.cluster_stats(topic, channel, nsqd=cluster.nsqd_http_addresses)
    found: list[ChannelStats] = []
    for stats in answers.values():
        if isinstance(stats, Exception):
            raise stats
        for entry in stats.topics:
            if entry.name == topic and entry.leader is not False:
                one = entry.channel(channel)
                if one is not None:
                    found.append(one)
    return found


async def channel_counts(cluster: Any, topic: str, channel: str) -> tuple[int, int]:
    """(depth, in flight) of ``channel`` summed over the partitions' leaders."""
    found = await channel_stats(cluster, topic, channel)
    return sum(c.depth for c in found), sum(c.in_flight for c in found)


async def until_clients(cluster: Any, topic: str, channel: str, clients: int,
                        timeout: float = 10.0) -> None:
    """Until the servers count ``clients`` subscribers on ``channel`` (summed over its
    partitions): the SUB was taken, whatever the client library says."""
    async with bounded(timeout + 5):
        deadline = time.monotonic() + timeout
        while sum(c.clients for c in await channel_stats(cluster, topic, channel)) < clients:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic}/{channel}: fewer than {clients} subscribers "
                                   f"after {timeout} s")
            await asyncio.sleep(0.1)  # a server counter: nothing signals it, so poll


async def channel_drained(cluster: Any, topic: str, channel: str,
                          timeout: float = 10.0) -> None:
    """Until ``channel`` has nothing queued and nothing in flight on any partition."""
    async with bounded(timeout + 5):
        deadline = time.monotonic() + timeout
        while True:
            counts = await channel_counts(cluster, topic, channel)
            if counts == (0, 0):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic}/{channel} still has (depth, in flight) "
                                   f"{counts} after {timeout} s")
            await asyncio.sleep(0.2)  # a server counter: nothing signals it, so poll


async def writable_partitions(cluster: Any, topic: str) -> set[int]:
    """The partitions an ``access=w`` lookup lists for ``topic`` right now."""
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        view = await admin.lookup(topic, "w")
    return {pid for pid, part in view.partitions.items() if part.leader is not None}


async def leader_address(cluster: Any, topic: str, partition: int = 0) -> str:
    """``"host:port"`` (TCP) of ``partition``'s leader as the lookupds list it now: the node to
    subscribe to with ``nsqd=`` (or to put a proxy in front of)."""
    async with AsyncAdmin(cluster.lookupd_http_addresses, timeout=5) as admin:
        view = await admin.lookup(topic, "r")
    part = view.partitions.get(partition)
    if part is None or part.leader is None:
        raise AssertionError(f"{topic}/{partition} has no leader listed")
    return str(part.leader)
