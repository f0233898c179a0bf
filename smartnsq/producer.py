"""The asyncio Producer: routing, retries and tracing over the partition-keyed pool.

One publish is: validate, pick the target from the topic's current routes, encode, append to
the target connection's write buffer, await one future. No task, lock or timer per publish:
the connection coalesces every command queued in one event-loop iteration into one socket
write, so a thousand concurrent publishes cost a handful of syscalls, and its single deadline
timer covers every call in flight.

Routing (protocol.md 6.2):

* ``sharding_key``: ``router(key, partition_num)`` (murmur3 as the Go client by default;
  ``"java"`` or a callable, see ``smartnsq.sharding``). The key always goes to that partition:
  when it has no leader right now (normal for tens of seconds during a failover) the publish
  refreshes lookup and waits, until its deadline, never writing to another partition.
* ``partition``: that partition, same rules.
* neither: round-robin over the partitions that have a leader now (or the plain nodes of a
  classic topic). Ordered topics refuse this: their order only exists per partition.

Retries follow ``smartnsq.errors``: ``REFRESH_AND_RETRY`` errors (not leader, not writable,
partition not here) refresh lookup and retry after a back-off; ``RETRY`` errors retry after a
back-off; ``GIVE_UP`` errors raise at once. A lost connection is retried on a fresh one. All of
it happens within the call's ``timeout``; past it the call raises ``Timeout`` (its
``__cause__`` is the last failure). Delivery is therefore at least once: a publish whose
connection died after the server wrote it but before the answer arrived is sent again and
stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import TracebackType
from typing import Any

from . import trace as tracing
from .backoff import exponential_delay
from .config import ConnectionConfig, doc
from .connection import Connection
from .dialect import DEFAULT_POLICY, ChooserFactory, ClassicDialect, RouteChooser
from .errors import (
    Action,
    ConnectionClosed,
    ConnectionError_,
    InvalidArgument,
    LookupFailed,
    NSQError,
    ServerError,
    Timeout,
    TopicNotFound,
)
from .pool import (
    Address,
    LookupRouteSource,
    NodeBackoff,
    PartitionPool,
    RouteSource,
    StaticRouteSource,
    TopicRoutes,
)
from .protocol import commands
from .protocol import validate as v
from .protocol.responses import PublishReceipt, parse_publish_response
from .protocol.validate import TRACE_ID_HEADER
from .sharding import Router, ShardingKey, ShardingScheme, key_bytes, make_router

__all__ = ["BatchResult", "Producer", "ProducerConfig", "PublishResult"]

log = logging.getLogger("smartnsq.producer")

_MAX_DELAY_MS = 3_600_000 * 24 * 365  # far beyond any server's max_req_timeout


@dataclass(frozen=True)
class ProducerConfig:
    """How a Producer routes, retries and traces (each field has a documented default)."""

    timeout: float = field(default=10.0, metadata=doc(
        "Default deadline of a whole publish call, retries included; past it the call "
        "raises Timeout.", unit="s", range="> 0"))
    sharding: ShardingScheme = field(default="murmur3", metadata=doc(
        "How sharding keys map to partitions: 'murmur3' (the Go client), 'java' (the Java "
        "client) or a callable (key, partition_num) -> partition.",
        range="'murmur3', 'java' or callable"))
    max_msg_size: int = field(default=v.DEFAULT_MAX_MSG_SIZE, metadata=doc(
        "Largest message body sent (the server's max_msg_size); larger bodies are refused "
        "before sending.", unit="bytes", range="1..2**31-1"))
    max_body_size: int = field(default=v.DEFAULT_MAX_BODY_SIZE, metadata=doc(
        "Largest MPUB batch (the server's max_body_size).", unit="bytes",
        range="1..2**31-1"))
    retry_delay: float = field(default=0.05, metadata=doc(
        "First back-off between attempts of one publish; doubles per attempt, jittered.",
        unit="s", range="> 0"))
    retry_delay_max: float = field(default=1.0, metadata=doc(
        "Longest back-off between attempts (a route change ends a back-off early).",
        unit="s", range=">= retry_delay"))
    reconnect_delay: float = field(default=0.05, metadata=doc(
        "First wait before dialling a node again after its connect failed; doubles per "
        "consecutive failure, jittered.", unit="s", range="> 0"))
    reconnect_delay_max: float = field(default=2.0, metadata=doc(
        "Longest wait before dialling a failed node again.", unit="s",
        range=">= reconnect_delay"))
    drain_timeout: float = field(default=5.0, metadata=doc(
        "How long close() waits for publishes already sent to be acknowledged before it "
        "fails them (the server may have accepted them: a caller retrying a failed one "
        "could publish it twice). 0 fails them at once.", unit="s", range=">= 0"))
    idle_timeout: float | None = field(default=300.0, metadata=doc(
        "Close a node's connection after this long unused; None keeps connections open.",
        unit="s", range="> 0 or None"))
    sharded_receipts: bool = field(default=True, metadata=doc(
        "Send sharded and explicit-partition publishes to youzan nodes as PUB_TRACE / "
        "MPUB_TRACE (trace id 0 unless given) so their results carry the internal id and "
        "queue offset; False sends plain PUB / MPUB."))
    trace: bool | None = field(default=None, metadata=doc(
        "Client-side trace log (logger smartnsq.trace): True traces every publish (sent "
        "traced, one line each), None only those given a trace id, False none; "
        "set_trace() changes it at run time, per topic too.",
        range="True, False or None"))
    connection: ConnectionConfig = field(default_factory=ConnectionConfig, metadata=doc(
        "How connections to nsqd are opened (timeouts, TLS, compression, auth)."))
    classic: ClassicDialect | None = field(default=None, metadata=doc(
        "What youzan-only features become on classic nsqd: a "
        "smartnsq.compat.ClassicPolicy (None: its defaults, i.e. sharding keys placed on "
        "nodes by rendezvous hash, trace ids logged but not sent, headers refused).",
        range="ClassicPolicy or None"))
    migration: RouteChooser | ChooserFactory | None = field(default=None, metadata=doc(
        "Where publishes to a topic found on both a youzan and a classic cluster go: a "
        "smartnsq.compat.MigrationPolicy (prefer youzan, prefer classic, or a percentage "
        "to youzan). None: youzan.", range="MigrationPolicy, MigrationChooser or None"))

    def __post_init__(self) -> None:
        _positive("timeout", self.timeout)
        make_router(self.sharding)
        _size("max_msg_size", self.max_msg_size)
        _size("max_body_size", self.max_body_size)
        _positive("retry_delay", self.retry_delay)
        _positive("retry_delay_max", self.retry_delay_max)
        if self.retry_delay_max < self.retry_delay:
            raise InvalidArgument("retry_delay_max", "must be >= retry_delay",
                                  self.retry_delay_max)
        _positive("reconnect_delay", self.reconnect_delay)
        _positive("reconnect_delay_max", self.reconnect_delay_max)
        if self.reconnect_delay_max < self.reconnect_delay:
            raise InvalidArgument("reconnect_delay_max", "must be >= reconnect_delay",
                                  self.reconnect_delay_max)
        if self.idle_timeout is not None:
            _positive("idle_timeout", self.idle_timeout)
        if isinstance(self.drain_timeout, bool) \
                or not isinstance(self.drain_timeout, int | float) or not self.drain_timeout >= 0:
            raise InvalidArgument("drain_timeout", "must be a number of seconds >= 0",
                                  self.drain_timeout)
        if self.trace not in (True, False, None):
            raise InvalidArgument("trace", "must be True, False or None", self.trace)
        if not isinstance(self.sharded_receipts, bool):
            raise InvalidArgument("sharded_receipts", "must be a bool", self.sharded_receipts)
        if not isinstance(self.connection, ConnectionConfig):
            raise InvalidArgument("connection", "must be a ConnectionConfig", self.connection)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or math.isinf(value):
        raise InvalidArgument(name, "must be a positive, finite number of seconds", value)


def _size(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
        raise InvalidArgument(name, "must be an int in 1..2**31-1", value)


class _Record:
    """Slotted, read-only-by-convention result record (cheaper than a frozen dataclass)."""

    __slots__: tuple[str, ...] = ()
    FIELDS: tuple[str, ...] = ()  # in their constructor order

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Record)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"


class PublishResult(_Record):
    """What one acknowledged publish tells.

    ``partition`` is where it was written (``None``: no partition was named, as on classic
    nodes, and no receipt told). ``node`` is ``"host:port"`` of the nsqd that acknowledged it.
    The receipt fields (``internal_id``, ``trace_id``, ``queue_offset``, ``raw_size``) come
    from youzan's traced answer and are ``None`` after a plain ``OK``: traced publishes always
    have them, sharded and explicit-partition ones by default (``sharded_receipts``).
    ``attempts`` counts the sends (more than 1 after a retry).
    """

    FIELDS = ("topic", "partition", "node", "internal_id", "trace_id", "queue_offset",
              "raw_size", "attempts")
    __slots__ = ("attempts", "internal_id", "node", "partition", "queue_offset", "raw_size",
                 "topic", "trace_id")

    def __init__(self, topic: str, partition: int | None, node: str,
                 internal_id: int | None = None, trace_id: int | None = None,
                 queue_offset: int | None = None, raw_size: int | None = None,
                 attempts: int = 1) -> None:
        self.topic = topic
        self.partition = partition
        self.node = node
        self.internal_id = internal_id
        self.trace_id = trace_id
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.attempts = attempts

    @property
    def receipt(self) -> PublishReceipt | None:
        """The server's receipt, when it sent one."""
        if self.internal_id is None:
            return None
        return PublishReceipt(self.internal_id, self.trace_id or 0, self.queue_offset or 0,
                              self.raw_size or 0)


class BatchResult(_Record):
    """What an acknowledged batch (MPUB family) tells.

    With a receipt (MPUB_TRACE), ``internal_id`` and ``queue_offset`` are the first message's
    and ``raw_size`` covers the whole batch; the other ids follow consecutively.
    """

    FIELDS = ("topic", "partition", "node", "count", "internal_id", "queue_offset",
              "raw_size", "attempts")
    __slots__ = ("attempts", "count", "internal_id", "node", "partition", "queue_offset",
                 "raw_size", "topic")

    def __init__(self, topic: str, partition: int | None, node: str, count: int,
                 internal_id: int | None = None, queue_offset: int | None = None,
                 raw_size: int | None = None, attempts: int = 1) -> None:
        self.topic = topic
        self.partition = partition
        self.node = node
        self.count = count
        self.internal_id = internal_id
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.attempts = attempts


class _NoLeader(NSQError):
    """Internal: the wanted partition has no leader in the current routes."""


# how one publish is sent, decided per attempt from the target node's kind
_PUB, _PUB_TRACE, _PUB_EXT, _DPUB = "PUB", "PUB_TRACE", "PUB_EXT", "DPUB"
# a batch's per-message trace ids and encoded ext headers (``##trace_id`` already merged in)
_Batch = tuple[list[int] | None, list[bytes] | None]


class Producer:
    """Publishes to youzan NSQ (partitions, tracing, ext headers) and classic NSQ.

    ``async with Producer(lookupd=["127.0.0.1:4161"]) as producer:`` discovers nodes through
    nsqlookupd; ``nsqd=["127.0.0.1:4150"]`` writes to fixed nodes instead (classic nodes, or
    standalone youzan nodes, without partitions); ``source=`` takes any
    :class:`~smartnsq.pool.RouteSource`. Keyword ``options`` override ``config`` fields
    (``Producer(lookupd=..., timeout=5, sharding="java")``); ``lookup_options`` go to the
    lookup manager.
    """

    def __init__(self, lookupd: Sequence[str] | str | None = None,
                 nsqd: Sequence[str] | str | None = None, *,
                 config: ProducerConfig | None = None, source: RouteSource | None = None,
                 lookup: Any = None, lookup_options: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        config = config or ProducerConfig()
        if options:
            conn_fields = {f for f in ConnectionConfig.__dataclass_fields__}
            conn_opts = {k: options.pop(k) for k in list(options) if k in conn_fields
                         and k not in ProducerConfig.__dataclass_fields__}
            if conn_opts:
                options["connection"] = replace(config.connection, **conn_opts)
            unknown = set(options) - set(ProducerConfig.__dataclass_fields__)
            if unknown:
                raise InvalidArgument("Producer option", "unknown option", sorted(unknown))
            config = replace(config, **options)
        self._config = config
        given = sum(x is not None and x != [] for x in (lookupd, nsqd, source, lookup))
        if given != 1:
            raise InvalidArgument("Producer", "give exactly one of lookupd=, nsqd=, lookup= "
                                  "or source=")
        if source is None:
            if nsqd is not None:
                source = StaticRouteSource([nsqd] if isinstance(nsqd, str) else nsqd)
            else:
                source = LookupRouteSource(
                    [lookupd] if isinstance(lookupd, str) else lookupd, lookup=lookup,
                    options=dict(lookup_options or {}))
        self._source = source
        self._pool = PartitionPool(source, config.connection, idle_timeout=config.idle_timeout,
                                   reconnect_delay=config.reconnect_delay,
                                   reconnect_delay_max=config.reconnect_delay_max)
        self._router: Router = make_router(config.sharding)
        # built-in schemes know their key types; a user function judges its own keys
        self._key_check = isinstance(config.sharding, str)
        self.retry_count = 0  # attempts that failed and were retried (for metrics and tests)
        self._timeout = config.timeout
        self._max_msg = config.max_msg_size
        self._max_body = config.max_body_size
        self._receipts = config.sharded_receipts
        self._trace_default: bool | None = config.trace
        self._trace_topics: dict[str, bool | None] = {}
        self._rr: dict[str, int] = {}
        self._valid_topics: set[str] = set()
        self._request_timeout = config.connection.request_timeout
        self._names: dict[Address, str] = {}  # "host:port" of each address, built once
        self._classic: ClassicDialect = config.classic or DEFAULT_POLICY
        migration = config.migration
        if isinstance(migration, ChooserFactory):
            migration = migration.chooser()  # a compat MigrationPolicy: its route chooser
        self._migration: RouteChooser | None = migration
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # start() sets
        self._started = False
        self._closed = False
        self._on_wire = 0  # publishes written and not answered yet
        self._drained: asyncio.Future[None] | None = None  # close() waits on it
        self._tasks: set[asyncio.Task[PublishResult]] = set()  # publish_nowait slow paths
        self._slow: dict[str, int] = {}  # topic -> its publish_nowait slow paths running

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> Producer:
        if self._closed:
            raise RuntimeError("a closed Producer cannot start again")
        if not self._started:
            self._started = True
            self._loop = asyncio.get_running_loop()
            await self._pool.start()
        return self

    async def close(self, timeout: float | None = None) -> None:
        """Stop publishing, let what is on the wire be answered, close connections.

        New publishes, and retries of pending ones, fail at once with ``ConnectionError_``;
        publishes already written get up to ``timeout`` seconds (default
        ``config.drain_timeout``) for their answers, since the server may have accepted them
        and failing them invites a duplicate. What is still unanswered then fails.
        """
        if self._closed:
            return
        self._closed = True
        if timeout is None:
            timeout = self._config.drain_timeout
        if self._on_wire and timeout > 0:
            waiter = self._drained = self._loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except asyncio.TimeoutError:
                log.warning("%d publishes still unanswered after %gs; failing them",
                            self._on_wire, timeout)
        await self._pool.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def config(self) -> ProducerConfig:
        return self._config

    @property
    def pool(self) -> PartitionPool:
        return self._pool

    @property
    def closed(self) -> bool:
        return self._closed

    async def routes(self, topic: str) -> TopicRoutes:
        """The topic's current routes (looked up if unknown): partition_num, leaders, meta."""
        self._check_topic(topic)
        await self._ensure_started()
        return await self._pool.load_routes(topic)

    # -- tracing switches --------------------------------------------------------------------

    def set_trace(self, enabled: bool | None, topic: str | None = None) -> None:
        """Switch the client-side trace log, for every topic or for one, at any time.

        ``True``: every publish is sent traced and logged on ``smartnsq.trace``; ``None``:
        only publishes given a ``trace_id`` are logged; ``False``: none are. A topic's own
        setting wins over the producer's; ``set_trace(None, topic)`` makes the topic follow
        the producer's setting again.
        """
        if enabled not in (True, False, None):
            raise InvalidArgument("trace", "must be True, False or None", enabled)
        if topic is None:
            self._trace_default = enabled
        else:
            self._check_topic(topic)
            if enabled is None:
                self._trace_topics.pop(topic, None)
            else:
                self._trace_topics[topic] = enabled

    def trace_enabled(self, topic: str) -> bool | None:
        """The trace setting in force for ``topic``."""
        return self._trace_topics.get(topic, self._trace_default)

    # -- publishing ---------------------------------------------------------------------------

    async def publish(self, topic: str, body: bytes, *, sharding_key: ShardingKey | None = None,
                      partition: int | None = None, trace_id: int | None = None,
                      headers: Mapping[str, str] | None = None, delay: float | None = None,
                      timeout: float | None = None) -> PublishResult:
        """Publish one message and wait for the server's acknowledgement.

        ``body``: non-empty bytes up to ``max_msg_size``. ``sharding_key`` or ``partition``
        pin the partition (see the module docstring). ``trace_id`` (uint64) sends it traced
        (PUB_TRACE, or ``##trace_id`` in the JSON header when ``headers`` are given: PUB_EXT;
        youzan only). ``headers``: ext JSON headers (str -> str; ext topics only). ``delay``:
        seconds before delivery (DPUB, classic nodes only). ``timeout``: the whole call's
        deadline (``config.timeout`` by default).

        Raises ``InvalidArgument`` before anything is sent, ``NonRetriableServerError`` when
        the server refuses the message, ``TopicNotFound``, or ``Timeout``.
        """
        body, ext, delay_ms = self._check_one(topic, body, sharding_key, partition, trace_id,
                                              headers, delay)
        if not self._started:
            await self._ensure_started()
        return await self._send(topic, body, None, sharding_key, partition, trace_id, ext,
                                delay_ms, timeout)  # type: ignore[return-value]

    def _check_one(self, topic: str, body: bytes, sharding_key: ShardingKey | None,
                   partition: int | None, trace_id: int | None,
                   headers: Mapping[str, str] | None, delay: float | None,
                   ) -> tuple[bytes, bytes | None, int | None]:
        """Validate one publish's arguments (before anything is sent): the body as sent, the
        encoded ext header (or None) and the delay in ms (or None)."""
        if topic not in self._valid_topics:
            self._check_topic(topic)
        if body.__class__ is not bytes or not 0 < len(body) <= self._max_msg:
            body = v.check_body(body, self._max_msg)
        if trace_id is not None:
            v.check_trace_id(trace_id)
        ext = None if headers is None else self._check_headers(headers, trace_id)
        delay_ms = None if delay is None else _delay_ms(delay)
        if partition is not None:
            v.check_partition(partition)
            if sharding_key is not None:
                raise InvalidArgument("partition", "give sharding_key or partition, not both",
                                      partition)
        elif sharding_key is not None and self._key_check:
            key_bytes(sharding_key)
        return body, ext, delay_ms

    def publish_nowait(self, topic: str, body: bytes, *,
                       sharding_key: ShardingKey | None = None, partition: int | None = None,
                       trace_id: int | None = None, headers: Mapping[str, str] | None = None,
                       delay: float | None = None, timeout: float | None = None,
                       ) -> asyncio.Future[PublishResult]:
        """Publish one message and return a future of its ``PublishResult``, without a task.

        The way to have many publishes in flight: ``await asyncio.gather(*futures)`` (or
        await each) instead of gathering ``publish()`` coroutines, which costs a Task each,
        more than the publish itself. Same arguments, routing, retries, deadline, tracing,
        results and errors as :meth:`publish`; call it on the producer's event loop.

        ``InvalidArgument`` for the arguments themselves raises here, before anything is
        sent; what only the topic's routes can tell (an ordered topic without key or
        partition, a partition beyond ``partition_num``, headers on a non-ext topic...)
        fails the future, as ``publish()`` raises it after the lookup. When the producer is
        started, the topic's routes are known and the target's connection is open, the
        message is written right away and the future settles from the connection's answer;
        otherwise (and after a retriable failure of that first attempt) ``publish()``'s own
        retry loop runs in a task and settles the future. Cancelling the future abandons the
        publish the way cancelling ``publish()`` does.
        """
        body, ext, delay_ms = self._check_one(topic, body, sharding_key, partition, trace_id,
                                              headers, delay)
        if timeout is None:
            timeout = self._timeout
        elif isinstance(timeout, bool) or not isinstance(timeout, int | float) \
                or not timeout > 0:
            raise InvalidArgument("timeout", "must be a positive number of seconds", timeout)
        if not self._started or self._closed:
            return self._later(asyncio.get_running_loop(), topic, body, sharding_key,
                               partition, trace_id, ext, delay_ms, timeout)
        loop = self._loop
        pool = self._pool
        routes = pool.routes(topic)
        if routes is None or topic in self._slow:
            # (while earlier calls for the topic are on the slow path, later ones queue
            # behind them rather than overtake them on the wire)
            return self._later(loop, topic, body, sharding_key, partition, trace_id, ext,
                               delay_ms, timeout)
        result: asyncio.Future[PublishResult] = loop.create_future()
        try:
            routes, target, address = self._route(routes, topic, sharding_key, partition)
            if ext is not None or trace_id is not None or delay_ms is not None:
                self._check_early(routes, ext, None, trace_id, delay_ms)
            conn = None if address is None else pool.connection(address)
            if conn is None or conn.writing_paused:
                return self._later(loop, topic, body, sharding_key, partition, trace_id, ext,
                                   delay_ms, timeout, result)
            data, command, traced = self._encode_one(
                conn, routes, topic, target, body, sharding_key is not None
                or partition is not None, trace_id, ext, delay_ms)
        except Exception as exc:  # what publish() would raise once it has the routes
            result.set_exception(exc)
            return result
        assert address is not None
        deadline = loop.time() + timeout
        request_timeout = self._request_timeout
        remaining = timeout
        if request_timeout is not None and request_timeout < remaining:
            remaining = request_timeout
        try:
            answer_future = conn.submit(data, command, remaining)
        except ConnectionError_:  # closed since the pool handed it out: the slow path
            return self._later(loop, topic, body, sharding_key, partition, trace_id, ext,
                               delay_ms, timeout, result)
        self._on_wire += 1

        # a partial of a method, not a closure: no cell per local on this hot path
        answer_future.add_done_callback(partial(
            self._answered, result, topic, target, address, traced, trace_id, body,
            (sharding_key, partition, ext, delay_ms, timeout, deadline, command)))
        return result

    def _answered(self, result: asyncio.Future[PublishResult], topic: str, target: int | None,
                  address: Address, traced: bool, trace_id: int | None, body: bytes,
                  retry: tuple[ShardingKey | None, int | None, bytes | None, int | None,
                               float, float, str],
                  answer_future: asyncio.Future[bytes]) -> None:
        """A publish_nowait's fast-path answer: settle its future, or go on retrying."""
        self._on_wire -= 1
        if self._drained is not None and not self._on_wire and not self._drained.done():
            self._drained.set_result(None)
        # read even when the caller gave up (no "exception never retrieved")
        error: BaseException | None = (
            ConnectionClosed(f"{retry[6]} to {address[0]}:{address[1]} abandoned")
            if answer_future.cancelled() else answer_future.exception())
        if result.done():  # cancelled by the caller: the answer is discarded
            return
        if error is None:
            try:
                if not traced and trace_id is None and self._trace_default is not True \
                        and not self._trace_topics:
                    name = self._names.get(address)
                    if name is None:
                        name = self._names[address] = f"{address[0]}:{address[1]}"
                    result.set_result(PublishResult(topic, target, name, None, None, None,
                                                    None, 1))
                else:
                    result.set_result(self._result(  # type: ignore[arg-type]
                        topic, target, address, answer_future.result(), traced, 1, None, body,
                        trace_id))
            except Exception as exc:  # an unreadable receipt
                result.set_exception(exc)
            return
        sharding_key, partition, ext, delay_ms, timeout, deadline, _ = retry
        self._retry_later(error, result, topic, body, sharding_key, partition, trace_id, ext,
                          delay_ms, timeout, deadline, target, address)

    def _retry_later(self, error: BaseException, result: asyncio.Future[PublishResult],
                     topic: str, body: bytes, sharding_key: ShardingKey | None,
                     partition: int | None, trace_id: int | None, ext: bytes | None,
                     delay_ms: int | None, timeout: float, deadline: float,
                     target: int | None, address: Address) -> None:
        """A publish_nowait's first attempt failed: what ``_send`` does after a failed
        attempt, then its loop from attempt 2."""
        backoff = False
        if isinstance(error, ServerError):
            if error.action is Action.GIVE_UP:
                result.set_exception(error)
                return
            if error.action is Action.REFRESH_AND_RETRY:
                self._pool.leader_failed(topic, target, address)
            backoff = True
        elif isinstance(error, Timeout):
            if self._loop.time() >= deadline:
                timed_out = self._timeout_error(topic, timeout, error)
                timed_out.__cause__ = error
                result.set_exception(timed_out)
                return
        elif not isinstance(error, ConnectionError_):
            result.set_exception(error)
            return
        self._later(self._loop, topic, body, sharding_key, partition, trace_id, ext, delay_ms,
                    timeout, result, deadline, error, backoff)

    def _later(self, loop: asyncio.AbstractEventLoop, topic: str, body: bytes,
               sharding_key: ShardingKey | None, partition: int | None,
               trace_id: int | None, ext: bytes | None, delay_ms: int | None,
               timeout: float, result: asyncio.Future[PublishResult] | None = None,
               deadline: float | None = None, error: BaseException | None = None,
               backoff: bool = False) -> asyncio.Future[PublishResult]:
        """The slow path of publish_nowait: publish()'s retry loop in a task, settling
        ``result`` (a new future if None)."""
        if result is None:
            result = loop.create_future()
        task = loop.create_task(self._publish_later(
            topic, body, sharding_key, partition, trace_id, ext, delay_ms, timeout, deadline,
            error, backoff))
        self._tasks.add(task)
        slow = self._slow
        slow[topic] = slow.get(topic, 0) + 1

        def finished(task: asyncio.Task[PublishResult]) -> None:
            self._tasks.discard(task)
            left = slow[topic] - 1
            if left:
                slow[topic] = left
            else:
                del slow[topic]
            if task.cancelled():
                if not result.done():
                    result.cancel()
                return
            error = task.exception()
            if result.done():
                return
            if error is None:
                result.set_result(task.result())
            else:
                result.set_exception(error)

        def abandoned(result: asyncio.Future[PublishResult]) -> None:
            if result.cancelled():
                task.cancel()

        task.add_done_callback(finished)
        result.add_done_callback(abandoned)
        return result

    async def _publish_later(self, topic: str, body: bytes, sharding_key: ShardingKey | None,
                             partition: int | None, trace_id: int | None, ext: bytes | None,
                             delay_ms: int | None, timeout: float, deadline: float | None,
                             error: BaseException | None, backoff: bool) -> PublishResult:
        if error is None:  # nothing sent yet: exactly publish() after its validation
            if not self._started:
                await self._ensure_started()
            return await self._send(topic, body, None, sharding_key, partition,  # type: ignore[return-value]
                                    trace_id, ext, delay_ms, timeout)
        assert deadline is not None
        if backoff:
            await self._backoff(topic, 1, deadline, error)
        return await self._send(topic, body, None, sharding_key, partition,  # type: ignore[return-value]
                                trace_id, ext, delay_ms, timeout, deadline=deadline, attempt=1,
                                last_error=error)

    async def publish_many(self, topic: str, bodies: Iterable[bytes], *,
                           sharding_key: ShardingKey | None = None,
                           partition: int | None = None,
                           trace_id: int | Sequence[int] | None = None,
                           headers: Mapping[str, str] | Sequence[Mapping[str, str] | None]
                           | None = None,
                           timeout: float | None = None) -> BatchResult:
        """Publish a batch to one partition in one command (MPUB, MPUB_TRACE or MPUB_EXT).

        The batch is written all at once or not at all. ``trace_id``: one id for every message
        or one per message; ``headers``: one mapping for all or one (or ``None``) per message.
        The batch must fit ``max_body_size``; split bigger ones yourself.
        """
        if topic not in self._valid_topics:
            self._check_topic(topic)
        items = list(bodies)
        if not items:
            raise InvalidArgument("bodies", "a batch needs at least one message", items)
        max_msg = self._max_msg
        total = 4
        for i, body in enumerate(items):
            if body.__class__ is not bytes or not 0 < len(body) <= max_msg:
                items[i] = body = v.check_body(body, max_msg, f"bodies[{i}]")
            total += 4 + len(body)
        traces: list[int] | None = None
        if trace_id is not None:
            if isinstance(trace_id, int):
                traces = [v.check_trace_id(trace_id)] * len(items)
            else:
                traces = [v.check_trace_id(t) for t in trace_id]
                if len(traces) != len(items):
                    raise InvalidArgument("trace_id", f"needs one id per message ({len(items)})",
                                          f"<{len(traces)} ids>")
        exts = None if headers is None else self._batch_exts(headers, traces, len(items))
        if traces is not None:
            total += 8 * len(items)
        if total > self._max_body:
            raise InvalidArgument("bodies", f"batch size {total} exceeds max_body_size "
                                  f"{self._max_body}", f"<{len(items)} messages>")
        if partition is not None:
            v.check_partition(partition)
            if sharding_key is not None:
                raise InvalidArgument("partition", "give sharding_key or partition, not both",
                                      partition)
        elif sharding_key is not None and self._key_check:
            key_bytes(sharding_key)
        if not self._started:
            await self._ensure_started()
        return await self._send(topic, items, (traces, exts), sharding_key,  # type: ignore[return-value]
                                partition, None, None, None, timeout)

    # -- the retry loop ---------------------------------------------------------------------

    async def _send(self, topic: str, payload: bytes | list[bytes],
                    batch: _Batch | None,
                    sharding_key: ShardingKey | None, partition: int | None,
                    trace_id: int | None, ext: bytes | None,
                    delay_ms: int | None, timeout: float | None, *,
                    deadline: float | None = None, attempt: int = 0,
                    last_error: BaseException | None = None) -> PublishResult | BatchResult:
        # ``deadline``/``attempt``/``last_error``: go on after attempts already made (a
        # publish_nowait whose fast-path attempt failed), as if this loop had made them
        if self._closed and not attempt:
            raise ConnectionError_("the producer is closed")
        pool = self._pool
        loop = self._loop
        if timeout is None:
            timeout = self._timeout
        elif isinstance(timeout, bool) or not isinstance(timeout, int | float) \
                or not timeout > 0:
            raise InvalidArgument("timeout", "must be a positive number of seconds", timeout)
        if deadline is None:
            deadline = loop.time() + timeout
        request_timeout = self._request_timeout
        special = batch is not None or ext is not None or trace_id is not None \
            or delay_ms is not None
        while True:
            attempt += 1
            if attempt > 1:
                if self._closed:  # closing: no new attempt (the last one was not accepted)
                    raise ConnectionError_("the producer is closed") from last_error
                self.retry_count += 1
            routes = pool.routes(topic)
            if routes is None:
                try:
                    routes = await self._load_routes(topic, deadline)
                except (LookupFailed, Timeout) as exc:
                    if isinstance(exc, TopicNotFound):
                        raise
                    last_error = exc
                    await self._backoff(topic, attempt, deadline, last_error)
                    continue
            routes, target, address = self._route(routes, topic, sharding_key, partition)
            if special:
                self._check_early(routes, ext, batch, trace_id, delay_ms)
            if address is None:
                last_error = _NoLeader(
                    f"partition {target} of {topic!r} has no leader now" if target is not None
                    else f"no node can take {topic!r} now")
                pool.refresh(topic)
                await self._backoff(topic, attempt, deadline, last_error)
                continue
            # -- the connection
            # (a connection closed since is caught by submit: ConnectionClosed, retried)
            conn = pool.connection(address)
            if conn is None:
                try:
                    conn = await pool.acquire(address, deadline - loop.time())
                except NodeBackoff as exc:
                    last_error = exc
                    await self._backoff(topic, attempt, deadline, exc, exc.retry_in)
                    continue
                except (ConnectionError_, Timeout, ServerError, OSError) as exc:
                    if isinstance(exc, ServerError) and exc.action is Action.GIVE_UP:
                        raise  # handshake refused: auth, identify... not going to change
                    last_error = exc
                    await self._backoff(topic, attempt, deadline, exc)
                    continue
            # -- encode and send
            if batch is None:
                data, command, traced = self._encode_one(
                    conn, routes, topic, target, payload, sharding_key is not None  # type: ignore[arg-type]
                    or partition is not None, trace_id, ext, delay_ms)
            else:
                data, command, traced = self._encode_batch(
                    conn, routes, topic, target, payload, sharding_key is not None  # type: ignore[arg-type]
                    or partition is not None, batch)
            remaining = timeout if attempt == 1 else deadline - loop.time()
            if request_timeout is not None and request_timeout < remaining:
                remaining = request_timeout
            try:
                if conn.writing_paused:
                    await conn.drain()
                if self._closed:  # closing: nothing new goes on the wire
                    raise _ProducerClosed("the producer is closed")
                answer_future = conn.submit(data, command, remaining)
                self._on_wire += 1
                try:
                    if conn.pending_count == 1:
                        # nothing else in flight: write now rather than at the end of this
                        # loop iteration (saves a round of the loop per one-at-a-time
                        # publish; in a burst only the first publish does this, the rest
                        # still coalesce)
                        with contextlib.suppress(ConnectionError_):
                            await conn.drain()  # a failure is also in answer_future
                    answer = await answer_future
                finally:
                    self._on_wire -= 1
                    if self._drained is not None and not self._on_wire \
                            and not self._drained.done():
                        self._drained.set_result(None)
            except ServerError as exc:
                action = exc.action
                if action is Action.GIVE_UP:
                    raise
                last_error = exc
                if action is Action.REFRESH_AND_RETRY:
                    pool.leader_failed(topic, target, address)
                await self._backoff(topic, attempt, deadline, exc)
                continue
            except ConnectionError_ as exc:
                if exc.__class__ is _ProducerClosed:
                    raise
                last_error = exc
                if attempt > 1:  # the first loss retries at once on a fresh connection
                    await self._backoff(topic, attempt - 1, deadline, exc)
                continue
            except Timeout as exc:
                last_error = exc
                if loop.time() >= deadline:
                    raise self._timeout_error(topic, timeout, exc) from exc
                continue  # the connection closed itself; try a fresh one
            if not traced and batch is None and trace_id is None \
                    and self._trace_default is not True and not self._trace_topics:
                # plain OK, nothing to log: the common case
                name = self._names.get(address)
                if name is None:
                    name = self._names[address] = f"{address[0]}:{address[1]}"
                return PublishResult(topic, target, name, None, trace_id, None, None, attempt)
            return self._result(topic, target, address, answer, traced, attempt, batch,
                                payload, trace_id)

    def _route(self, routes: TopicRoutes, topic: str, sharding_key: ShardingKey | None,
               partition: int | None,
               ) -> tuple[TopicRoutes, int | None, Address | None]:
        """Where this attempt goes: (routes, partition or None, leader address or None).

        Raises ``InvalidArgument`` for what the routes say is wrong with the call.
        """
        if routes.nodes and routes.partitioned and self._migration is not None:
            # a topic on a youzan and a classic cluster: the compat chooser picks a side
            routes = self._migration.choose(routes, sharding_key)
        # -- pick the target
        target: int | None
        address: Address | None
        if sharding_key is not None:
            if not routes.partitioned:
                # classic (or partition-less) nodes: the same key, the same node
                target = None
                address = self._classic.node_for_key(sharding_key, routes.nodes, topic)
            elif routes.partition_num <= 0:
                raise InvalidArgument("sharding_key", f"topic {topic!r} has no partition "
                                      "count in lookup (standalone nodes); sharding "
                                      "needs one", sharding_key)
            else:
                target = self._router(sharding_key, routes.partition_num)
                address = routes.leaders.get(target)
        elif partition is not None:
            if not routes.partitioned:
                raise InvalidArgument("partition", f"topic {topic!r} has no partitions "
                                      "(classic or standalone nodes)", partition)
            if routes.partition_num and partition >= routes.partition_num:
                raise InvalidArgument("partition", f"topic {topic!r} has "
                                      f"{routes.partition_num} partitions "
                                      f"(0..{routes.partition_num - 1})", partition)
            target = partition
            address = routes.leaders.get(target)
        else:
            if routes.ordered:
                raise InvalidArgument("partition", f"topic {topic!r} is ordered: publish "
                                      "with a sharding_key or a partition", None)
            targets = routes.targets
            if targets:
                index = self._rr.get(topic, 0)
                self._rr[topic] = index + 1
                target, address = targets[index % len(targets)]
            else:
                target, address = None, None
        return routes, target, address

    async def _load_routes(self, topic: str, deadline: float) -> TopicRoutes:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise Timeout(f"no routes for {topic!r} before the deadline")
        try:
            return await asyncio.wait_for(self._pool.load_routes(topic), remaining)
        except asyncio.TimeoutError:
            raise Timeout(f"lookup of {topic!r} took longer than the publish deadline") \
                from None

    async def _backoff(self, topic: str, attempt: int, deadline: float,
                       error: BaseException, at_least: float = 0.0) -> None:
        """Wait before the next attempt: a jittered, doubling delay, cut short by a route change.

        Raises ``Timeout`` (caused by ``error``) when the deadline leaves no time for another
        attempt.
        """
        cfg = self._config
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise self._timeout_error(topic, None, error) from error
        delay = max(exponential_delay(cfg.retry_delay, cfg.retry_delay_max, attempt, 0.5),
                    at_least)
        log.debug("publish to %r: attempt %d failed (%s); next in %.3fs", topic, attempt, error,
                  min(delay, remaining))
        if delay >= remaining:
            await asyncio.sleep(remaining)
            raise self._timeout_error(topic, None, error) from error
        if at_least:
            await asyncio.sleep(delay)  # a node in back-off: a route change does not help
        else:
            await self._pool.changed(topic, delay)
        if self._closed:
            raise ConnectionError_("the producer is closed") from error

    def _timeout_error(self, topic: str, timeout: float | None,
                       error: BaseException) -> Timeout:
        within = f" within {timeout:g}s" if timeout is not None else " before its deadline"
        return Timeout(f"publish to {topic!r} not acknowledged{within}; last error: {error}")

    # -- encoding -----------------------------------------------------------------------------

    def _check_early(self, routes: TopicRoutes, ext: bytes | None,
                     batch: _Batch
                     | None, trace_id: int | None, delay_ms: int | None) -> None:
        """What the routes already tell is wrong, before connecting anywhere."""
        has_headers = ext is not None or (batch is not None and batch[1] is not None)
        if routes.youzan:
            if delay_ms is not None:
                raise InvalidArgument("delay", f"youzan nsqd has no deferred publish (DPUB); "
                                      f"topic {routes.topic!r} is on youzan nodes", delay_ms)
            if has_headers and not routes.ext and routes.partition_num:
                raise InvalidArgument("headers", f"topic {routes.topic!r} is not an ext topic "
                                      "(lookup meta extend_support is false)", "<headers>")
        elif routes.youzan is False and has_headers:
            self._classic.classic_headers(routes.topic)
        # trace ids on classic nodes: sent plain, logged client-side (compat ClassicPolicy)

    def _encode_one(self, conn: Connection, routes: TopicRoutes, topic: str,
                    target: int | None, body: bytes, pinned: bool, trace_id: int | None,
                    ext: bytes | None,
                    delay_ms: int | None) -> tuple[bytes, str, bool]:
        # everything was validated once in publish(): the unchecked encoders skip it
        if conn.is_youzan:
            if delay_ms is not None:
                raise InvalidArgument("delay", f"{conn.address_text} is a youzan nsqd, which "
                                      "has no deferred publish (DPUB)", delay_ms)
            if ext is not None:  # ##trace_id already merged in by _check_headers
                return (commands.pub_ext_unchecked(topic, body, ext, target), _PUB_EXT,
                        trace_id is not None)
            if trace_id is not None or (pinned and self._receipts) or \
                    self._trace_topics.get(topic, self._trace_default):
                return (commands.pub_trace_unchecked(topic, body, trace_id or 0, target),
                        _PUB_TRACE, True)
            return commands.pub_unchecked(topic, body, target), _PUB, False
        if ext is not None:
            self._classic.classic_headers(topic, conn.address_text)  # raises or drops
        if delay_ms is not None:
            return commands.dpub_unchecked(topic, delay_ms, body), _DPUB, False
        return commands.pub_unchecked(topic, body, None), _PUB, False

    def _encode_batch(self, conn: Connection, routes: TopicRoutes, topic: str,
                      target: int | None, bodies: list[bytes], pinned: bool,
                      batch: _Batch,
                      ) -> tuple[bytes, str, bool]:
        traces, exts = batch
        max_body = self._max_body
        if conn.is_youzan:
            if exts is not None:
                return (commands.mpub_ext_unchecked(topic, zip(exts, bodies, strict=True),
                                                    target, max_body), "MPUB_EXT", False)
            if traces is not None or (pinned and self._receipts) or \
                    self._trace_topics.get(topic, self._trace_default):
                ids = traces if traces is not None else [0] * len(bodies)
                return (commands.mpub_trace_unchecked(topic, zip(ids, bodies, strict=True),
                                                      target, max_body), "MPUB_TRACE", True)
            return commands.mpub_unchecked(topic, bodies, target, max_body), "MPUB", False
        if exts is not None:
            self._classic.classic_headers(topic, conn.address_text)  # raises or drops
        return commands.mpub_unchecked(topic, bodies, None, max_body), "MPUB", False

    def _result(self, topic: str, target: int | None, address: Address, answer: bytes,
                traced: bool, attempts: int,
                batch: _Batch | None,
                payload: bytes | list[bytes], trace_id: int | None,
                ) -> PublishResult | BatchResult:
        receipt = parse_publish_response(answer) if traced or answer != b"OK" else None
        node = f"{address[0]}:{address[1]}"
        partition = target
        if receipt is not None and partition is None:
            partition = receipt.partition
        mode = self._trace_topics.get(topic, self._trace_default)
        if batch is not None:
            count = len(payload)
            if mode or (mode is None and batch[0] is not None):
                self._trace_line("MPUB", topic, partition, node, receipt, None, count)
            if receipt is None:
                return BatchResult(topic, partition, node, count, attempts=attempts)
            return BatchResult(topic, partition, node, count, receipt.internal_id,
                               receipt.queue_offset, receipt.raw_size, attempts)
        if mode or (mode is None and trace_id is not None):
            self._trace_line("PUB", topic, partition, node, receipt, trace_id, 1)
        if receipt is None:
            return PublishResult(topic, partition, node, None,
                                 trace_id, None, None, attempts)
        return PublishResult(topic, partition, node, receipt.internal_id, receipt.trace_id,
                             receipt.queue_offset, receipt.raw_size, attempts)

    @staticmethod
    def _trace_line(kind: str, topic: str, partition: int | None, node: str,
                    receipt: PublishReceipt | None, trace_id: int | None, count: int) -> None:
        if not tracing.enabled():
            return
        if receipt is None:
            tracing.line(kind, "no receipt", topic=topic, partition=partition, node=node,
                       trace_id=trace_id, count=count)
            return
        tracing.line(kind, topic=topic, partition=partition, node=node,
                   internal_id=receipt.internal_id,
                   trace_id=receipt.trace_id if trace_id is None else trace_id,
                   queue_offset=receipt.queue_offset, raw_size=receipt.raw_size, count=count)

    # -- validation helpers -------------------------------------------------------------------

    def _check_topic(self, topic: str) -> None:
        v.check_topic(topic)
        if len(self._valid_topics) < 10_000:
            self._valid_topics.add(topic)

    def _check_headers(self, headers: Mapping[str, str], trace_id: int | None) -> bytes:
        """Validate and encode once (with ``##trace_id`` merged in): the bytes are both the
        size check (the ext length is 16 bits) and what goes on the wire."""
        if not isinstance(headers, Mapping):
            raise InvalidArgument("headers", "must be a mapping of str to str", headers)
        if trace_id is not None:
            given = headers.get(TRACE_ID_HEADER)
            if given is not None and given != str(trace_id):
                raise InvalidArgument("headers", f"'{TRACE_ID_HEADER}' disagrees with trace_id",
                                      given)
            headers = {**headers, TRACE_ID_HEADER: str(trace_id)}
        return commands.encode_headers(headers)

    def _batch_exts(self, headers: Mapping[str, str] | Sequence[Mapping[str, str] | None],
                    traces: list[int] | None, count: int) -> list[bytes]:
        """Each message's encoded ext header: a mapping shared by the batch (or repeated in
        the list) is encoded once; per-message trace ids are spliced into those bytes."""
        if isinstance(headers, Mapping):
            mappings: list[Mapping[str, str] | None] = [headers] * count
        else:
            mappings = list(headers)
            if len(mappings) != count:
                raise InvalidArgument("headers", f"needs one mapping per message ({count})",
                                      f"<{len(mappings)} mappings>")
        encoded: dict[int, bytes] = {}
        exts: list[bytes] = []
        for i, mapping in enumerate(mappings):
            if mapping is None:
                ext = b"{}"
            else:
                cached = encoded.get(id(mapping))
                if cached is None:
                    cached = encoded[id(mapping)] = self._check_headers(mapping, None)
                ext = cached
            if traces is not None:
                if mapping is not None and TRACE_ID_HEADER in mapping:
                    # the per-message id replaces the mapping's own: encode this one whole
                    ext = commands.encode_headers({**mapping,
                                                   TRACE_ID_HEADER: str(traces[i])})
                else:
                    ext = commands.ext_with_trace(ext, traces[i])
            exts.append(ext)
        return exts

    async def _ensure_started(self) -> None:
        if self._closed:
            raise ConnectionError_("the producer is closed")
        if not self._started:
            await self.start()


class _ProducerClosed(ConnectionError_):
    """close() began before this publish was written: it fails, nothing was sent."""


def _delay_ms(delay: float) -> int:
    if isinstance(delay, bool) or not isinstance(delay, int | float) or math.isnan(delay) \
            or delay < 0:
        raise InvalidArgument("delay", "must be a non-negative number of seconds", delay)
    ms = round(delay * 1000)
    if ms > _MAX_DELAY_MS:
        raise InvalidArgument("delay", "too long", delay)
    return ms
