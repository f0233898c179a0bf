"""pynsq's ``Reader`` over smartnsq's Consumer: handlers on the ``run()`` loop, the network on
smartnsq's background loop.

Each Reader binds to the loop current when it is built (:mod:`smartnsq.compat.pynsq_loops`);
its consumers deliver on the network loop, which hands each message to that loop, where the
pynsq hooks (``preprocess_message``, ``validate_message``, ``process_message``,
``giving_up``, ``heartbeat``) run one at a time, as on pynsq's IOLoop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from smartnsq.compat.pynsq_loops import mailbox, release_user_loop, user_entry
from smartnsq.consumer.core import Consumer
from smartnsq.consumer.link import link_of
from smartnsq.errors import InvalidArgument
from smartnsq.message import Message as CoreMessage
from smartnsq.model.backoff import BackoffPolicy
from smartnsq.protocol.numbers import check_int
from smartnsq.protocol.validate import check_channel, check_topic
from smartnsq.transport import loop_thread

from .message import Message
from .options import Conn, addresses, connection_options, lookupd_addresses
from .protocol import asserting

if TYPE_CHECKING:
    from smartnsq.observability.stats import ConsumerStats

__all__ = ["WATCH_INTERVAL", "Handler", "Reader", "ReaderAnswers", "readers_without_handler"]

log = logging.getLogger("smartnsq.compat.pynsq")

T = TypeVar("T")

WATCH_INTERVAL = 1.0
"""Seconds between a Reader's looks at its connections (for ``heartbeat()``) and at its
``run()`` loop (closed under it: the Reader closes)."""

_readers: weakref.WeakSet[Reader] = weakref.WeakSet()  # for run()'s check of the handlers
# open Readers, held here until close(), as pynsq's IOLoop holds its Readers (through their
# callbacks): a pynsq program may build ``nsq.Reader(...)`` without keeping a reference and
# then call run(). Otherwise the Reader's own references (its consumers hold its bound
# methods) form a cycle that nothing else holds: a garbage collection before run() -- any
# thread's allocations may trigger one, so it came at random under load -- freed it, and run()
# then waited for messages that would never come.
_open_readers: set[Reader] = set()


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

    @asserting
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
        nsqd = addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        lookupd = lookupd_addresses(addresses(lookupd_http_addresses, "lookupd_http_addresses"))
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
            "max_attempts": 0,  # the Reader's own max_tries decides (giving_up), as pynsq's
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
            self._answers = ReaderAnswers(self)
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
                    core_of(message).req(0, backoff=False)
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

    @asserting
    def set_message_handler(self, message_handler: Handler) -> None:
        if not callable(message_handler):
            raise InvalidArgument("message_handler", "must be callable", message_handler)
        self.message_handler = message_handler

    # -- what pynsq users call --------------------------------------------------------------------

    def is_starved(self) -> bool:
        """True when a connection's in-flight messages reach 85 % of its RDY (pynsq's rule:
        time to process a batch being buffered by ``enable_async`` handlers)."""
        return bool(self._on_network_loop(lambda cs: any(c.is_starved() for c in cs)))

    @asserting
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
        wrapped = self._message(message)
        self._waiting.add(wrapped)
        if not self._user.post(self._handle, wrapped):  # the run() loop is closed
            with contextlib.suppress(KeyError):
                self._waiting.remove(wrapped)
                message.req(0, backoff=False)
            self._orphaned()

    def _message(self, core: CoreMessage) -> Message:
        """The pynsq message for ``core``: its id as text (a classic id's 16 characters, a
        youzan id's 16 bytes in hex), its answers through this Reader."""
        raw = core.id
        text = bytes(raw).hex() if core.youzan else bytes(raw).decode("ascii", "replace")
        return Message.received(text, core, self._answers)

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


def core_of(message: Message) -> CoreMessage:
    """The core message a Reader delivered (it made the pynsq one from it)."""
    core = message.smartnsq
    assert isinstance(core, CoreMessage)
    return core


class ReaderAnswers:
    """A Reader's messages' answers (:class:`~smartnsq.compat.pynsq.message.Answers`): sent
    on the network loop, batched with the other answers of its loop turn."""

    __slots__ = ("reader",)

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    @property
    def requeue_delay(self) -> float:
        return self.reader.requeue_delay

    def fin(self, message: Message) -> None:
        self.reader._net.post(core_of(message).fin)

    def req(self, message: Message, seconds: float, backoff: bool) -> None:
        self.reader._net.post(core_of(message).req, seconds, backoff)

    def touch(self, message: Message) -> None:
        self.reader._net.post(core_of(message).touch)

    def timeout_of(self, message: Message) -> float:
        """The delivering connection's negotiated ``msg_timeout``; the Reader's
        ``msg_timeout=`` (else nsqd's default, 60 s) when the server did not say."""
        conn = getattr(link_of(core_of(message)), "conn", None)
        negotiated = float(getattr(conn, "msg_timeout", 0.0) or 0.0)
        return negotiated or self.reader.msg_timeout or 60.0


def readers_without_handler(loop: asyncio.AbstractEventLoop) -> list[Reader]:
    """The open Readers of ``loop`` with no handler: ``run()`` refuses to start for them."""
    return [reader for reader in list(_readers)
            if reader._loop is loop and not reader._closed and not reader._has_handler()]
