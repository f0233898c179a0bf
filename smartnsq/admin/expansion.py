"""Expanding a youzan topic, and with ``wait`` until its new partitions take writes.

A real lookupd takes an expansion at once but leaves the new partitions unusable for minutes
(measured, docs/admin.md): their nsqd refuse SUB and channel creation
(``E_FAILED_ON_NOT_LEADER``) until one of the lookupd's topic checks (every 60 s) hands them
their leader session, and refuse writes (``E_FAILED_ON_NOT_WRITABLE``) while they have no
channel, which nothing creates for them. It refuses the expansion itself ("the cluster is
unstable") until a full check has passed since the cluster last changed (112 s after a
topic's creation, measured). An operator closes both gaps the same way: have the lookupd
check now (a ``/topic/meta/update`` that changes nothing runs the check at once) and create
the topic's channels on the new partitions; then the new partitions took writes 10 s after
the expansion instead of more than 200 s. :meth:`TopicExpansion.expand_topic` with ``wait``
does that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ..errors import AdminError, ConnectionFailed, LookupFailed, NSQError, ProtocolError, Timeout
from ..protocol import admin as p
from ..protocol import operations as ops
from ..protocol import validate
from ..protocol.lookup import TopicView
from .base import AdminBase, positive

__all__ = ["UNSTABLE", "TopicExpansion"]

log = logging.getLogger("smartnsq.admin")

UNSTABLE = "the cluster is unstable"
"""The leader lookupd's refusal of an expansion until its next full topic check passes."""


class TopicExpansion(AdminBase):
    """:meth:`expand_topic` and its waiting, for :class:`smartnsq.admin.AsyncAdmin`."""

    async def expand_topic(self, topic: str, partitions: int, *, wait: bool = False,
                           channels: list[str] | None = None, timeout: float = 60.0,
                           check_interval: float = 5.0, poll_interval: float = 0.5) -> str:
        """Youzan: raise the topic's partition count to ``partitions``
        (``/topic/partition/expand`` on the leader lookupd, which is returned).

        Without ``wait`` that is the one call: the lookupd places the new partitions at its
        next topic check, writers see each once it has a channel (as with a new topic), and
        a refusal is raised as it comes (500 "the cluster is unstable" while the cluster is
        moving: ask again later).

        With ``wait`` it returns only once writers see every new partition, within
        ``timeout``: while the lookupd says the cluster is unstable, and then until the new
        partitions are listed for writers, it has the lookupd check its topics every
        ``check_interval`` seconds (a ``/topic/meta/update`` that changes nothing), and it
        creates ``channels`` (by default the channels lookup lists for the topic) on each
        new partition's leader. A topic with no channel at all is usable by no writer; then
        it returns once every new partition has a leader. Raises
        :class:`~smartnsq.errors.Timeout` saying how far it got.
        """
        params = ops.expand_params(topic, partitions)
        wanted = None if channels is None else list(dict.fromkeys(channels))
        for name in wanted or ():
            validate.check_channel(name)
        limit = positive("timeout", timeout)
        check = positive("check_interval", check_interval)
        poll = positive("poll_interval", poll_interval)
        leader = await self._youzan_leader("topic expand")
        if leader is None:
            raise AdminError(404, "classic nsqlookupd has no /topic/partition/expand "
                                  "(classic topics have no partitions)", what="topic expand")
        if not wait:
            await self._write(leader, "/topic/partition/expand", params,
                              what="nsqlookupd /topic/partition/expand")
            return leader
        note = ["asking for the expansion"]
        deadline = time.monotonic() + limit
        try:
            await asyncio.wait_for(self._expand_and_wait(leader, topic, partitions, params,
                                                         wanted, check, poll, note, deadline),
                                   limit)
        except asyncio.TimeoutError:
            raise Timeout(f"expanding topic {topic!r} to {partitions} partitions: not "
                          f"usable within {limit:g}s ({note[0]})") from None
        return leader

    async def _expand_and_wait(self, leader: str, topic: str, partitions: int,
                               params: dict[str, str], wanted: list[str] | None,
                               check: float, poll: float, note: list[str],
                               deadline: float) -> None:
        def out_of_time() -> None:
            # the loops end themselves: wait_for's cancellation at this same deadline can be
            # lost on 3.10/3.11 (bpo-42130: it meets a request's own timeout)
            if time.monotonic() >= deadline:
                raise asyncio.TimeoutError

        old = None
        with contextlib.suppress(NSQError):
            old = (await self.lookup(topic, "r")).partition_num
        while True:
            out_of_time()
            try:
                await self._write(leader, "/topic/partition/expand", params,
                                  what="nsqlookupd /topic/partition/expand")
                break
            except AdminError as exc:
                if exc.message != UNSTABLE:
                    raise
                note[0] = f"the lookupd refuses the expansion: {UNSTABLE}"
            await self._check_topics(leader, topic)
            await asyncio.sleep(check)
        first = old if old is not None and old < partitions else 0
        new = range(first, partitions)
        checked = time.monotonic()
        await self._check_topics(leader, topic)
        last_error = ""
        while True:
            out_of_time()
            read = await self._quiet_view(topic, "r")
            channels = wanted if wanted is not None else \
                list(read.channels) if read is not None else []
            if read is not None:
                leaders = read.leaders()
                for pid in new:
                    node = leaders.get(pid)
                    if node is None:
                        continue
                    for channel in channels:
                        try:
                            await self._write(node.http_address, "/channel/create",
                                              p.channel_params(topic, channel, pid),
                                              what="nsqd /channel/create")
                        except AdminError as exc:
                            if not exc.retriable:  # not leading yet: the next round
                                raise
                            last_error = str(exc)
                        except (ConnectionFailed, Timeout) as exc:
                            last_error = str(exc)
                if not channels and all(pid in leaders for pid in new):
                    return
            write = await self._quiet_view(topic, "w") if channels else None
            listed = set(write.partitions) if write is not None else set()
            missing = [pid for pid in new if pid not in listed]
            if channels and not missing:
                log.info("topic %s expanded to %d partitions: every new one takes writes",
                         topic, partitions)
                return
            note[0] = (f"partitions {missing or list(new)} not listed for writers yet"
                       + (f"; last error: {last_error}" if last_error else ""))
            if time.monotonic() - checked >= check:
                checked = time.monotonic()
                await self._check_topics(leader, topic)
            await asyncio.sleep(poll)

    async def _check_topics(self, leader: str, topic: str) -> None:
        """Have the leader lookupd run its topic check now: a meta update naming no
        parameter changes nothing, and the lookupd checks every topic after it."""
        try:
            await self._write(leader, "/topic/meta/update", {"topic": topic},
                              what="nsqlookupd /topic/meta/update")
        except (AdminError, ConnectionFailed, Timeout) as exc:
            log.debug("asking %s for a topic check: %s", leader, exc)

    async def _quiet_view(self, topic: str, access: str) -> TopicView | None:
        try:
            return await self.lookup(topic, access)
        except (LookupFailed, ConnectionFailed, Timeout, ProtocolError) as exc:
            log.debug("lookup of %s (%s) during expansion: %s", topic, access, exc)
            return None
