"""The asyncio Producer: the public calls and the thin I/O shell around the decisions.

One publish is: validate (``validation``), pick the target from the topic's current routes
(``routing``), encode (``encoding``), append to the target connection's write buffer, await
one future. No task, lock or timer per publish: the connection coalesces every command queued
in one event-loop iteration into one socket write, so a thousand concurrent publishes cost a
handful of syscalls, and its single deadline timer covers every call in flight.

After a failed attempt, ``retry.decide`` says what next, for every call alike. Each call has
one deadline (``timeout``) for all it does; past it the call raises ``Timeout`` (its
``__cause__`` is the last failure). Delivery is therefore at least once: a publish whose
connection died after the server wrote it but before the answer arrived is sent again and
stored twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from ..config import ConnectionConfig, close_timeout, keyword_options
from ..discovery.nodes import NodePool
from ..errors import (
    ClientClosed,
    ConnectionFailed,
    InvalidArgument,
    NoLeader,
    NotWritable,
    ProducerClosed,
    ServerError,
    Timeout,
    TopicNotFound,
)
from ..model.dialect import DEFAULT_POLICY, ChooserFactory, ClassicDialect, RouteChooser
from ..model.routes import Address, RouteSource, StaticRouteSource, TopicRoutes, address_text
from ..model.sharding import Router, ShardingKey, make_router
from ..observability import otel, otel_metrics
from ..observability.counters import PublishMeter
from ..observability.logs import summary
from ..protocol import commands
from ..transport.connection import Connection
from .config import ProducerConfig, with_options
from .encoding import MPUB, compress_body, encode_batch, encode_one
from .linger import LINGER_TIMEOUTS, Batch
from .request import BatchRequest, NowaitRequest, Request
from .results import BatchResult, PublishResult, Results
from .retry import (
    CONNECT,
    ROUTE,
    SEND,
    Decision,
    Lookup,
    Next,
    answer_deadline,
    decide,
    least_time,
    missing_topic,
    timed_out,
    topic_gone,
)
from .routing import check_features, choose_side, choose_target, route_source
from .validation import Checks, timeout_seconds

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..observability.stats import ProducerStats
    from .options import ProducerOptions

__all__ = ["Producer"]

log = logging.getLogger("smartnsq.producer")


@keyword_options(ProducerConfig, ConnectionConfig)
class Producer:
    """Publishes to youzan NSQ (partitions, tracing, ext headers) and classic NSQ.

    ``async with Producer(lookupd=["127.0.0.1:4161"]) as producer:`` discovers nodes through
    nsqlookupd; ``nsqd=["127.0.0.1:4150"]`` writes to fixed nodes instead (classic nodes, or
    standalone youzan nodes, without partitions); ``source=`` takes any RouteSource. Keywords
    override ``config``'s fields (``timeout=5, sharding="java"``: every option is listed
    below); ``lookup_options`` go to the lookup manager. ``tracer_provider``: OpenTelemetry
    spans per publish (``smartnsq.observability.otel``); ``meter_provider``: its messaging
    metrics (``smartnsq.observability.otel_metrics``)."""

    def __init__(self, lookupd: Sequence[str] | str | None = None,
                 nsqd: Sequence[str] | str | None = None, *,
                 config: ProducerConfig | None = None, source: RouteSource | None = None,
                 lookup: Any = None, lookup_options: Mapping[str, Any] | None = None,
                 tracer_provider: Any = None, meter_provider: Any = None,
                 **options: Unpack[ProducerOptions]) -> None:
        if config is not None and not isinstance(config, ProducerConfig):
            raise InvalidArgument("config", "must be a ProducerConfig", config)
        self._config = config = with_options(config or ProducerConfig(), options, Producer.__init__)
        self._source = source = route_source(lookupd, nsqd, source, lookup, lookup_options)
        self._pool = NodePool(source, config.connection, idle_timeout=config.idle_timeout,
                                   reconnect_delay=config.reconnect_delay,
                                   reconnect_delay_max=config.reconnect_delay_max)
        self._router: Router = make_router(config.sharding)
        self._checks = Checks(config.max_msg_size, config.max_body_size,
                              isinstance(config.sharding, str))
        self.retry_count = 0  # attempts that failed and were retried (for metrics and tests)
        self._meter = PublishMeter()  # per (topic, partition), for stats()
        self._now = time.monotonic  # the loop's clock, cheaply (start() sets it)
        self._timeout = config.timeout
        self._receipts = config.sharded_receipts
        self._compress = config.compress
        self._trace_default: bool | None = config.trace
        self._trace_topics: dict[str, bool | None] = {}
        self._rr: dict[str, int] = {}
        self._request_timeout = config.connection.request_timeout
        self._results = Results()  # makes every PublishResult/BatchResult
        self._classic: ClassicDialect = config.classic or DEFAULT_POLICY
        migration = config.migration
        if isinstance(migration, ChooserFactory):
            migration = migration.chooser()  # a compat MigrationPolicy: its route chooser
        self._migration: RouteChooser | None = migration
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # start() sets
        self._started = False
        self._starting: asyncio.Task[None] | None = None  # the one start, shared by callers
        self._closed = False
        self._on_wire = 0  # publishes written and not answered yet
        self._drained: asyncio.Future[None] | None = None  # close() waits on it
        self._tasks: set[asyncio.Task[PublishResult]] = set()  # publish_nowait slow paths
        self._slow: dict[str, int] = {}  # topic -> its publish_nowait slow paths running
        self._linger = config.linger
        # lingering batches per (topic, partition, node): plain nodes round-robin, a batch each
        self._lingering: dict[tuple[str, int | None, Address], Batch] = {}
        otel.producer_tracing(self, tracer_provider)  # spans, when asked for (observability.otel)
        self._meter = otel_metrics.producer_meter(self, self._meter, meter_provider)  # metrics

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> Producer:
        """Start the route source (lookupd discovery) and the pool; a first publish does it.

        One start is shared by every caller; a caller giving up on it (a publish whose
        deadline passed) leaves it running for the next one, and a failed start is tried
        again by the next caller.
        """
        if self._closed:
            raise ClientClosed("a closed Producer cannot start again")
        if not self._started:
            await asyncio.shield(self._start_task())
        return self

    def _start_task(self) -> asyncio.Task[None]:
        task = self._starting
        if task is None:
            self._loop = asyncio.get_running_loop()
            # asyncio's own loops read time.monotonic() in a Python method: call it directly
            self._now = time.monotonic if type(self._loop).time is asyncio.BaseEventLoop.time \
                else self._loop.time
            task = self._starting = self._loop.create_task(self._pool.start())
            task.add_done_callback(self._start_done)
        return task

    def _start_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._started = True
        elif self._starting is task:
            self._starting = None  # the next caller starts again

    async def close(self, timeout: float | None = None) -> None:
        """Stop publishing, let what is on the wire be answered, close connections.

        New publishes, and retries of pending ones, fail at once with ``ConnectionFailed``;
        publishes already written get up to ``timeout`` seconds (default
        ``config.drain_timeout``) for their answers, since the server may have accepted them
        and failing them invites a duplicate. What is still unanswered then fails.
        """
        if timeout is not None:  # checked first: a bad one must not leave things half-closed
            timeout = close_timeout(timeout, self._config.drain_timeout)
        if self._closed:
            return
        self._closed = True
        for key in list(self._lingering):  # accepted before the close: they go out now
            self._flush_batch(key)
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
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
        """Begin the start (lookupd discovery) and return at once: each call waits for it
        within its own deadline, so a silent lookupd costs the first call its ``timeout``,
        not an extra wait on entry. ``await producer.start()`` waits for it explicitly."""
        if self._closed:
            raise ClientClosed("a closed Producer cannot start again")
        self._start_task()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def config(self) -> ProducerConfig:
        return self._config

    @property
    def pool(self) -> NodePool:
        return self._pool

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ProducerStats:
        """A typed snapshot (:class:`smartnsq.observability.stats.ProducerStats`): messages
        published, calls failed and attempts retried by reason, the publish latency, per topic and
        partition with the leader written to now; connections, leader changes and lookup rounds."""
        from ..observability.stats import (  # (loaded when a snapshot is taken)
            LookupStats,
            ProducerStats,
        )

        pool = self._pool
        leaders = {(routes.topic, p): address_text(leader) for routes in pool.known_routes()
                   for p, leader in routes.leaders.items()}
        return ProducerStats.build(
            self._meter, leaders=leaders, connections=len(pool.connections),
            on_wire=self._on_wire, leader_changes=pool.leader_changes,
            lookup=LookupStats.of(getattr(self._source, "lookup", None)))

    async def routes(self, topic: str, timeout: float | None = None) -> TopicRoutes:
        """The topic's current routes (looked up if unknown): partition_num, leaders, meta.

        ``timeout`` (default ``config.timeout``) bounds the whole call, the implicit start
        included; past it ``Timeout``.
        """
        self._checks.topic(topic)
        timeout = timeout_seconds(timeout, self._timeout)
        request = Request(topic, b"", None, None, None, None, None, timeout,
                          asyncio.get_running_loop().time())
        if not self._started or self._closed:
            await self._ensure_started(request)
        return await self._load_routes(request)

    async def _ensure_started(self, request: Request | None = None) -> None:
        """Start if needed; with a ``request``, within its deadline (``Timeout`` past it)."""
        if self._closed:
            raise ConnectionFailed("the producer is closed")
        if self._started:
            return
        if request is None:
            await self.start()
            return
        remaining = request.deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(asyncio.shield(self._start_task()), max(remaining, 0.0))
        except asyncio.TimeoutError:
            raise Timeout(f"{request.topic!r}: the producer's start (lookupd discovery) did "
                          f"not finish within the call's {request.timeout:g}s") from None
        if self._closed:
            raise ConnectionFailed("the producer is closed")

    # -- tracing switches --------------------------------------------------------------------

    def set_trace(self, enabled: bool | None, topic: str | None = None) -> None:
        """Switch the client-side trace log, for every topic or for one, at any time.

        ``True``: every publish is sent traced and logged on ``smartnsq.observability.trace``;
        ``None``: only publishes given a ``trace_id`` are logged; ``False``: none are. A topic's own
        setting wins over the producer's; ``set_trace(None, topic)`` makes the topic follow
        the producer's setting again.
        """
        if enabled not in (True, False, None):
            raise InvalidArgument("trace", "must be True, False or None", enabled)
        if topic is None:
            self._trace_default = enabled
        else:
            self._checks.topic(topic)
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
        pin the partition (see ``smartnsq.producer.routing``). ``trace_id`` (uint64) sends it
        traced (PUB_TRACE, or ``##trace_id`` in the JSON header when ``headers`` are given:
        PUB_EXT; youzan only). ``headers``: ext JSON headers (str -> str; ext topics only).
        ``delay``: seconds before delivery (DPUB, classic nodes only). ``timeout``: the whole
        call's deadline (``config.timeout`` by default).

        Raises ``InvalidArgument`` before anything is sent, ``NonRetriableServerError`` when
        the server refuses the message, ``TopicNotFound``, or ``Timeout``.
        """
        if self._linger and headers is None and trace_id is None and delay is None:
            # may join a lingering batch: publish_nowait's path gathers them
            return await self.publish_nowait(topic, body, sharding_key=sharding_key,
                                             partition=partition, timeout=timeout)
        body, ext, delay_ms = self._checks.one(topic, body, sharding_key, partition, trace_id,
                                               headers, delay)
        timeout = self._timeout if timeout is None else timeout_seconds(timeout, self._timeout)
        started = self._started
        loop = self._loop if started else asyncio.get_running_loop()
        request = Request(topic, body, sharding_key, partition, trace_id, ext, delay_ms,
                          timeout, loop.time())
        if not started or self._closed:
            await self._ensure_started(request)
        elif topic not in self._slow:
            # the first attempt written in this turn and its answer awaited here, without the
            # retry loop's coroutine, which takes over from any failure
            routes = self._pool.routes(topic)
            if routes is not None:
                try:
                    answer = self._submit(request, routes, None, request.start)
                except Exception as exc:  # what routing or encoding refuses
                    return await self._send(request, exc)  # type: ignore[return-value]
                if answer is None:  # routed: the loop waits for its leader or connection
                    return await self._send(request, routed=True)  # type: ignore[return-value]
                try:
                    data = await answer
                except BaseException as exc:  # (cancelled too: no one reads the answer now)
                    self._settle(request, None)
                    if not isinstance(exc, Exception):
                        raise
                    return await self._send(request, exc)  # type: ignore[return-value]
                try:
                    return self._settle(request, data)  # type: ignore[return-value]
                except Exception as exc:  # an unreadable answer
                    return await self._send(request, exc)  # type: ignore[return-value]
        return await self._send(request)  # type: ignore[return-value]

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
        return self._nowait(None, topic, body, sharding_key, partition, trace_id, headers,
                            delay, timeout)

    def _nowait(self, result: asyncio.Future[PublishResult] | None, topic: str, body: bytes,
                sharding_key: ShardingKey | None, partition: int | None,
                trace_id: int | None, headers: Mapping[str, str] | None,
                delay: float | None, timeout: float | None) -> asyncio.Future[PublishResult]:
        """``publish_nowait`` settling ``result`` (a new future when None): the blocking
        facade passes its own slot (``loop_thread.Slot``), which wakes its caller as soon as
        the answer is read, without an asyncio future between them."""
        body, ext, delay_ms = self._checks.one(topic, body, sharding_key, partition, trace_id,
                                               headers, delay)
        timeout = self._timeout if timeout is None else timeout_seconds(timeout, self._timeout)
        loop = self._loop if self._started else asyncio.get_running_loop()
        if result is None:
            result = loop.create_future()
        request = NowaitRequest(topic, body, sharding_key, partition, trace_id, ext,
                                delay_ms, timeout, loop.time())
        request.owner = self
        request.result = result
        request.answered = False
        if not self._started or self._closed:
            return self._later(loop, request, result)
        routes = self._pool.routes(topic)
        if routes is None or topic in self._slow:
            # (while earlier calls for the topic are on the slow path, later ones queue
            # behind them rather than overtake them on the wire)
            return self._later(loop, request, result)
        try:
            sent = self._submit(request, routes, request, request.start)
        except Exception as exc:  # what routing or encoding refuses
            self._failed(request, exc)
            return result
        if sent is None:  # routed: the loop waits for its leader or connection
            return self._later(loop, request, result, routed=True)
        return result

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
        items, traces, exts = self._checks.batch(topic, bodies, sharding_key, partition,
                                                 trace_id, headers)
        timeout = timeout_seconds(timeout, self._timeout)
        request = BatchRequest(topic, items, traces, exts, sharding_key, partition, timeout,
                               asyncio.get_running_loop().time())
        if not self._started or self._closed:
            await self._ensure_started(request)
        return await self._send(request)  # type: ignore[return-value]

    # -- one attempt: written by _submit, its answer settled by _settle -----------------------

    def _submit(self, request: Request, routes: TopicRoutes | None,
                slot: NowaitRequest | None, now: float) -> asyncio.Future[bytes] | None:
        """Route, encode and write an attempt without awaiting anything: every attempt of
        every call is written here. ``now``: the loop time (a call's first attempt passes
        its start: it began this turn).

        ``routes``: the topic's routes to pick the target from; ``None`` for an attempt
        routed already, waiting for its connection. Returns the answer's future (``slot``
        itself when given: the connection settles it), or None when the attempt must wait
        first: for a leader (``request.address`` is None), or for the target's connection
        to be open and take writes. Raises what routing or encoding refuses,
        ``ProducerClosed`` once closing, and ``Timeout`` with no time left.
        """
        bodies = request.bodies
        if routes is not None:
            if self._migration is not None:
                routes = choose_side(routes, request.sharding_key, self._migration)
            request.target, address = choose_target(
                routes, request.sharding_key, request.partition, self._router, self._classic,
                self._rr)
            request.address = address
            # (check_features has nothing to refuse without headers or a delay)
            if request.ext is not None or request.delay_ms is not None \
                    or (bodies is not None and request.exts is not None):
                check_features(routes, request.ext is not None or request.exts is not None,
                               request.delay_ms, self._classic)
            if self._compress is not None and bodies is None and routes.ext:
                compress_body(request, self._compress)
            if address is None:
                return None
        else:
            address = request.address
            assert address is not None
        conn = self._pool.connection(address)
        if conn is None or conn.writing_paused:
            return None
        if self._closed:  # closing: nothing new goes on the wire
            raise ProducerClosed("the producer is closed")
        if request.deadline <= now:
            # no attempt with no time left: it would time out at once, and close the shared
            # connection with it
            after = f" after: {request.error}" if request.error is not None else ""
            raise Timeout(f"no time left for attempt {request.attempt}{after}")
        topic = request.topic
        youzan = conn.is_youzan
        # a traced answer (a receipt) from a youzan node: for a pinned publish with
        # sharded_receipts, or with the topic's trace log on
        receipt = False
        if youzan:
            if self._receipts and (request.sharding_key is not None
                                   or request.partition is not None):
                receipt = True
            elif self._trace_default or self._trace_topics:
                receipt = bool(self._trace_topics.get(topic, self._trace_default))
        if self._lingering or self._linger:
            key = (topic, request.target, address)
            if slot is not None and self._linger and not receipt and request.ext is None \
                    and request.trace_id is None and request.delay_ms is None \
                    and request.timeout >= LINGER_TIMEOUTS * self._linger:
                self._hold(key, slot, conn)
                return slot  # type: ignore[return-value]  # (an answer slot: not awaited)
            if key in self._lingering:
                # the batch held for this partition goes first: the wire keeps call order
                self._flush_batch(key)
        if bodies is None:
            data, command, request.traced = encode_one(
                youzan, address, topic, request.target, request.body, request.trace_id,
                request.ext, request.delay_ms, receipt, self._classic)
        else:
            data, command, request.traced = encode_batch(
                youzan, address, topic, request.target, bodies, request.traces,
                request.exts, receipt, self._checks.max_body, self._classic)
        request.command = command
        until = answer_deadline(request.deadline, now, self._request_timeout)
        try:
            answer = conn.submit(data, command, until - now, alone=True, slot=slot,
                                 deadline=until)
        except ConnectionFailed:  # closed since the pool handed it out: wait for a new one
            return None
        request.stage = SEND
        self._on_wire += 1
        return answer

    @overload
    def _settle(self, request: Request, answer: bytes) -> PublishResult | BatchResult: ...

    @overload
    def _settle(self, request: Request, answer: None) -> None: ...

    def _settle(self, request: Request,
                answer: bytes | None) -> PublishResult | BatchResult | None:
        """The end of a written attempt, for every call: off the wire (close() may be waiting
        for it), and with the server's ``answer`` (None: it failed, or no one reads it)
        the call's result by the topic's trace mode, counted for ``stats()``. Raises for
        an unreadable answer, which is then off the wire and not counted."""
        self._on_wire -= 1
        if self._drained is not None and not self._on_wire and not self._drained.done():
            self._drained.set_result(None)
        if answer is None:
            return None
        topics = self._trace_topics
        result = self._results.of(request, answer, topics.get(request.topic, self._trace_default)
                                  if topics else self._trace_default)
        # PublishMeter.ok, inline (the call alone was over 1% of a pipelined publish's CPU;
        # tests/unit/test_producer_settle.py holds the two to the same counts)
        try:
            counts = self._meter.topics[request.topic][request.target]
        except KeyError:
            counts = self._meter.counts(request.topic, request.target)
        if request.bodies is None:
            counts.published += 1
        else:
            counts.published += len(request.bodies)
        skip = counts.skip
        if skip:
            counts.skip = skip - 1
        else:
            self._meter.timed(counts, request.start, self._now)
        return result

    def _failed(self, request: NowaitRequest, error: BaseException) -> None:
        """A ``publish_nowait`` call's first attempt failed: its retry decision, carried out
        (the future fails, or the retry loop goes on in a task). Never raises."""
        result = request.result
        try:
            decision = self._decide(request, error)
            if decision.next is Next.GIVE_UP:
                assert decision.error is not None
                result.set_exception(decision.error)
                return
            self._later(self._loop, request, result, decision)
        except Exception as exc:  # a fault of ours
            if not result.done():
                result.set_exception(exc)

    # -- linger -----------------------------------------------------------------------------

    def _hold(self, key: tuple[str, int | None, Address], request: NowaitRequest,
              conn: Connection) -> None:
        """Add a plain publish to its partition's lingering batch (``config.linger``)."""
        batch = self._lingering.get(key)
        if batch is not None and (batch.conn is not conn
                                  or not batch.fits(request.body, self._checks.max_body)):
            self._flush_batch(key)
            batch = None
        if batch is None:
            batch = self._lingering[key] = Batch(conn)
            batch.timer = self._loop.call_later(self._linger, self._flush_batch, key)
        batch.add(request)
        request.command = MPUB
        request.traced = False
        request.stage = SEND
        self._on_wire += 1

    def _flush_batch(self, key: tuple[str, int | None, Address]) -> None:
        """Send a lingering batch as one MPUB; a failure to send fails each of its messages,
        which then retry on their own."""
        batch = self._lingering.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        conn = batch.conn
        topic, target, _ = key
        try:
            data = commands.mpub_unchecked(topic, [r.body for r in batch.requests],
                                           target if conn.is_youzan else None,
                                           self._checks.max_body)
            now = self._loop.time()
            until = answer_deadline(batch.deadline, now, self._request_timeout)
            conn.submit(data, MPUB, until - now, alone=True, slot=batch, deadline=until)
        except Exception as exc:  # closed meanwhile, or no time left: each decides
            batch.set_exception(exc)

    # -- the slow path of publish_nowait ------------------------------------------------------

    def _later(self, loop: asyncio.AbstractEventLoop, request: Request,
               result: asyncio.Future[PublishResult] | None = None,
               decision: Decision | None = None,
               routed: bool = False) -> asyncio.Future[PublishResult]:
        """The slow path of publish_nowait: publish()'s retry loop in a task, settling
        ``result`` (a new future if None); ``decision``: what the failed first attempt
        decided; ``routed``: the first attempt is routed and waits for its connection."""
        if result is None:
            result = loop.create_future()
        task = loop.create_task(self._publish_later(request, decision, routed))
        self._tasks.add(task)
        slow = self._slow
        topic = request.topic
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

    async def _publish_later(self, request: Request, decision: Decision | None,
                             routed: bool) -> PublishResult:
        if decision is not None:
            await self._wait(request, decision)
        elif not routed and (not self._started or self._closed):
            await self._ensure_started(request)  # nothing sent yet: as publish() does
        return await self._send(request, routed=routed)  # type: ignore[return-value]

    # -- the retry loop ---------------------------------------------------------------------

    async def _send(self, request: Request, failed: Exception | None = None,
                    routed: bool = False) -> PublishResult | BatchResult:
        """Attempts until one is acknowledged or ``retry.decide`` gives up. ``failed``: how
        the call's first attempt failed, outside this loop; ``routed``: that attempt was
        routed outside it and waits here for its leader or connection."""
        while True:
            if failed is None:
                try:
                    return await self._attempt(request, routed)
                except Exception as exc:
                    failed = exc
            decision = self._decide(request, failed)
            if decision.next is Next.GIVE_UP:
                assert decision.error is not None
                if decision.error is failed:
                    raise failed
                raise decision.error from decision.error.__cause__
            failed = None
            routed = False
            await self._wait(request, decision)

    def _decide(self, request: Request, error: BaseException) -> Decision:
        request.error = error
        config = self._config
        decision = decide(error, request.stage, request.attempt,
                          request.deadline - self._loop.time(), pinned=request.pinned,
                          closing=self._closed, topic=request.topic, timeout=request.timeout,
                          retry_delay=config.retry_delay, retry_delay_max=config.retry_delay_max)
        count = self._meter.failed if decision.next is Next.GIVE_UP else self._meter.retried
        count(request.topic, request.target, error)  # (for stats())
        return decision

    async def _wait(self, request: Request, decision: Decision) -> None:
        """Carry out a retry decision: the route book learns what failed and says how long to
        wait (:meth:`smartnsq.discovery.route_book.RouteBook.after_failure`), then the wait;
        the next attempt begins after it."""
        error = request.error
        if decision.check_topic and isinstance(error, ServerError):
            gone = await self._topic_gone(request, error)
            if gone is not None:  # (a deleted topic: no retry can succeed)
                self._meter.failed(request.topic, request.target, gone)
                raise gone
        if decision.keep_partition and request.partition is None \
                and request.target is not None and self._migration is None:
            request.partition = request.target  # a sharded message is never re-routed
        refused_by = request.address if request.stage is SEND else None
        pause = self._pool.book.after_failure(
            request.topic, request.target, decision.delay,
            refresh=decision.next is Next.REFRESH_AND_RETRY, refused_by=refused_by,
            code=getattr(error, "code", None),
            no_leader=decision.keep_partition and isinstance(error, NoLeader),
            probe=decision.probe, probe_period=self._config.retry_delay)
        if pause.delay > 0:
            log.debug("publish to %r: attempt %d failed (%s); next in %.3fs", request.topic,
                      request.attempt, error, pause.delay)
            await pause.wait()
        if request.deadline - self._loop.time() < least_time(request.timeout):
            assert error is not None  # (too little left for an answer to come back in)
            late = timed_out(request.topic, request.timeout, error)
            self._meter.failed(request.topic, request.target, late)
            raise late
        if self._closed:
            self._meter.failed(request.topic, request.target, ProducerClosed())
            raise ProducerClosed("the producer is closed") from error
        request.attempt += 1
        self.retry_count += 1

    async def _attempt(self, request: Request,
                       routed: bool = False) -> PublishResult | BatchResult:
        """One attempt: routes, connection, send, answer. Raises what went wrong.
        ``routed``: the call's first attempt, routed outside the loop (no second routing:
        a round-robin step or a migration chooser's draw is taken once per attempt)."""
        pool = self._pool
        loop = self._loop
        if routed:
            answer = None
        else:
            request.stage = ROUTE
            request.address = None
            if self._closed:  # closing: no new attempt (the last one was not accepted)
                raise ProducerClosed("the producer is closed")
            routes = pool.routes(request.topic)
            if routes is None:
                routes = await self._load_routes(request)
            answer = self._submit(request, routes, None, loop.time())
        while answer is None:  # what the attempt waits for: a leader, the connection, room
            address = request.address
            if address is None:
                raise await self._no_leader(request)
            request.stage = CONNECT
            conn = await pool.acquire(address, request.deadline - loop.time())
            if conn.writing_paused:  # back-pressure: wait, within the deadline
                request.stage = SEND
                try:
                    await asyncio.wait_for(conn.drain(),
                                           max(request.deadline - loop.time(), 0.0))
                except asyncio.TimeoutError:
                    raise Timeout(f"{request.node} took no more writes before the deadline") \
                        from None
            answer = self._submit(request, None, None, loop.time())
        try:
            data = await answer
        except BaseException:
            self._settle(request, None)
            raise
        result = self._settle(request, data)
        if request.attempt > 1:  # back after a refusal: wake the others waiting
            self._pool.writable(request.topic, request.target)
        return result

    async def _no_leader(self, request: Request) -> NoLeader:
        """Why the routes have no leader for this attempt: a pinned partition whose leader is
        up but hidden from writers is ``NotWritable``, anything else ``NoLeader``. Asks the
        readers' lookup (cached after the first time) within a bounded share of the call's time
        left; unknown stays ``NoLeader``."""
        topic, target = request.topic, request.target
        if target is None:
            return NoLeader(f"no node can take {topic!r} now")
        ask = getattr(self._source, "read_leader", None)
        budget = min(request.deadline - self._loop.time() - least_time(request.timeout), 1.0)
        if ask is None:
            unchecked = "no lookup to ask"
        elif budget <= 0:
            unchecked = "no time left to ask the readers' lookup"
        else:
            try:
                leader = await ask(topic, target, budget)
            except Exception as exc:  # lookup failed or timed out: no more is known than before
                unchecked = f"the readers' lookup did not answer: {summary(exc)}"
            else:
                if leader is not None:
                    return NotWritable(f"partition {target} of {topic!r} is not writable now: "
                                       f"its leader {address_text(leader)} is up but takes no "
                                       "writes (too few in-sync replicas, a leader change, or "
                                       "writes disabled)")
                return NoLeader(f"partition {target} of {topic!r} has no leader now (none is "
                                "named by lookup: an election under way, or its replicas are "
                                "down)")
        # not asked: "no leader" would be a guess, and a partition up but not writable
        # (NotWritable) looks the same from the writers' routes
        return NoLeader(f"partition {target} of {topic!r} has no writable leader in lookup now "
                        f"(whether its leader is up was not checked: {unchecked})")

    async def _topic_gone(self, request: Request, error: ServerError) -> TopicNotFound | None:
        """A node has no such topic: does lookup still list it (asked afresh, within the
        share of time :meth:`_no_leader` takes)? ``retry.topic_gone`` decides. A gone topic's
        routes are forgotten: the next calls fail at their lookup, not on the nodes."""
        lookup = getattr(self._source, "lookup", None)
        budget = min(request.deadline - self._loop.time() - least_time(request.timeout), 1.0)
        answer, found = Lookup.SILENT, None  # (a route source of the caller's own: retried)
        if isinstance(self._source, StaticRouteSource):
            answer = Lookup.NONE
        elif lookup is not None and budget > 0:
            try:
                await lookup.view(request.topic, "w", refresh=True, timeout=budget)
                answer = Lookup.LISTED
            except TopicNotFound as exc:
                answer, found = Lookup.GONE, exc
            except Exception as exc:  # lookup failed or timed out: nothing more is known
                log.debug("lookup of %r failed: %s", request.topic, summary(exc))
        gone = topic_gone(request.topic, error, answer, node=request.node, found=found)
        if gone is not None and answer is Lookup.GONE:
            self._pool.book.forget(request.topic)
        return gone

    async def _load_routes(self, request: Request) -> TopicRoutes:
        remaining = request.deadline - self._loop.time()
        if remaining <= 0:
            raise Timeout(f"no routes for {request.topic!r} before the deadline")
        try:
            return await asyncio.wait_for(self._pool.load_routes(request.topic), remaining)
        except asyncio.TimeoutError:
            raise Timeout(f"lookup of {request.topic!r} took longer than the call's "
                          f"{request.timeout:g}s{self._lookupd_errors()}") from None
        except TopicNotFound as exc:  # (saying what to do: create the topic)
            raise missing_topic(exc)  # noqa: B904  (its __cause__ is exc)

    def _lookupd_errors(self) -> str:
        """The lookupds' last errors, for a lookup that ran out of time (what a retried
        lookupd said is otherwise lost behind the ``Timeout``)."""
        lookup = getattr(self._source, "lookup", None)
        health = getattr(lookup, "health", None)
        if health is None:
            return ""
        try:
            errors = [f"{s.address}: {s.last_error}" for s in health() if s.last_error]
        except Exception:  # a route source of the caller's own: nothing to add
            return ""
        return f"; lookupd errors: {'; '.join(errors)}" if errors else ""
