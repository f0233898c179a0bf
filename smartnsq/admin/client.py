"""The asyncio admin client: :class:`AsyncAdmin`, the nsqd/nsqlookupd HTTP API.

It is the topic creation (:mod:`.creation`) and the operator's actions (:mod:`.operator`)
over the shared requests (:mod:`.base`), plus the node reads (``/info``, ``/stats``, a
channel's lag) and the channel and topic writes every workflow uses (create, delete,
setoffset).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from ..errors import AdminError, NSQError
from ..observability.stats import ChannelLag, PartitionLag
from ..protocol import admin as p
from ..protocol import validate
from ..protocol.admin import NodeInfo, NodeStats
from ..protocol.commands import StartPosition
from .base import check_addresses
from .creation import TopicCreation
from .expansion import TopicExpansion
from .operator import OperatorActions, Targets

__all__ = ["AsyncAdmin"]


class AsyncAdmin(TopicCreation, TopicExpansion, OperatorActions):
    """The nsqd/nsqlookupd HTTP API for asyncio code.

    ``lookupd``: the cluster's nsqlookupd HTTP addresses (needed by every cluster-wide call;
    node calls take the nsqd's HTTP address). ``timeout`` bounds each request (a workflow such
    as ``create_topic`` has its own). Nothing is dialled at construction. Use ``async with``
    or call ``aclose()``; ``client`` lends a :class:`smartnsq.transport.http.HttpClient` (not closed
    here).
    """

    # -- nodes ----------------------------------------------------------------------------------

    async def info(self, address: str) -> NodeInfo:
        """``/info`` of an nsqd or nsqlookupd (HTTP address)."""
        address = check_addresses([address], "address")[0]
        status, body = await self._request("GET", address, "/info", what="/info")
        return p.parse_info(status, body, address=address)

    async def stats(self, address: str, topic: str | None = None, channel: str | None = None,
                    *, partition: int | None = None, leader_only: bool = False) -> NodeStats:
        """``/stats?format=json`` of one nsqd (HTTP address)."""
        address = check_addresses([address], "address")[0]
        params = p.stats_params(topic, channel, partition, leader_only=leader_only)
        status, body = await self._request("GET", address, "/stats", params=params,
                                           what="nsqd /stats")
        return p.parse_stats(status, body, address=address)

    async def cluster_stats(self, topic: str | None = None, channel: str | None = None, *,
                            nsqd: Sequence[str] | None = None
                            ) -> dict[str, NodeStats | NSQError]:
        """``/stats`` of every nsqd (``nsqd`` HTTP addresses, or every node lookupd knows),
        asked at once: node address -> its stats, or the error it gave."""
        addresses = check_addresses(nsqd, "nsqd") if nsqd else tuple(
            n.http_address for n in await self.nodes())
        answers = await asyncio.gather(*(self.stats(a, topic, channel) for a in addresses),
                                       return_exceptions=True)
        out: dict[str, NodeStats | NSQError] = {}
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, NSQError):
                raise answer
            out[address] = answer
        return out

    async def channel_lag(self, topic: str, channel: str, *,
                          nodes: Sequence[tuple[int | None, str]] | None = None
                          ) -> ChannelLag:
        """A channel's backlog per partition: depth, in-flight, deferred, youzan's backlogs and
        the topic's queue ends, each from the ``/stats`` of the node that serves it.

        ``nodes``: ``(partition, nsqd HTTP address)`` pairs to ask (``None`` partition: the
        node's entry for the topic, classic); by default each partition's leader from a read
        lookup (youzan), or every node that has the topic (classic). Every node is asked once,
        all at once; a node that fails gives its partitions an ``error`` instead of failing
        the whole reading."""
        validate.check_topic(topic)
        validate.check_channel(channel)
        if nodes is None:
            view = await self.lookup(topic, "r")
            if view.youzan and view.partitions:
                nodes = [(pid, part.leader.http_address)
                         for pid, part in sorted(view.partitions.items())
                         if part.leader is not None]
            else:
                nodes = [(None, node.http_address) for node in view.producers]
        wanted: dict[str, list[int | None]] = {}
        for partition, address in nodes:
            wanted.setdefault(check_addresses([address], "nodes")[0], []).append(partition)
        addresses = list(wanted)
        answers = await asyncio.gather(*(self.stats(a, topic, channel) for a in addresses),
                                       return_exceptions=True)
        parts: list[PartitionLag] = []
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, NSQError):
                raise answer
            for partition in wanted[address]:
                parts.append(_lag_of(answer, topic, channel, partition, address))
        parts.sort(key=lambda p: (-1 if p.partition is None else p.partition, p.node))
        return ChannelLag(topic, channel, time.time(), tuple(parts))

    # -- channels -------------------------------------------------------------------------------

    async def create_channel(self, topic: str, channel: str, *, partition: int | None = None,
                             address: str | None = None) -> Targets:
        """Create ``channel`` on one nsqd (``address``), else on each partition's leader;
        where it was created."""
        return tuple(await self._on_leaders(
            "nsqd /channel/create", "/channel/create", topic,
            lambda pid: p.channel_params(topic, channel, pid), partition, address))

    async def delete_channel(self, topic: str, channel: str, *, partition: int | None = None,
                             address: str | None = None) -> Targets:
        """Delete ``channel`` on one nsqd (``address``), else on each partition's leader."""
        return tuple(await self._on_leaders(
            "nsqd /channel/delete", "/channel/delete", topic,
            lambda pid: p.channel_params(topic, channel, pid), partition, address))

    async def set_offset(self, topic: str, channel: str, position: StartPosition, *,
                         partition: int | None = None, address: str | None = None) -> Targets:
        """Move a youzan channel's cursor (``/channel/setoffset``) on one partition's leader
        (``partition``/``address``) or on every partition; the server applies it even with
        consumers connected."""
        body = p.setoffset_body(position)
        return tuple(await self._on_leaders(
            "nsqd /channel/setoffset", "/channel/setoffset", topic,
            lambda pid: p.channel_params(topic, channel, pid), partition, address,
            content=body))

    # -- topics ---------------------------------------------------------------------------------

    async def delete_topic(self, topic: str) -> None:
        """Delete a topic: every partition through the leader lookupd (youzan), or on every
        nsqd and lookupd (classic)."""
        validate.check_topic(topic)
        leader = await self._youzan_leader("topic delete")
        if leader is not None:
            await self._write(leader, "/topic/delete", p.topic_delete_params(topic),
                              what="nsqlookupd /topic/delete")
            return
        params = p.topic_delete_params(topic, youzan=False)
        for node in await self.nodes():
            await self._write(node.http_address, "/topic/delete", params,
                              what="nsqd /topic/delete")
        for lookupd in self.lookupd:
            with contextlib.suppress(AdminError):  # a lookupd that never saw it says 404
                await self._write(lookupd, "/topic/delete", params,
                                  what="nsqlookupd /topic/delete")


def _lag_of(answer: NodeStats | NSQError, topic: str, channel: str, partition: int | None,
            address: str) -> PartitionLag:
    """One partition's :class:`PartitionLag` from its node's ``/stats`` (or its error)."""
    if isinstance(answer, NSQError):
        return PartitionLag(partition, address, error=str(answer))
    entry = answer.topic(topic, partition)
    if entry is None:
        return PartitionLag(partition, address, error="the node does not have the topic")
    chan = entry.channel(channel)
    if chan is None:
        return PartitionLag(partition, address, topic_depth=entry.depth,
                            message_count=entry.message_count,
                            backend_start=entry.backend_start,
                            backend_depth=entry.backend_depth,
                            error="the node does not have the channel")
    return PartitionLag(entry.partition if partition is None else partition, address,
                        depth=chan.depth, in_flight=chan.in_flight, deferred=chan.deferred,
                        requeued=chan.requeued, timed_out=chan.timed_out,
                        clients=chan.clients, backlogs=chan.backlogs,
                        topic_depth=entry.depth, message_count=entry.message_count,
                        backend_start=entry.backend_start, backend_depth=entry.backend_depth)
