"""Creating a topic until it is usable: the workflow a real youzan cluster needs.

The leader lookupd takes the create at once but gives partitions leaders only when its
periodic cluster check runs, so the create is re-sent every few seconds until every partition
has a leader, then each wanted channel is created on each partition's leader (a youzan
lookupd lists a partition for writers only once it has a channel), until writers see every
partition or the timeout passes (docs/admin.md). The decision of each round is
:func:`smartnsq.protocol.admin.creation_progress`; this module carries it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from ..errors import (
    AdminError,
    ConnectionFailed,
    LookupFailed,
    NSQError,
    ProtocolError,
    Timeout,
)
from ..protocol import admin as p
from ..protocol import validate
from ..protocol.admin import CreationProgress
from ..protocol.lookup import TopicView
from .base import AdminBase, positive

__all__ = ["REGISTRATION_GRACE", "Progress", "TopicCreation"]

log = logging.getLogger("smartnsq.admin")

Progress = Callable[[CreationProgress], object]

# how long "No node is available" may be a cluster's nsqd still registering (they register
# with the lookupds as they start, within a second or two)
REGISTRATION_GRACE = 5.0


class TopicCreation(AdminBase):
    """:meth:`create_topic` and its steps, for :class:`smartnsq.admin.AsyncAdmin`."""

    async def create_topic(self, topic: str, partitions: int = 1, replicas: int = 1, *,
                           ordered: bool = False, ext: bool = False,
                           multipart: bool | None = None,
                           disable_channel_auto_create: bool = False,
                           channels: Iterable[str] = (), wait: bool = True,
                           timeout: float = 60.0, resend_interval: float = 5.0,
                           poll_interval: float = 0.5,
                           progress: Progress | None = None) -> CreationProgress:
        """Create a topic, and with ``wait`` (the default) return only once it is usable.

        Youzan: ``POST /topic/create`` on the leader lookupd, re-sent every
        ``resend_interval`` seconds until the topic is usable; meanwhile each of
        ``channels`` is created on each partition's leader, until a write lookup lists every
        partition (without ``channels`` it returns once every partition has a leader: a
        youzan lookupd shows a partition to writers only once it has a channel).
        ``multipart`` defaults to whether ``partitions x replicas`` exceeds the nsqd count.
        Classic: the topic and channels are created on every nsqd lookupd knows.

        ``progress`` is called after every round with a :class:`CreationProgress`. Raises
        :class:`~smartnsq.errors.Timeout` (saying how far it got) when ``timeout`` passes,
        :class:`AdminError` when the cluster refuses (bad parameters, not enough nodes).
        A youzan lookupd's "No node is available for topic" while fewer nsqd are registered
        than ``replicas`` is taken for a cluster still starting for the first
        :data:`REGISTRATION_GRACE` seconds: the create is re-sent meanwhile (a ``Timeout`` then
        quotes that answer); after it, the refusal is raised.
        """
        channels = list(dict.fromkeys(channels))
        for name in channels:
            validate.check_channel(name)
        limit = positive("timeout", timeout)
        resend = positive("resend_interval", resend_interval)
        poll = positive("poll_interval", poll_interval)
        p.topic_create_params(topic, partitions, replicas, ordered=ordered, ext=ext)
        started = time.monotonic()
        deadline = started + limit

        def left() -> float:
            return min(self.timeout, deadline - time.monotonic())

        note = ["asking the lookupds which one leads"]  # how far it got, for the Timeout
        try:
            return await asyncio.wait_for(
                self._create(topic, partitions, replicas, ordered, ext, multipart,
                             disable_channel_auto_create, channels, wait, started, deadline,
                             resend, poll, progress, left, note),
                limit)
        except asyncio.TimeoutError:
            raise Timeout(f"creating topic {topic!r}: not usable within {limit:g}s "
                          f"({note[0]})") from None

    async def _create(self, topic: str, partitions: int, replicas: int, ordered: bool,
                      ext: bool, multipart: bool | None, disable_auto: bool,
                      channels: list[str], wait: bool, started: float, deadline: float,
                      resend_interval: float, poll: float, progress: Progress | None,
                      left: Callable[[], float], note: list[str]) -> CreationProgress:
        leader = await self._youzan_leader("topic create")
        if leader is None:
            return await self._create_classic(topic, channels, started)
        if multipart is None:
            multipart = False
            if not ordered and partitions * replicas > 1:
                with contextlib.suppress(NSQError):
                    multipart = partitions * replicas > len(await self.nodes())
        params = p.topic_create_params(topic, partitions, replicas, ordered=ordered, ext=ext,
                                       multipart=multipart,
                                       disable_channel_auto_create=disable_auto)
        last_sent: float | None = None
        registered: set[str] = set()  # disable_channel_auto_create: allowed on the lookupd
        ready: dict[str, set[int]] = {c: set() for c in channels}
        read: TopicView | None = None
        write: TopicView | None = None
        last_error = ""
        while True:
            now = time.monotonic()
            if now >= deadline:
                # the loop ends itself: wait_for's cancellation at this same deadline can be
                # lost on 3.10/3.11 (bpo-42130: it meets a request's own timeout)
                raise asyncio.TimeoutError
            state = p.creation_progress(
                topic, partitions, read=read, write=write,
                channels_ready=set.intersection(*ready.values()) if ready else (),
                want_channels=bool(channels), started=started, last_sent=last_sent, now=now,
                resend_interval=resend_interval)
            note[0] = state.describe() + (f"; last error: {last_error}"
                                                      if last_error else "")
            if state.resend:
                try:
                    await self._write(leader, "/topic/create", params,
                                      what="nsqlookupd /topic/create", timeout=left())
                    last_sent = time.monotonic()
                    log.debug("sent /topic/create %s to %s", topic, leader)
                except AdminError as exc:
                    if not exc.not_leader and not await self._registering(exc, replicas,
                                                                          started):
                        raise
                    last_error = str(exc)
                    if exc.not_leader:
                        leader = await self._youzan_leader("topic create") or leader
                except (ConnectionFailed, Timeout) as exc:
                    if last_sent is None and len(self.lookupd) == 1:
                        raise
                    last_error = str(exc)  # the leader lookupd may be changing: ask again
                    with contextlib.suppress(NSQError):
                        leader = await self._youzan_leader("topic create") or leader
            if disable_auto and last_sent is not None:
                for channel in channels:
                    if channel not in registered:
                        await self._register_channel(leader, topic, channel, left())
                        registered.add(channel)
            if progress is not None:
                progress(state)
            if state.done or not wait:
                return state
            read = await self._view(topic, "r", left)
            if read is not None and channels:
                for pid, node in sorted(read.leaders().items()):
                    for channel in channels:
                        if pid in ready[channel]:
                            continue
                        try:
                            await self._write(node.http_address, "/channel/create",
                                              p.channel_params(topic, channel, pid),
                                              what="nsqd /channel/create", timeout=left())
                            ready[channel].add(pid)
                        except AdminError as exc:
                            # E_FAILED_ON_NOT_LEADER while leaders settle: next round
                            if not exc.retriable:
                                raise
                            last_error = str(exc)
                        except (ConnectionFailed, Timeout) as exc:
                            last_error = str(exc)
                write = await self._view(topic, "w", left)
            if not state.done:
                await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    async def _registering(self, exc: AdminError, replicas: int, started: float) -> bool:
        """Whether a refused create is a cluster still starting: the lookupd says no node
        is available while fewer nsqd have registered than ``replicas`` asks for, within
        :data:`REGISTRATION_GRACE` of the call's start.

        A youzan lookupd counts only the nodes whose registration it has seen, so right after
        the cluster starts it refuses a create that will succeed once they are in; with
        enough nodes registered, or past the grace (a cluster that has too few nodes), the
        same answer is the cluster's final word.
        """
        if exc.status != 400 or "no node is available" not in exc.message.lower() \
                or time.monotonic() - started > REGISTRATION_GRACE:
            return False
        try:
            registered = len(await self.nodes())
        except NSQError:
            return False
        return registered < replicas

    async def _register_channel(self, leader: str, topic: str, channel: str,
                                timeout: float) -> None:
        """Allow ``channel`` of a topic created with ``disable_channel_auto_create`` (the
        leader lookupd's ``/channel/create``; one already allowed is fine)."""
        try:
            await self._write(leader, "/channel/create", {"topic": topic, "channel": channel},
                              what="nsqlookupd /channel/create", timeout=timeout)
        except AdminError as exc:
            if "already registered" not in exc.message:
                raise

    async def _view(self, topic: str, access: str, left: Callable[[], float]
                    ) -> TopicView | None:
        """The merged view, ``None`` while the lookupds do not show the topic (yet)."""
        try:
            return await self.lookup(topic, access, timeout=left())
        except (LookupFailed, ConnectionFailed, Timeout, ProtocolError) as exc:
            log.debug("lookup of %s (%s) during creation: %s", topic, access, exc)
            return None

    async def _create_classic(self, topic: str, channels: list[str],
                              started: float) -> CreationProgress:
        nodes = await self.nodes()
        if not nodes:
            raise AdminError(503, "the lookupds know no nsqd to create the topic on",
                             what="topic create")
        for node in nodes:
            await self._write(node.http_address, "/topic/create", {"topic": topic},
                              what="nsqd /topic/create")
            for channel in channels:
                await self._write(node.http_address, "/channel/create",
                                  p.channel_params(topic, channel),
                                  what="nsqd /channel/create")
        return CreationProgress(topic, 0, frozenset(), frozenset(), frozenset(),
                                bool(channels), time.monotonic() - started, False)

