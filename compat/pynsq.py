"""pynsq's ``Reader``, ``Writer`` and ``run()`` on smartnsq's core: move over by changing imports.

::

    from smartnsq.compat import pynsq as nsq      # was: import nsq

    def handler(message):
        print(message.body)
        return True

    r = nsq.Reader(message_handler=handler, lookupd_http_addresses=["http://127.0.0.1:4161"],
                   topic="nsq_reader", channel="asdf", lookupd_poll_interval=15)
    nsq.run()

What stays as in pynsq: the constructor arguments, a handler returning ``True`` (finish) or
``False`` (requeue, with backoff), a raise (requeue), ``message.enable_async()`` (answer
later), coroutine handlers, ``max_tries`` and ``giving_up()``, ``preprocess_message`` /
``validate_message`` / ``process_message`` overrides, ``is_starved()``,
``set_max_in_flight()``, ``Writer.pub/mpub/dpub(..., callback=)`` with ``callback(conn,
data)`` getting ``b"OK"`` or an :class:`Error`, and a blocking ``run()``.

Threads. As in pynsq, every handler and every callback runs on the thread that called
``run()``, one at a time, on that thread's event loop (tornado's ``IOLoop.current()`` is the
same loop, so tornado's ``PeriodicCallback`` and ``IOLoop.current().stop()`` keep working).
The network side lives on smartnsq's background event loop: a slow handler delays the next
handler, never heartbeats or other connections.

What is better than pynsq: discovery, reconnection, RDY and backoff are smartnsq's, and on
youzan NSQ the Reader reads every partition of the topic and the Writer (given
``lookupd_http_addresses=``, an extension) publishes to partition leaders. The message also
carries youzan's fields (``partition``, ``trace_id``, ``headers``...; see ``message.smartnsq``).
The argument mapping is in docs/migration-pynsq.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import signal
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from smartnsq import sync
from smartnsq.compat.pynsq_loops import (
    loops_lock,
    mailbox,
    release_user_loop,
    running_loops,
    signals_wake,
    stopping_loops,
    user_entry,
)
from smartnsq.config import ConnectionConfig
from smartnsq.consumer.core import Consumer
from smartnsq.consumer.link import link_of
from smartnsq.discovery.lookup import normalize_lookupd
from smartnsq.errors import (
    AlreadyResponded,
    ConnectionFailed,
    InvalidArgument,
    InvalidArgumentAssertion,
)
from smartnsq.message import Message as CoreMessage
from smartnsq.model.backoff import BackoffPolicy
from smartnsq.model.routes import parse_address
from smartnsq.producer.results import BatchResult, PublishResult
from smartnsq.protocol.numbers import check_int, is_real
from smartnsq.protocol.validate import check_channel, check_topic
from smartnsq.transport import loop_thread

if TYPE_CHECKING:
    from smartnsq.observability.stats import ConsumerStats

__all__ = ["Error", "Message", "Reader", "SendError", "Writer", "run", "stop"]

log = logging.getLogger("smartnsq.compat.pynsq")

T = TypeVar("T")
P = ParamSpec("P")

WATCH_INTERVAL = 1.0
"""Seconds between a Reader's looks at its connections (for ``heartbeat()``) and at its
``run()`` loop (closed under it: the Reader closes)."""

# pynsq's AsyncConn keyword arguments (what Reader/Writer accept in **kwargs)
CONN_ARGS = frozenset({
    "timeout", "heartbeat_interval", "requeue_delay", "tls_v1", "tls_options", "snappy",
    "deflate", "deflate_level", "user_agent", "output_buffer_size", "output_buffer_timeout",
    "sample_rate", "auth_secret", "msg_timeout", "hostname",
})


class Error(Exception):
    """What a publish callback gets instead of ``b"OK"`` (pynsq's ``nsq.Error``).

    ``error`` is the smartnsq exception behind it (``Timeout``, ``ServerError``...).
    """

    def __init__(self, message: str, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.error = error


class SendError(Error):
    """The publish could not be delivered (pynsq's ``nsq.protocol.SendError``)."""


def _asserting(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` raising :class:`InvalidArgumentAssertion` where the core raised
    ``InvalidArgument`` (the same fields and message, and the traceback of the check)."""

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except InvalidArgumentAssertion:
            raise
        except InvalidArgument as exc:
            error = InvalidArgumentAssertion(exc.field, exc.rule, exc.value)
            raise error.with_traceback(exc.__traceback__) from None

    return checked


# -- where handlers and callbacks run (the loops: smartnsq.compat.pynsq_loops) ----------------

_readers: weakref.WeakSet[Reader] = weakref.WeakSet()  # for run()'s check of the handlers
# open Readers, held here until close(), as pynsq's IOLoop holds its Readers (through their
# callbacks): a pynsq program may build ``nsq.Reader(...)`` without keeping a reference and
# then call run(). Otherwise the Reader's own references (its consumers hold its bound
# methods) form a cycle that nothing else holds: a garbage collection before run() -- any
# thread's allocations may trigger one, so it came at random under load -- freed it, and run()
# then waited for messages that would never come.
_open_readers: set[Reader] = set()


@_asserting
def run() -> None:
    """Run every Reader's handlers and Writer's callbacks until :func:`stop` (or SIGTERM/INT).

    As ``nsq.run()``: blocks the calling thread on its event loop. Tornado's
    ``IOLoop.current().stop()`` stops it too.
    """
    entry = user_entry(acquire=True)
    loop = entry.loop
    try:
        for reader in list(_readers):
            if reader._loop is loop and not reader._closed and not reader._has_handler():
                raise InvalidArgument("message_handler", f"Reader {reader.name} has none: "
                                      "give message_handler= or call set_message_handler() "
                                      "before run()")
        with contextlib.ExitStack() as on_return:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, _on_signal)
                on_return.enter_context(signals_wake(loop))
            stopping_loops.discard(loop)
            running_loops.add(loop)
            try:
                loop.run_forever()
            finally:
                running_loops.discard(loop)
                stopping_loops.discard(loop)
    finally:
        release_user_loop(entry)


def stop() -> None:
    """Make :func:`run` return: the calling thread's, or, from another thread, every one."""
    try:  # a handler, a callback or a signal handler of a run(): that run()
        own: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        own = None
    with loops_lock:
        running = list(running_loops)
    targets = [own] if own is not None and own in running else running
    for target in targets:
        if target.is_closed() or (target in stopping_loops and target.is_running()):
            continue  # closed, or already stopping: a second stop must not end the next run
        stopping_loops.add(target)
        # after what this turn scheduled (done callbacks), as call_soon would, but also
        # waking the loop's selector: called from a signal handler (ours on SIGINT/SIGTERM,
        # or the program's own), the loop may be idle in select() with nothing due, and a
        # plain call_soon would wait there for the next message
        target.call_soon_threadsafe(target.stop)


def _on_signal(signum: int, frame: Any) -> None:
    log.info("signal %d: stopping", signum)
    stop()


# -- connection arguments ----------------------------------------------------------------------

def connection_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """pynsq ``AsyncConn`` keywords as ``ConnectionConfig`` fields, plus ``requeue_delay``."""
    unknown = set(kwargs) - CONN_ARGS
    if unknown:
        raise InvalidArgument("keyword arguments", "not pynsq AsyncConn arguments",
                              sorted(unknown))
    out: dict[str, Any] = {}
    if "timeout" in kwargs:
        out["connect_timeout"] = float(kwargs["timeout"])
    if "heartbeat_interval" in kwargs:
        out["heartbeat_interval"] = float(kwargs["heartbeat_interval"])
    if kwargs.get("snappy"):
        out["compression"] = "snappy"
    if kwargs.get("deflate"):
        if kwargs.get("snappy"):
            raise InvalidArgument("compression", "choose snappy or deflate, not both")
        out["compression"] = "deflate"
    if "deflate_level" in kwargs:
        out["deflate_level"] = kwargs["deflate_level"]
    if kwargs.get("tls_v1"):
        options = dict(kwargs.get("tls_options") or {})
        out["tls"] = True
        if options.get("cert_reqs") == ssl.CERT_NONE:
            out["tls_verify"] = False
        for theirs, ours in (("ca_certs", "tls_ca_file"), ("certfile", "tls_cert_file"),
                             ("keyfile", "tls_key_file")):
            if options.get(theirs):
                out[ours] = options[theirs]
    for name in ("user_agent", "sample_rate", "hostname"):
        if kwargs.get(name) is not None:
            out[name] = kwargs[name]
    if kwargs.get("output_buffer_size") is not None:
        out["output_buffer_size"] = kwargs["output_buffer_size"]
    if kwargs.get("output_buffer_timeout") is not None:
        out["output_buffer_timeout"] = max(10, kwargs["output_buffer_timeout"]) / 1000.0
    if kwargs.get("msg_timeout") is not None:
        out["msg_timeout"] = float(kwargs["msg_timeout"])
    secret = kwargs.get("auth_secret")
    if secret is not None:
        out["auth_secret"] = secret.decode() if isinstance(secret, bytes) else str(secret)
    requeue_delay = float(kwargs.get("requeue_delay", 90))
    ConnectionConfig(**out)  # bad values fail here, with the field's name
    return out, requeue_delay


def _addresses(value: str | Iterable[str] | None, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable):
        return list(value)
    raise InvalidArgument(what, "must be an address or a list of addresses", value)


def _lookupd(addresses: list[str]) -> list[str]:
    """pynsq's ``http://host:port`` addresses as the core takes them (``host:port``)."""
    return [normalize_lookupd(a) for a in addresses]


# -- Writer ------------------------------------------------------------------------------------

class Conn:
    """The ``conn`` a publish callback gets: which nsqd answered (pynsq passes its AsyncConn)."""

    __slots__ = ("host", "id", "port")

    def __init__(self, node: str) -> None:
        self.id = node
        host, _, port = node.rpartition(":")
        self.host = host
        self.port = int(port) if port.isascii() and port.isdigit() else 0

    def __repr__(self) -> str:
        return f"<Conn {self.id}>"


Callback = Callable[[Any, Any], object]


class Writer:
    """pynsq's ``Writer``: ``pub``, ``mpub``, ``dpub`` with ``callback(conn, data)``.

    ``Writer(nsqd_tcp_addresses, reconnect_interval=15.0, name=None, **kwargs)`` as in pynsq
    (``kwargs``: pynsq's connection arguments). Extension: ``lookupd_http_addresses=[...]``
    instead of nsqd addresses discovers the nodes (and youzan partitions); ``producer_options``
    go to :class:`smartnsq.Producer` (``timeout``, ``classic``, ``migration``...).

    Each publish returns a ``concurrent.futures.Future`` of smartnsq's ``PublishResult`` /
    ``BatchResult``; the callback (on the ``run()`` thread) gets ``b"OK"`` or an :class:`Error`.
    Publishes retry within the producer's timeout (10 s) before failing.
    """

    @_asserting
    def __init__(self, nsqd_tcp_addresses: str | Sequence[str] | None = None,
                 reconnect_interval: float = 15.0, name: str | None = None, *,
                 lookupd_http_addresses: str | Sequence[str] | None = None,
                 producer_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        nsqd = _addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        lookupd = _lookupd(_addresses(lookupd_http_addresses, "lookupd_http_addresses"))
        if bool(nsqd) == bool(lookupd):
            raise InvalidArgument("nsqd_tcp_addresses", "give nsqd_tcp_addresses or "
                                  "lookupd_http_addresses (one of them)")
        if not is_real(reconnect_interval):
            raise InvalidArgument("reconnect_interval", "must be a number of seconds",
                                  reconnect_interval)
        options, _ = connection_options(dict(kwargs))
        options.update(producer_options or {})
        self.name = name or (nsqd or lookupd)[0]
        self.nsqd_tcp_addresses = nsqd
        self.lookupd_http_addresses = lookupd
        self.reconnect_interval = reconnect_interval  # smartnsq backs off by itself
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

    def pub(self, topic: str, msg: bytes | str, callback: Callback | None = None) \
            -> concurrent.futures.Future[PublishResult]:
        """Publish one message (PUB)."""
        future: concurrent.futures.Future[PublishResult] = concurrent.futures.Future()
        self._post(future, "pub", topic, callback, _body(msg), None)
        return future

    def mpub(self, topic: str, msg: bytes | str | Sequence[bytes | str],
             callback: Callback | None = None) -> concurrent.futures.Future[BatchResult]:
        """Publish several messages in one command (MPUB)."""
        bodies = [msg] if isinstance(msg, bytes | str) else list(msg)
        future: concurrent.futures.Future[BatchResult] = concurrent.futures.Future()
        self._post(future, "mpub", topic, callback, [_body(b) for b in bodies], None)
        return future

    def dpub(self, topic: str, delay_ms: int, msg: bytes | str,
             callback: Callback | None = None) -> concurrent.futures.Future[PublishResult]:
        """Publish one message delivered after ``delay_ms`` (DPUB; classic nsqd only)."""
        check_int("delay_ms", delay_ms, 0)
        future: concurrent.futures.Future[PublishResult] = concurrent.futures.Future()
        self._post(future, "dpub", topic, callback, _body(msg), delay_ms / 1000.0)
        return future

    def _post(self, future: concurrent.futures.Future[Any], command: str, topic: str,
              callback: Callback | None, payload: bytes | list[bytes],
              delay: float | None) -> None:
        """Hand the publish to the network loop; when nothing will run it there (the Writer
        is closed, the loop thread stopped) fail it now rather than leave it waiting."""
        if self._closed or not self._thread.running:
            self._fail(future, command, topic, callback,
                       ConnectionFailed(f"the Writer is closed; {command} not sent"))
            return
        self._pending[future] = (command, topic, callback)
        if not self._net.post(self._send, future, command, topic, callback, payload, delay):
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
              delay: float | None) -> None:
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
            coro = self._producer.publish_many(topic, payload)
        else:
            coro = self._producer.publish(topic, payload, delay=delay)
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
            data = SendError(f"{command} to {topic!r} failed: {exc}", exc)
        if callback is not None:
            self._user.post(callback, conn, data)
        elif exc is not None:
            log.error("[%s] %s to %r failed: %s", self.name, command, topic, exc)

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


# -- Reader ------------------------------------------------------------------------------------

class Message:
    """pynsq's ``nsq.Message`` over a smartnsq message.

    ``id`` (str: the hex id on classic nodes, the 16 bytes in hex on youzan), ``body``,
    ``timestamp`` (ns), ``attempts``; ``enable_async()``, ``is_async()``, ``has_responded()``,
    ``finish()``, ``requeue(delay=None, backoff=True)``, ``touch()``, ``is_alive()``. Anything
    else (youzan's ``partition``, ``trace_id``, ``headers``...) is read from ``smartnsq``, the
    core message.
    """

    __slots__ = ("_async", "_reader", "_responded", "_since", "smartnsq")

    def __init__(self, message: CoreMessage, reader: Reader) -> None:
        self.smartnsq = message
        self._reader = reader
        self._async = False
        self._responded = False
        self._since = time.monotonic()  # delivery (built as it arrives), then the last touch

    @property
    def id(self) -> str:
        raw = self.smartnsq.id
        if self.smartnsq.youzan:
            return bytes(raw).hex()
        return bytes(raw).decode("ascii", "replace")

    @property
    def body(self) -> bytes:
        return self.smartnsq.body

    @property
    def timestamp(self) -> int:
        return self.smartnsq.timestamp

    @property
    def attempts(self) -> int:
        return self.smartnsq.attempts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.smartnsq, name)

    def enable_async(self) -> None:
        """Answer later, by hand: the Reader will not finish/requeue on the handler's return."""
        self._async = True

    def is_async(self) -> bool:
        return self._async

    def has_responded(self) -> bool:
        return self._responded

    def _settle(self) -> None:
        if self._responded:
            raise AlreadyResponded(f"message {self.id} was already answered")
        self._responded = True

    def finish(self) -> None:
        """FIN: processed (or to be dropped)."""
        self._settle()
        # answered on the network loop, batched with the other answers of this loop turn
        self._reader._net.post(self.smartnsq.fin)

    def requeue(self, **kwargs: Any) -> None:
        """REQ. ``delay`` (s; -1 or absent: ``requeue_delay`` x attempts), ``time_ms``,
        ``backoff`` (default True) as in pynsq."""
        backoff = bool(kwargs.get("backoff", True))
        delay = kwargs.get("delay")
        time_ms = kwargs.get("time_ms", -1)
        if is_real(delay) and delay >= 0:
            seconds = float(delay)
        elif isinstance(time_ms, int | float) and time_ms >= 0:
            seconds = time_ms / 1000.0
        else:
            seconds = self._reader.requeue_delay * self.attempts
        self._settle()
        self._reader._net.post(self.smartnsq.req, seconds, backoff)

    def touch(self) -> None:
        if self._responded:
            raise AlreadyResponded(f"message {self.id} was already answered")
        self._since = time.monotonic()
        self._reader._net.post(self.smartnsq.touch)

    def is_alive(self) -> bool:
        """Whether the message has *timed out*, as pynsq documents it ("whether or not this
        message is timed out based on the msg_timeout parameter") and returns it: True once
        the server's ``msg_timeout`` passed since delivery (or the last ``touch()``) with no
        answer, when the server redelivers it to someone; False before, and once answered.
        Despite the name, False is the healthy answer: pynsq programs rely on that."""
        return self._timed_out(time.monotonic())

    def _timed_out(self, now: float) -> bool:
        return not self._responded and now - self._since >= self._msg_timeout()

    def _msg_timeout(self) -> float:
        """The delivering connection's negotiated ``msg_timeout``; the Reader's
        ``msg_timeout=`` (else nsqd's default, 60 s) when the server did not say."""
        conn = getattr(link_of(self.smartnsq), "conn", None)
        negotiated = float(getattr(conn, "msg_timeout", 0.0) or 0.0)
        return negotiated or self._reader.msg_timeout or 60.0

    def __repr__(self) -> str:
        return f"<Message id={self.id} attempts={self.attempts} body={self.body[:40]!r}>"


Handler = Callable[[Message], Any]


class Reader:
    """pynsq's ``Reader`` on :class:`smartnsq.Consumer` (arguments as in pynsq).

    ``Reader(topic, channel, message_handler=None, name=None, nsqd_tcp_addresses=None,
    lookupd_http_addresses=None, max_tries=5, max_in_flight=1, lookupd_poll_interval=60,
    low_rdy_idle_timeout=10, max_backoff_duration=128, lookupd_poll_jitter=0.3,
    lookupd_connect_timeout=1, lookupd_request_timeout=2, **kwargs)``; ``kwargs`` are pynsq's
    connection arguments. Extension: ``consumer_options`` go to the Consumer (``ordered``,
    ``classic``...). Connections open once ``run()`` runs, as in pynsq.
    """

    @_asserting
    def __init__(self, topic: str, channel: str, message_handler: Handler | None = None,
                 name: str | None = None,
                 nsqd_tcp_addresses: str | Sequence[str] | None = None,
                 lookupd_http_addresses: str | Sequence[str] | None = None,
                 max_tries: int = 5, max_in_flight: int = 1,
                 lookupd_poll_interval: float = 60, low_rdy_idle_timeout: float = 10,
                 max_backoff_duration: float = 128, lookupd_poll_jitter: float = 0.3,
                 lookupd_connect_timeout: float = 1, lookupd_request_timeout: float = 2, *,
                 consumer_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        check_topic(topic)
        check_channel(channel)
        check_int("max_in_flight", max_in_flight, 0)
        check_int("max_tries", max_tries, 0)  # 0: never give up
        if not 0 <= lookupd_poll_jitter <= 1:
            raise InvalidArgument("lookupd_poll_jitter", "must be in 0..1", lookupd_poll_jitter)
        nsqd = _addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        lookupd = _lookupd(_addresses(lookupd_http_addresses, "lookupd_http_addresses"))
        if not nsqd and not lookupd:
            raise InvalidArgument("nsqd_tcp_addresses", "give nsqd_tcp_addresses and/or "
                                  "lookupd_http_addresses")
        conn_options, self.requeue_delay = connection_options(dict(kwargs))
        self.msg_timeout: float | None = conn_options.get("msg_timeout")
        self.topic = topic
        self.channel = channel
        self.name = name or f"{topic}:{channel}"
        self.nsqd_tcp_addresses = nsqd
        self.lookupd_http_addresses = lookupd
        self.max_tries = max_tries
        self.max_in_flight = max_in_flight
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self.message_handler: Handler | None = None
        if message_handler is not None:
            self.set_message_handler(message_handler)
        common: dict[str, Any] = {
            "max_in_flight": max_in_flight,
            "handler": self._deliver,
            "auto_finish": False,
            "low_rdy_idle_timeout": float(low_rdy_idle_timeout),
            "backoff_policy": BackoffPolicy(initial=min(1.0, float(max_backoff_duration)),
                                            max=float(max_backoff_duration)),
            **conn_options,
            **(consumer_options or {}),
        }
        specs: list[dict[str, Any]] = []
        shares = _split(max_in_flight, int(bool(lookupd)) + int(bool(nsqd)))
        if lookupd:
            specs.append({**common, "max_in_flight": shares[0], "lookupd": lookupd,
                                "lookup_options": {
                "poll_interval": float(lookupd_poll_interval),
                "jitter": float(lookupd_poll_jitter),
                "connect_timeout": float(lookupd_connect_timeout),
                "timeout": float(max(lookupd_request_timeout, lookupd_connect_timeout)),
            }})
        if nsqd:
            specs.append({**common, "max_in_flight": shares[-1], "nsqd": nsqd})
        # built here (a Consumer binds to no loop before start()): a bad argument raises
        # InvalidArgument from this constructor, not later inside run()'s loop
        self._consumers: list[Consumer] = [Consumer(topic, channel, **spec) for spec in specs]
        entry = user_entry(acquire=True)
        self._loop = entry.loop
        self.io_loop = self._loop  # pynsq's attribute; call_later/call_soon/stop work alike
        self._closed = False
        self._starting = False
        # handed to the run() loop, not yet taken by a handler (claimed once: set ops are
        # atomic, so a message is either handled or given back by close(), never both)
        self._waiting: set[Message] = set()
        # the shared network loop and the run() loop: taken last, given back by close()
        # (before its future completes), here on failure, or by the finalizer at interpreter
        # exit for a Reader never closed (_open_readers keeps an open one until then)
        try:
            self._thread = loop_thread.shared()
        except BaseException:
            release_user_loop(entry)
            raise
        try:
            self._user = mailbox(self._loop)
            self._net = mailbox(self._thread.loop)
            self._finalizer = weakref.finalize(self, loop_thread.release_shared,
                                               self._thread)
            # released by close() on the calling thread (normally the run() one, where the
            # loop can also be unset as the thread's event loop), not on the network loop
            self._loop_finalizer = weakref.finalize(self, release_user_loop, entry)
            _readers.add(self)
            # a weak reference: what keeps an open Reader is _open_readers; a Reader closed
            # (and dropped) before run() must not be kept by a callback in a loop that may
            # never run
            self._loop.call_soon_threadsafe(_start_reader, weakref.ref(self))
            self._thread.loop.call_soon_threadsafe(_watch, weakref.ref(self))
        except BaseException:
            loop_thread.release_shared(self._thread)
            release_user_loop(entry)
            raise
        _open_readers.add(self)

    # -- lifecycle ----------------------------------------------------------------------------

    def _start(self) -> None:
        """On the user loop once ``run()`` runs: open the consumers on the network loop."""
        if self._closed or self._starting:
            return
        if not self._has_handler():
            # run() refuses to start in this case; only a loop run by other means gets here
            log.error("[%s] no message_handler: not consuming (set_message_handler() "
                      "before running the loop)", self.name)
            return
        self._starting = True
        for consumer in self._consumers:
            future = self._thread.submit(self._open(consumer))
            future.add_done_callback(self._started)

    async def _open(self, consumer: Consumer) -> None:
        # started on the network loop: what the consumer binds to the running loop at start
        # (its lookup manager, events, tasks) must be that loop, not the run() one
        if self._closed:
            return
        await consumer.start()

    def _has_handler(self) -> bool:
        return (self.message_handler is not None
                or type(self).process_message is not Reader.process_message)

    def _started(self, future: concurrent.futures.Future[Any]) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is not None:
            log.error("[%s] cannot start consuming: %s", self.name, exc)

    def close(self) -> concurrent.futures.Future[Any]:
        """Close the connections (pynsq's ``close()``); returns a future of the drain.

        Messages no handler took yet go back to the server at once. While ``run()`` runs,
        handlers holding messages (``enable_async``) get the consumer's drain time to answer;
        once it returned, nothing will answer them and they are left to the server's
        redelivery.

        Bounded as ``Consumer.close()`` is (its drain, then its connections' close, even with
        a subscription caught mid-handshake). The shared loop thread is given back before
        the future completes.
        """
        self._closed = True
        _open_readers.discard(self)  # the caller's references decide from now on

        async def close_all() -> None:
            # on the network loop, after any _open() already under way added its consumer
            consumers, self._consumers = self._consumers, []
            # what no handler took yet goes back at once: after run() returned nothing will
            # take it, and the consumers' drain would wait for it in vain
            while self._waiting:
                try:
                    message = self._waiting.pop()
                except KeyError:
                    break
                if not message._responded:
                    message._responded = True
                    message.smartnsq.req(0, backoff=False)
            # handlers answer on the run() loop: when it is not running (run() returned) no
            # answer will come, so no drain: nothing is in flight but the REQs just sent, and
            # CLS (within close_timeout) makes sure the server read them before the socket
            # closes (close(0) would drop the connection at once, losing them on classic nsqd
            # until msg_timeout)
            await asyncio.gather(*(c.close(None if self._loop.is_running()
                                           else c.config.connection.close_timeout)
                                   for c in consumers), return_exceptions=True)

        try:
            return self._close_then_release(close_all())
        finally:
            # the run() loop: closed with its last user (when run() is not running it;
            # otherwise when run() returns)
            self._loop_finalizer()

    def _close_then_release(self, closing: Coroutine[Any, Any, None]) \
            -> concurrent.futures.Future[None]:
        """Run ``closing`` on the network loop; give the loop thread back before the returned
        future completes (a caller waiting on it then sees the release done)."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        finalizer = self._finalizer

        def finish(inner: concurrent.futures.Future[None] | asyncio.Future[None]) -> None:
            try:
                finalizer()
            finally:
                exc: BaseException | None = (concurrent.futures.CancelledError()
                                             if inner.cancelled() else inner.exception())
                if exc is None:
                    done.set_result(None)
                else:
                    done.set_exception(exc)

        inner: concurrent.futures.Future[None] | asyncio.Future[None]
        try:
            if self._thread.in_loop_thread():  # the Reader closing itself (_orphaned)
                inner = asyncio.ensure_future(closing)
            else:
                inner = self._thread.submit(closing)
        except BaseException:  # the loop thread is gone: nothing is left to close there
            finalizer()
            done.set_result(None)
            return done
        inner.add_done_callback(finish)
        return done

    @_asserting
    def set_message_handler(self, message_handler: Handler) -> None:
        if not callable(message_handler):
            raise InvalidArgument("message_handler", "must be callable", message_handler)
        self.message_handler = message_handler

    # -- what pynsq users call --------------------------------------------------------------------

    def is_starved(self) -> bool:
        """True when a connection's in-flight messages reach 85 % of its RDY (pynsq's rule:
        time to process a batch being buffered by ``enable_async`` handlers)."""
        return bool(self._on_network_loop(lambda cs: any(c.is_starved() for c in cs)))

    @_asserting
    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time; 0 pauses the Reader."""
        check_int("max_in_flight", max_in_flight, 0)
        self.max_in_flight = max_in_flight
        for consumer, share in zip(self._consumers, _split(max_in_flight, len(self._consumers)),
                                   strict=False):
            self._thread.call_soon(consumer.set_max_in_flight, share)

    def stats(self) -> list[ConsumerStats]:
        """smartnsq's consumer statistics, one snapshot per source."""
        return list(self._on_network_loop(lambda cs: [c.stats() for c in cs]))

    def _on_network_loop(self, read: Callable[[list[Consumer]], T]) -> T:
        """``read(consumers)`` on the network loop, which is what mutates their state (read
        from here, a dict could change size mid-iteration); directly once that loop is gone,
        as nothing mutates them any more."""
        consumers = list(self._consumers)
        thread = self._thread
        if thread.running and not thread.in_loop_thread():
            with contextlib.suppress(RuntimeError):  # stopped meanwhile
                return thread.call(read, consumers)
        return read(consumers)

    # -- subclass hooks (as pynsq) ------------------------------------------------------------

    def process_message(self, message: Message) -> Any:
        assert self.message_handler is not None
        return self.message_handler(message)

    def giving_up(self, message: Message) -> None:
        log.warning("[%s] giving up on message %s after %d tries (max:%d) %r", self.name,
                    message.id, message.attempts, self.max_tries, message.body)

    def preprocess_message(self, message: Message) -> Message:
        return message

    def validate_message(self, message: Message) -> bool:
        return True

    def heartbeat(self, conn: Any) -> None:
        """Called on the ``run()`` thread for each heartbeat a connection received, with that
        connection (a :class:`Conn`: ``id``, ``host``, ``port``), as pynsq calls it: override
        it to watch liveness. smartnsq has already answered the heartbeat (on the network
        loop), so a slow override delays handlers, never the connection."""

    # -- the network loop's look at the Reader ---------------------------------------------------

    def _listen_to_heartbeats(self) -> None:
        """On the network loop. The Consumer has no heartbeat hook but its connections do
        (``on_heartbeat``): each connection subscribed since the last look gets ours, and the
        heartbeats it counted before that are passed on at once, so none is missed."""
        for consumer in self._consumers:
            for conn in consumer.connections():
                if conn.on_heartbeat is not None:
                    continue  # listened to already
                node = Conn(conn.address_text)

                def heard(node: Conn = node) -> None:
                    self._user.post(self._heartbeat, node)

                for _ in range(conn.heartbeats):
                    heard()
                conn.on_heartbeat = heard

    def _heartbeat(self, conn: Conn) -> None:
        """On the run() loop: the hook, whose failure is the program's to see, not a reason to
        stop calling it."""
        if self._closed:
            return
        try:
            self.heartbeat(conn)
        except Exception:
            log.exception("[%s] heartbeat(%s) raised", self.name, conn.id)

    def _orphaned(self) -> None:
        """On the network loop: the run() loop was closed before this Reader, so no handler
        will ever run again; consuming on (each message handed back at once, redelivered at
        once) would only churn, and the Reader would outlive its loop."""
        log.warning("[%s] its event loop was closed before the Reader: closing the Reader "
                    "(close() Readers before the loop they were built on)", self.name)
        self.close()

    # -- delivery -----------------------------------------------------------------------------

    def _deliver(self, message: CoreMessage) -> None:
        """On the network loop: hand the message to the user loop."""
        if self._closed:  # closing: nothing will handle it here
            message.req(0, backoff=False)
            return
        wrapped = Message(message, self)
        self._waiting.add(wrapped)
        if not self._user.post(self._handle, wrapped):  # the run() loop is closed
            with contextlib.suppress(KeyError):
                self._waiting.remove(wrapped)
                message.req(0, backoff=False)
            self._orphaned()

    def _handle(self, message: Message) -> None:
        try:
            self._waiting.remove(message)
        except KeyError:
            return  # given back by close()
        result: Any = False
        try:
            if 0 < self.max_tries < message.attempts:
                self.giving_up(message)
                message.finish()
                return
            if not self.validate_message(self.preprocess_message(message)):
                message.finish()
                return
            result = self.process_message(message)
        except Exception:
            log.exception("[%s] uncaught exception while handling message %s body:%r",
                          self.name, message.id, message.body)
            if not message.has_responded():
                message.requeue()
            return
        if inspect.isawaitable(result):
            message.enable_async()
            task = asyncio.ensure_future(result, loop=self._loop)
            task.add_done_callback(functools.partial(self._maybe_finish, message))
        elif not message.is_async() and not message.has_responded():
            if result is None:
                log.warning("[%s] the handler returned None for message %s: requeued "
                            "(return True to finish, False to requeue)", self.name,
                            message.id)
            if result:
                message.finish()
            else:
                message.requeue()

    def _maybe_finish(self, message: Message, task: asyncio.Future[Any]) -> None:
        if message.has_responded():
            return
        try:
            if not task.cancelled() and task.result():
                message.finish()
                return
        except Exception:
            log.exception("[%s] coroutine handler failed on message %s", self.name,
                          message.id)
        message.requeue()

    def __repr__(self) -> str:
        return f"<smartnsq.compat.pynsq.Reader {self.name}>"


def _split(total: int, parts: int) -> list[int]:
    """``max_in_flight`` shared by the Reader's sources (lookupd and nsqd), as pynsq shares
    it over its connections: each at least 1 unless the total is 0."""
    if parts <= 1:
        return [total]
    if total == 0:
        return [0] * parts
    base, extra = divmod(total, parts)
    return [max(1, base + (1 if i < extra else 0)) for i in range(parts)]


def _start_reader(ref: weakref.ref[Reader]) -> None:
    reader = ref()
    if reader is not None:
        reader._start()


def _watch(ref: weakref.ref[Reader]) -> None:
    """On the network loop, every :data:`WATCH_INTERVAL` until the Reader closes: its
    connections' heartbeats reach ``heartbeat()``; a closed run() loop closes it."""
    reader = ref()
    if reader is None or reader._closed:
        return
    if reader._loop.is_closed():
        reader._orphaned()
        return
    reader._listen_to_heartbeats()
    asyncio.get_running_loop().call_later(WATCH_INTERVAL, _watch, ref)
