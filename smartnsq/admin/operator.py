"""The operator's actions: pause, empty, skip, read one message, tombstone.

Each is one HTTP call per node it concerns, sent where the real servers take it
(docs/admin.md has the table): a channel action on each partition's leader (youzan) or on
each nsqd holding the topic (classic), a tombstone on every lookupd (each keeps its own
registrations, so one lookupd's tombstone is not the others'). Expanding a topic is
:mod:`smartnsq.admin.expansion`. The requests and the ``/message/get`` answer are built and read by
:mod:`smartnsq.protocol.operations`; the channel actions that return report where they were
sent, so a caller (the CLI's ``--json``) can say which partitions were touched.
"""

from __future__ import annotations

import asyncio

from ..errors import AdminError, LookupFailed
from ..protocol import admin as p
from ..protocol import operations as ops
from ..protocol.operations import StoredMessage
from .base import AdminBase, check_addresses

__all__ = ["OperatorActions", "Targets"]

Targets = tuple[tuple[int | None, str], ...]
"""Where an action was sent: ``(partition, nsqd HTTP address)`` pairs (``None``: classic)."""


class OperatorActions(AdminBase):
    """The operator's actions of :class:`smartnsq.admin.AsyncAdmin`."""

    # -- channels -------------------------------------------------------------------------------

    async def _channel_action(self, action: str, topic: str, channel: str,
                              partition: int | None, address: str | None) -> Targets:
        path, _ = ops.CHANNEL_ACTIONS[action]
        done = await self._on_leaders(
            f"nsqd {path}", path, topic,
            lambda pid: p.channel_params(topic, channel, pid), partition, address)
        return tuple(done)

    async def pause_channel(self, topic: str, channel: str, *, partition: int | None = None,
                            address: str | None = None) -> Targets:
        """Stop delivering ``channel``'s messages (they keep arriving and wait); on one nsqd
        (``address``), one partition's leader, or every partition's leader / every nsqd."""
        return await self._channel_action("pause", topic, channel, partition, address)

    async def unpause_channel(self, topic: str, channel: str, *, partition: int | None = None,
                              address: str | None = None) -> Targets:
        """Deliver a paused channel's messages again (from where it stopped)."""
        return await self._channel_action("unpause", topic, channel, partition, address)

    async def empty_channel(self, topic: str, channel: str, *, partition: int | None = None,
                            address: str | None = None) -> Targets:
        """Drop every message waiting in ``channel`` (youzan: its cursor moves to the end of
        the queue and its delayed queue is emptied; classic: its queue is discarded)."""
        return await self._channel_action("empty", topic, channel, partition, address)

    async def skip_channel(self, topic: str, channel: str, *, partition: int | None = None,
                           address: str | None = None) -> Targets:
        """Youzan: move ``channel`` to the end and drop what is published while it is
        skipped, until :meth:`unskip_channel` (a consumer group switched off without
        deleting it). Classic nsqd has no such route (404)."""
        return await self._channel_action("skip", topic, channel, partition, address)

    async def unskip_channel(self, topic: str, channel: str, *, partition: int | None = None,
                             address: str | None = None) -> Targets:
        """Youzan: let a skipped channel receive new messages again."""
        return await self._channel_action("unskip", topic, channel, partition, address)

    async def empty_delayed(self, topic: str, channel: str, *, partition: int | None = None,
                            address: str | None = None) -> Targets:
        """Youzan: drop every message waiting in ``channel``'s delayed queue (messages
        requeued with a delay, kept on disk), leaving its normal queue as it is."""
        return await self._channel_action("empty_delayed", topic, channel, partition, address)

    async def requeue_delayed(self, topic: str, channel: str, *,
                              partition: int | None = None,
                              address: str | None = None) -> Targets:
        """Youzan: deliver ``channel``'s delayed messages now instead of at their time."""
        return await self._channel_action("requeue_delayed", topic, channel, partition,
                                          address)

    async def finish_message(self, topic: str, channel: str, message_id: int, *,
                             partition: int | None = None,
                             address: str | None = None) -> tuple[int, str]:
        """Youzan: finish ``channel``'s copy of one message as a consumer would (one stuck in
        flight or delayed). On the leader of the id's partition unless ``address``; the
        ``(partition, node)`` it was sent to. A message not in flight is refused
        (``AdminError`` 500 "Message ID not in flight")."""
        pid = ops.partition_of_id(message_id) if partition is None else partition
        params = ops.finish_params(topic, channel, message_id, pid)
        node = await self._leader_node(topic, pid, address, "message finish")
        await self._write(node, "/message/finish", params, what="nsqd /message/finish")
        return pid, node

    # -- messages -------------------------------------------------------------------------------

    async def get_message(self, topic: str, *, message_id: int | None = None,
                          queue_offset: int | None = None, count: int | None = None,
                          partition: int | None = None, ext: bool = False,
                          delayed_channel: str | None = None,
                          address: str | None = None) -> StoredMessage:
        """One stored message of a youzan topic, by internal id, queue offset or 1-based
        count (exactly one; the last two need ``partition``), read on the leader of its
        partition unless ``address``. There is no search by trace id on the server: a
        trace id's message is found from its publish receipt (id and offset) or the trace
        log. ``delayed_channel``: the copy waiting in that channel's delayed queue.
        ``AdminError`` when the server has none there (500 ``INTERNAL_ERROR`` past the end)."""
        params = ops.message_get_params(topic, message_id=message_id, queue_offset=queue_offset,
                                        count=count, partition=partition, ext=ext,
                                        delayed_channel=delayed_channel)
        pid = int(params["partition"])
        node = await self._leader_node(topic, pid, address, "message get")
        status, body = await self._request("GET", node, "/message/get", params=params,
                                           what="nsqd /message/get")
        return ops.parse_message(status, body, address=node, partition=pid)

    async def _leader_node(self, topic: str, partition: int, address: str | None,
                           what: str) -> str:
        if address is not None:
            return check_addresses([address], "address")[0]
        view = await self.lookup(topic, "r")
        if not view.youzan:
            raise AdminError(404, f"{topic!r} is a classic topic: classic nsqd keeps no "
                                  f"readable log of messages", what=what)
        leader = view.leader(partition)
        if leader is None:
            raise LookupFailed(f"{what}: partition {partition} of {topic!r} has no leader now")
        return leader.http_address

    # -- topics ---------------------------------------------------------------------------------

    async def _topic_action(self, path: str, topic: str, address: str | None) -> Targets:
        params = ops.topic_params(topic)
        if address is not None:
            nodes = [check_addresses([address], "address")[0]]
        else:
            nodes = [n.http_address for n in (await self.lookup(topic, "r")).producers]
        for node in nodes:
            await self._write(node, path, params, what=f"nsqd {path}")
        return tuple((None, node) for node in nodes)

    async def pause_topic(self, topic: str, *, address: str | None = None) -> Targets:
        """Classic: stop giving the topic's messages to its channels (they wait in the
        topic), on ``address`` or every nsqd lookupd lists for it. Youzan nsqd has no such
        route (404): its channels read the partition's queue themselves; pause those."""
        return await self._topic_action("/topic/pause", topic, address)

    async def unpause_topic(self, topic: str, *, address: str | None = None) -> Targets:
        """Classic: give a paused topic's messages to its channels again."""
        return await self._topic_action("/topic/unpause", topic, address)

    async def tombstone(self, topic: str, node: str, *, restore: bool = False
                        ) -> tuple[str, ...]:
        """Hide nsqd ``node`` (its ``host:http_port``) from ``topic``'s writers on every
        lookupd (``restore``: show it again); consumers still read what it holds. Each
        lookupd keeps its own tombstones (they are not shared), so all are told, at once;
        the lookupds that took it. The first refusal is raised once every lookupd was asked.
        """
        params = ops.tombstone_params(topic, node, restore=restore)
        lookupds = self._need_lookupd("topic tombstone")
        answers = await asyncio.gather(
            *(self._write(where, "/topic/tombstone", params, what="nsqlookupd /topic/tombstone")
              for where in lookupds), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return lookupds
