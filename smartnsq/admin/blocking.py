"""The blocking admin client: :class:`Admin`, :class:`AsyncAdmin` from any thread.

Each call runs the async client's on a :class:`~smartnsq.transport.loop_thread.LoopThread` and
waits a little longer than that call's own deadline (``GUARD``), so the async call's
``Timeout`` (which says what was asked where) is what a caller sees, not the facade's.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from ..errors import NSQError
from ..observability.stats import ChannelLag
from ..protocol.admin import CreationProgress, NodeInfo, NodeStats
from ..protocol.commands import StartPosition
from ..protocol.lookup import LookupdList, Node, TopicView
from ..protocol.operations import StoredMessage
from ..transport import loop_thread as _loops
from ..transport.event_loop import warn_if_blocking_a_loop
from ..transport.loop_thread import LoopThread
from .base import DEFAULT_MAX_ANSWER, DEFAULT_TIMEOUT, positive
from .client import AsyncAdmin
from .creation import Progress
from .operator import Targets

__all__ = ["GUARD", "Admin"]

T = TypeVar("T")

GUARD = 5.0
"""How much longer a blocking call waits than the async call's own deadline."""


class Admin:
    """:class:`AsyncAdmin` as blocking calls, safe from any thread (same arguments, results
    and errors). Runs on a :class:`~smartnsq.transport.loop_thread.LoopThread` (default: the
    process-wide one); nothing is dialled at construction. Close it (or use ``with``)."""

    def __init__(self, lookupd: Sequence[str] | str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT, max_answer_bytes: int = DEFAULT_MAX_ANSWER,
                 loop_thread: LoopThread | None = None) -> None:
        self._async = AsyncAdmin(lookupd, timeout=timeout, max_answer_bytes=max_answer_bytes)
        self._shared = loop_thread is None
        self._thread = _loops.shared() if loop_thread is None else loop_thread.start()
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_admin, self._thread, self._shared,
                                           self._async)

    @property
    def async_admin(self) -> AsyncAdmin:
        """The async client behind this facade (use it only on ``loop_thread.loop``)."""
        return self._async

    @property
    def loop_thread(self) -> LoopThread:
        return self._thread

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("this Admin is closed")
        future = self._thread.submit(coro)  # (refused on the loop's own thread)
        warn_if_blocking_a_loop("smartnsq.Admin", "use smartnsq.AsyncAdmin", 2)
        return self._thread.wait(future, timeout + GUARD)

    def listlookup(self, address: str | None = None) -> LookupdList:
        return self._run(self._async.listlookup(address),
                         self._async.timeout * max(1, len(self._async.lookupd)))

    def leader_lookupd(self) -> str | None:
        return self._run(self._async.leader_lookupd(),
                         self._async.timeout * max(1, len(self._async.lookupd)))

    def lookup(self, topic: str, access: str = "r") -> TopicView:
        return self._run(self._async.lookup(topic, access), self._async.timeout)

    def nodes(self) -> tuple[Node, ...]:
        return self._run(self._async.nodes(),
                         self._async.timeout * max(1, len(self._async.lookupd)))

    def info(self, address: str) -> NodeInfo:
        return self._run(self._async.info(address), self._async.timeout)

    def stats(self, address: str, topic: str | None = None, channel: str | None = None, *,
              partition: int | None = None, leader_only: bool = False) -> NodeStats:
        return self._run(self._async.stats(address, topic, channel, partition=partition,
                                           leader_only=leader_only), self._async.timeout)

    def cluster_stats(self, topic: str | None = None, channel: str | None = None, *,
                      nsqd: Sequence[str] | None = None) -> dict[str, NodeStats | NSQError]:
        return self._run(self._async.cluster_stats(topic, channel, nsqd=nsqd),
                         self._async.timeout * (1 + len(self._async.lookupd)))

    def channel_lag(self, topic: str, channel: str, *,
                    nodes: Sequence[tuple[int | None, str]] | None = None) -> ChannelLag:
        return self._run(self._async.channel_lag(topic, channel, nodes=nodes),
                         self._async.timeout * 2)

    def _per_partition(self) -> float:
        return self._async.timeout * (2 + 256)  # a lookup, then one request per partition

    def create_channel(self, topic: str, channel: str, *, partition: int | None = None,
                       address: str | None = None) -> Targets:
        return self._run(self._async.create_channel(topic, channel, partition=partition,
                                                    address=address), self._per_partition())

    def delete_channel(self, topic: str, channel: str, *, partition: int | None = None,
                       address: str | None = None) -> Targets:
        return self._run(self._async.delete_channel(topic, channel, partition=partition,
                                                    address=address), self._per_partition())

    def set_offset(self, topic: str, channel: str, position: StartPosition, *,
                   partition: int | None = None, address: str | None = None) -> Targets:
        return self._run(self._async.set_offset(topic, channel, position, partition=partition,
                                                address=address), self._per_partition())

    def pause_channel(self, topic: str, channel: str, *, partition: int | None = None,
                      address: str | None = None) -> Targets:
        return self._run(self._async.pause_channel(topic, channel, partition=partition,
                                                   address=address), self._per_partition())

    def unpause_channel(self, topic: str, channel: str, *, partition: int | None = None,
                        address: str | None = None) -> Targets:
        return self._run(self._async.unpause_channel(topic, channel, partition=partition,
                                                     address=address), self._per_partition())

    def empty_channel(self, topic: str, channel: str, *, partition: int | None = None,
                      address: str | None = None) -> Targets:
        return self._run(self._async.empty_channel(topic, channel, partition=partition,
                                                   address=address), self._per_partition())

    def skip_channel(self, topic: str, channel: str, *, partition: int | None = None,
                     address: str | None = None) -> Targets:
        return self._run(self._async.skip_channel(topic, channel, partition=partition,
                                                  address=address), self._per_partition())

    def unskip_channel(self, topic: str, channel: str, *, partition: int | None = None,
                       address: str | None = None) -> Targets:
        return self._run(self._async.unskip_channel(topic, channel, partition=partition,
                                                    address=address), self._per_partition())

    def empty_delayed(self, topic: str, channel: str, *, partition: int | None = None,
                      address: str | None = None) -> Targets:
        return self._run(self._async.empty_delayed(topic, channel, partition=partition,
                                                   address=address), self._per_partition())

    def requeue_delayed(self, topic: str, channel: str, *, partition: int | None = None,
                        address: str | None = None) -> Targets:
        return self._run(self._async.requeue_delayed(topic, channel, partition=partition,
                                                     address=address), self._per_partition())

    def finish_message(self, topic: str, channel: str, message_id: int, *,
                       partition: int | None = None,
                       address: str | None = None) -> tuple[int, str]:
        return self._run(self._async.finish_message(topic, channel, message_id,
                                                    partition=partition, address=address),
                         self._async.timeout * 2)

    def get_message(self, topic: str, *, message_id: int | None = None,
                    queue_offset: int | None = None, count: int | None = None,
                    partition: int | None = None, ext: bool = False,
                    delayed_channel: str | None = None,
                    address: str | None = None) -> StoredMessage:
        return self._run(self._async.get_message(
            topic, message_id=message_id, queue_offset=queue_offset, count=count,
            partition=partition, ext=ext, delayed_channel=delayed_channel, address=address),
            self._async.timeout * 2)

    def pause_topic(self, topic: str, *, address: str | None = None) -> Targets:
        return self._run(self._async.pause_topic(topic, address=address),
                         self._per_partition())

    def unpause_topic(self, topic: str, *, address: str | None = None) -> Targets:
        return self._run(self._async.unpause_topic(topic, address=address),
                         self._per_partition())

    def expand_topic(self, topic: str, partitions: int, *, wait: bool = False,
                     channels: list[str] | None = None, timeout: float = 60.0,
                     check_interval: float = 5.0, poll_interval: float = 0.5) -> str:
        calls = self._async.timeout * (1 + len(self._async.lookupd))
        return self._run(self._async.expand_topic(topic, partitions, wait=wait,
                                                  channels=channels, timeout=timeout,
                                                  check_interval=check_interval,
                                                  poll_interval=poll_interval),
                         calls + (timeout if wait else 0.0))

    def tombstone(self, topic: str, node: str, *, restore: bool = False) -> tuple[str, ...]:
        return self._run(self._async.tombstone(topic, node, restore=restore),
                         self._async.timeout)

    def delete_topic(self, topic: str) -> None:
        self._run(self._async.delete_topic(topic), self._per_partition())

    def create_topic(self, topic: str, partitions: int = 1, replicas: int = 1, *,
                     timeout: float = 60.0, progress: Progress | None = None,
                     **options: Any) -> CreationProgress:
        """Blocking :meth:`AsyncAdmin.create_topic`; ``progress`` runs on the loop thread."""
        limit = positive("timeout", timeout)
        return self._run(self._async.create_topic(topic, partitions, replicas, timeout=limit,
                                                  progress=progress, **options), limit)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<smartnsq.admin.Admin {', '.join(self._async.lookupd) or '-'} {state}>"


def _close_admin(thread: LoopThread, shared: bool, client: AsyncAdmin) -> None:
    try:
        if thread.running and not thread.in_loop_thread():
            with contextlib.suppress(Exception):
                thread.run(client.aclose(), GUARD)
    finally:
        if shared:
            _loops.release_shared(thread)
