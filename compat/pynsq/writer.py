"""pynsq's ``Writer``: ``pub``, ``mpub``, ``dpub`` with ``callback(conn, data)``, over
smartnsq's Producer.

The publishes run on smartnsq's background network loop; each callback runs on the loop the
Writer was built on (the ``run()`` one), as pynsq runs it on its IOLoop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from smartnsq import sync
from smartnsq.compat.pynsq_loops import mailbox, release_user_loop, user_entry
from smartnsq.errors import ConnectionFailed, InvalidArgument, ServerError
from smartnsq.model.routes import parse_address
from smartnsq.model.sharding import ShardingKey
from smartnsq.producer.results import BatchResult, PublishResult
from smartnsq.protocol.numbers import check_int, is_real

from .options import Conn, addresses, connection_options, lookupd_addresses
from .protocol import SendError, asserting

__all__ = ["Callback", "Writer"]

log = logging.getLogger("smartnsq.compat.pynsq")

Callback = Callable[[Any, Any], object]


class Writer:
    """pynsq's ``Writer``: ``pub``, ``mpub``, ``dpub`` with ``callback(conn, data)``.

    ``Writer(nsqd_tcp_addresses, reconnect_interval=None, name=None, **kwargs)`` as in pynsq
    (``kwargs``: pynsq's connection arguments). ``reconnect_interval`` (seconds) is the longest
    wait before a failed nsqd is dialled again (smartnsq's back-off doubles up to it; 2 s when
    not given). Extensions: ``lookupd_http_addresses=[...]`` instead of nsqd addresses
    discovers the nodes (and youzan partitions); ``producer_options`` go to
    :class:`smartnsq.Producer` (``timeout``, ``classic``, ``migration``...); ``pub`` and
    ``mpub`` take ``sharding_key=``, routed as ``Producer.publish`` routes it.

    Each publish returns a ``concurrent.futures.Future`` of smartnsq's ``PublishResult`` /
    ``BatchResult``; the callback (on the ``run()`` thread) gets ``b"OK"`` or an :class:`Error`.
    Publishes retry within the producer's timeout (10 s) before failing.
    """

    @asserting
    def __init__(self, nsqd_tcp_addresses: str | Sequence[str] | None = None,
                 reconnect_interval: float | None = None, name: str | None = None, *,
                 lookupd_http_addresses: str | Sequence[str] | None = None,
                 producer_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        nsqd = addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        lookupd = lookupd_addresses(addresses(lookupd_http_addresses, "lookupd_http_addresses"))
        if bool(nsqd) == bool(lookupd):
            raise InvalidArgument("nsqd_tcp_addresses", "give nsqd_tcp_addresses or "
                                  "lookupd_http_addresses (one of them)")
        options, _ = connection_options(dict(kwargs))
        if reconnect_interval is not None:
            # pynsq waits this long before each redial of a failed nsqd; smartnsq redials
            # after a doubling, jittered wait (from 50 ms), which this caps
            if not is_real(reconnect_interval) or reconnect_interval <= 0:
                raise InvalidArgument("reconnect_interval", "must be a number of seconds "
                                      "above 0", reconnect_interval)
            options["reconnect_delay_max"] = float(reconnect_interval)
            options["reconnect_delay"] = min(0.05, float(reconnect_interval))
        options.update(producer_options or {})
        self.name = name or (nsqd or lookupd)[0]
        self.nsqd_tcp_addresses = nsqd
        self.lookupd_http_addresses = lookupd
        self.reconnect_interval = float(options.get("reconnect_delay_max", 2.0))
        self._closed = False
        # publishes handed to the network loop and not answered yet (close() fails those the
        # loop will never run)
        self._pending: dict[concurrent.futures.Future[Any],
                            tuple[str, str, Callback | None]] = {}
        entry = user_entry(acquire=True)
        self._loop = entry.loop
        self.io_loop = self._loop  # pynsq's attribute; call_later/call_soon/stop work alike
        # the sync Producer takes the shared loop thread and gives it back on close(), on
        # garbage collection (its finalizer) and when its own construction fails
        try:
            self._sync = sync.Producer(lookupd=lookupd or None, nsqd=nsqd or None, **options)
        except BaseException:
            release_user_loop(entry)
            raise
        self._finalizer = weakref.finalize(self, release_user_loop, entry)
        try:
            self._thread = self._sync.loop_thread
            self._producer = self._sync.async_producer
            self._user = mailbox(self._loop)
            self._net = mailbox(self._thread.loop)
            if nsqd:  # pynsq connects at start: so do we, rather than on the first publish
                self._thread.submit(self._connect([parse_address(a, "nsqd") for a in nsqd]))
        except BaseException:
            self._sync.close()
            self._finalizer()
            raise

    async def _connect(self, addresses: list[tuple[str, int]]) -> None:
        await self._producer.start()  # the sync Producer leaves it to the first call
        pool = self._producer.pool
        results = await asyncio.gather(*(pool.acquire(a) for a in addresses),
                                       return_exceptions=True)
        for address, result in zip(addresses, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("[%s] cannot connect to %s:%d yet: %s", self.name, *address,
                            result)

    @property
    def producer(self) -> sync.Producer:
        """The blocking smartnsq Producer behind this Writer (for new code)."""
        return self._sync

    def pub(self, topic: str, msg: bytes | str, callback: Callback | None = None, *,
            sharding_key: ShardingKey | None = None) \
            -> concurrent.futures.Future[PublishResult]:
        """Publish one message (PUB). ``sharding_key`` (an extension) sends every message of
        the key to one partition, the one ``smartnsq.Producer`` picks for it: what an ordered
        youzan topic needs (give the Writer ``lookupd_http_addresses``)."""
        future: concurrent.futures.Future[PublishResult] = concurrent.futures.Future()
        self._post(future, "pub", topic, callback, _body(msg), None, sharding_key)
        return future

    def mpub(self, topic: str, msg: bytes | str | Sequence[bytes | str],
             callback: Callback | None = None, *, sharding_key: ShardingKey | None = None) \
            -> concurrent.futures.Future[BatchResult]:
        """Publish several messages in one command (MPUB); ``sharding_key`` as in
        :meth:`pub`, for the whole batch."""
        bodies = [msg] if isinstance(msg, bytes | str) else list(msg)
        future: concurrent.futures.Future[BatchResult] = concurrent.futures.Future()
        self._post(future, "mpub", topic, callback, [_body(b) for b in bodies], None,
                   sharding_key)
        return future

    def dpub(self, topic: str, delay_ms: int, msg: bytes | str,
             callback: Callback | None = None) -> concurrent.futures.Future[PublishResult]:
        """Publish one message delivered after ``delay_ms`` (DPUB; classic nsqd only)."""
        check_int("delay_ms", delay_ms, 0)
        future: concurrent.futures.Future[PublishResult] = concurrent.futures.Future()
        self._post(future, "dpub", topic, callback, _body(msg), delay_ms / 1000.0, None)
        return future

    def _post(self, future: concurrent.futures.Future[Any], command: str, topic: str,
              callback: Callback | None, payload: bytes | list[bytes],
              delay: float | None, key: ShardingKey | None) -> None:
        """Hand the publish to the network loop; when nothing will run it there (the Writer
        is closed, the loop thread stopped) fail it now rather than leave it waiting."""
        if self._closed or not self._thread.running:
            self._fail(future, command, topic, callback,
                       ConnectionFailed(f"the Writer is closed; {command} not sent"))
            return
        self._pending[future] = (command, topic, callback)
        if not self._net.post(self._send, future, command, topic, callback, payload, delay,
                              key):
            self._pending.pop(future, None)
            self._fail(future, command, topic, callback,
                       ConnectionFailed(f"the network loop is gone; {command} not sent"))

    def _fail(self, future: concurrent.futures.Future[Any], command: str, topic: str,
              callback: Callback | None, exc: BaseException) -> None:
        """Fail a publish that never reached the producer: its future, then its callback."""
        if not _settle(future, None, exc):
            return  # answered already (or cancelled): its callback ran or will run
        if callback is not None:
            if not self._user.post(callback, None, SendError(f"{command} to {topic!r} "
                                                             f"failed: {exc}", exc)):
                log.error("[%s] %s to %r failed: %s (its callback cannot run: the event "
                          "loop it belongs to is closed)", self.name, command, topic, exc)
        else:
            log.error("[%s] %s to %r failed: %s", self.name, command, topic, exc)

    def _send(self, future: concurrent.futures.Future[Any], command: str, topic: str,
              callback: Callback | None, payload: bytes | list[bytes],
              delay: float | None, key: ShardingKey | None) -> None:
        """On the network loop: start the publish; its end answers the future and callback."""
        try:
            if not future.set_running_or_notify_cancel():
                self._pending.pop(future, None)
                return
        except RuntimeError:  # failed by close() meanwhile
            self._pending.pop(future, None)
            return
        coro: Any
        if isinstance(payload, list):
            coro = self._producer.publish_many(topic, payload, sharding_key=key)
        else:
            coro = self._producer.publish(topic, payload, sharding_key=key, delay=delay)
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(functools.partial(self._sent, future, command, topic, callback))

    def _sent(self, future: concurrent.futures.Future[Any], command: str, topic: str,
              callback: Callback | None, task: asyncio.Task[Any]) -> None:
        self._pending.pop(future, None)
        exc: BaseException | None = asyncio.CancelledError() if task.cancelled() \
            else task.exception()
        if exc is None:
            result = task.result()
            if not _settle(future, result, None):
                return  # failed by close() meanwhile: its callback got that answer
            conn: Any = Conn(result.node)
            data: Any = b"OK"
        else:
            if not _settle(future, None, exc):
                return
            conn = None
            data = SendError(f"{command} to {topic!r} failed: {exc}{self._hint(exc)}", exc)
        if callback is not None:
            self._user.post(callback, conn, data)
        elif exc is not None:
            log.error("[%s] %s to %r failed: %s%s", self.name, command, topic, exc,
                      self._hint(exc))

    def _hint(self, exc: BaseException) -> str:
        """What to do instead, for the refusal a pynsq-style Writer meets on youzan NSQ: an
        ordered (or otherwise partition-bound) topic wants a partition in each PUB, which a
        Writer that was given nsqd addresses and no key cannot name (it sends -1)."""
        if isinstance(exc, ServerError) and exc.code == "E_BAD_PARTITION":
            if self.lookupd_http_addresses:
                return " (give pub() a sharding_key=: this topic takes no unsharded publish)"
            return (" (this youzan topic wants each publish on a named partition: build the "
                    "Writer with lookupd_http_addresses=[...] instead of nsqd addresses, so "
                    "it learns the partitions, and pass pub(..., sharding_key=...) on an "
                    "ordered topic)")
        return ""

    def close(self) -> None:
        """Close the connections (pending publishes fail, their callbacks get an Error)."""
        self._closed = True
        try:
            self._sync.close()
        finally:
            # publishes the network loop never started (it stopped first) fail here
            for future, (command, topic, callback) in list(self._pending.items()):
                self._pending.pop(future, None)
                self._fail(future, command, topic, callback,
                           ConnectionFailed(f"the Writer was closed before {command} was "
                                            "sent"))
            self._finalizer()  # the run() loop: closed with its last user

    def __repr__(self) -> str:
        return f"<smartnsq.compat.pynsq.Writer {self.name}>"


def _settle(future: concurrent.futures.Future[Any], result: Any,
            exc: BaseException | None) -> bool:
    """Answer ``future`` unless it is answered already (two threads may race to): True when
    this call answered it."""
    try:
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)
    except concurrent.futures.InvalidStateError:
        return False
    return True


def _body(msg: bytes | str) -> bytes:
    if isinstance(msg, str):
        return msg.encode("utf-8")
    if isinstance(msg, bytearray | memoryview):
        return bytes(msg)
    return msg


