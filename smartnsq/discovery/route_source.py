"""Routes from nsqlookupd: the writers' lookup view of a topic as :class:`TopicRoutes`.

:class:`LookupRouteSource` is the :class:`~smartnsq.model.routes.RouteSource` of a producer
given ``lookupd=``: it watches each topic it is asked about, turns every change the
:class:`~smartnsq.discovery.lookup.LookupManager` reports into routes, and runs the rounds of their
own a chase asks for (one at a time per topic, each within ``ROUND_TIMEOUT``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..model import failover as policy
from ..model.routes import Address, RoutesCallback, TopicRoutes

if TYPE_CHECKING:  # .lookup is imported when used: nsqd=[...] needs no lookup
    from ..protocol.lookup import TopicView
    from .lookup import LookupManager, TopicChange

__all__ = ["LookupRouteSource"]

log = logging.getLogger("smartnsq.pool")


class LookupRouteSource:
    """Routes from nsqlookupd, through a :class:`smartnsq.discovery.lookup.LookupManager`.

    Writers' views (``access="w"``) become :class:`TopicRoutes`: the partition count,
    ``ordered`` and ``ext`` from the topic's meta, each partition's leader, and the producers
    of a classic topic as plain nodes. Builds and owns a manager from ``lookupd`` addresses
    and ``options`` (:class:`~smartnsq.LookupConfig` fields), or uses the one given as
    ``lookup=`` without closing it (so several producers can share one).
    """

    def __init__(self, lookupd: Iterable[str] | None, *, lookup: LookupManager | None = None,
                 options: Mapping[str, object] | None = None) -> None:
        from .lookup import LookupManager  # imported when used: nsqd=[...] needs no lookup

        self._lookup: LookupManager
        if lookup is not None:
            if not isinstance(lookup, LookupManager):
                raise InvalidArgument("lookup", "must be a smartnsq.discovery.lookup.LookupManager",
                                      lookup)
            if options:
                raise InvalidArgument("lookup_options", "cannot be combined with lookup=",
                                      dict(options))
            self._lookup = lookup
            self._owned = False
        else:
            if lookupd is None:
                raise InvalidArgument("lookupd", "needs at least one address", lookupd)
            self._lookup = LookupManager(lookupd, **dict[str, Any](options or {}))
            self._owned = True
        self._callbacks: list[RoutesCallback] = []
        self._watched: set[str] = set()
        self._rounds: dict[str, asyncio.Task[None]] = {}  # ``refresh(now=True)`` rounds
        self._subscribed = False
        self._closed = False

    @property
    def lookup(self) -> LookupManager:
        """The :class:`~smartnsq.discovery.lookup.LookupManager` behind these routes."""
        return self._lookup

    async def start(self) -> None:
        if not self._subscribed:
            self._lookup.subscribe(self._on_change)
            self._subscribed = True
        await self._lookup.start()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._rounds.values():
            task.cancel()
        await asyncio.gather(*self._rounds.values(), return_exceptions=True)
        self._lookup.unsubscribe(self._on_change)
        for topic in self._watched:
            self._lookup.unwatch(topic, "w")
        self._watched.clear()
        if self._owned:
            await self._lookup.close()

    async def routes(self, topic: str) -> TopicRoutes:
        view = await self._lookup.view(topic, "w")
        if topic not in self._watched and not self._closed:
            self._watched.add(topic)
            self._lookup.watch(topic, "w")
        return self.view_routes(view)

    async def read_leader(self, topic: str, partition: int, timeout: float) -> Address | None:
        """The partition's leader as lookup names it to readers (``access=r``: a leader that
        is up, writable or not), or None; asked afresh (the answer must be as recent as the
        writers' one it explains), within ``timeout`` (``LookupTimeout`` past it).
        A producer asks when writers' lookup names no leader, to say which it is."""
        view = await self._lookup.view(topic, "r", refresh=True, timeout=timeout)
        found = view.partitions.get(partition)
        return None if found is None or found.leader is None else found.leader.address

    def refresh(self, topic: str, *, now: bool = False) -> None:
        if self._closed:
            return
        if not now:
            self._lookup.refresh(topic, "w")
        elif topic not in self._rounds:  # one round at a time per topic
            self._rounds[topic] = task = asyncio.get_running_loop().create_task(
                self._round(topic))
            task.add_done_callback(lambda _: self._rounds.pop(topic, None))

    async def _round(self, topic: str) -> None:
        """A lookup round of its own; what it finds comes back through the subscription."""
        try:
            await self._lookup.view(topic, "w", refresh=True, timeout=policy.ROUND_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("lookup round for %s failed: %s", topic, exc)

    def subscribe(self, callback: RoutesCallback) -> None:
        self._callbacks.append(callback)

    def _on_change(self, change: TopicChange) -> None:
        if change.access != "w" or change.new is None or change.topic not in self._watched:
            return
        routes = self.view_routes(change.new)
        for callback in list(self._callbacks):
            callback(routes)

    @staticmethod
    def view_routes(view: TopicView) -> TopicRoutes:
        """A writers' lookup view as routes."""
        meta = view.meta
        if view.youzan:
            leaders = {pid: p.leader.address for pid, p in view.partitions.items()
                       if p.leader is not None}
            # classic nsqd registered beside youzan ones serve the topic without a partition
            nodes = tuple(n.address for n in view.unpartitioned if not n.youzan)
            return TopicRoutes(view.topic,
                               partition_num=meta.partition_num if meta is not None else 0,
                               ordered=meta is not None and meta.ordered,
                               ext=meta is not None and meta.extend_support,
                               youzan=True, leaders=leaders, nodes=nodes)
        nodes = tuple(n.address for n in view.producers)
        youzan: bool | None = False
        if any(n.youzan for n in view.producers):
            youzan = None  # youzan nsqd behind a classic lookupd: the connection will tell
        return TopicRoutes(view.topic, youzan=youzan, nodes=nodes)
