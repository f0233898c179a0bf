"""Partition-keyed connections: (topic, partition) -> the leader's connection.

Two maps make the pool. ``routes(topic)`` is the topic's current :class:`TopicRoutes` (which
node leads each partition, and the topic's meta), replaced whenever the route source (lookupd,
or a fixed list of nsqd) reports a change. Connections are keyed by node *address*, so every
partition a node leads, of every topic, shares one connection: nsqd serves any partition over
any connection (the partition travels in each command) and one busy connection coalesces
writes better than many idle ones.

A leader change moves a key by itself: the next publish reads the new route and takes (or
opens) the new leader's connection. Errors move keys too: a publisher that gets
``E_FAILED_ON_NOT_LEADER`` calls :meth:`PartitionPool.leader_failed`, which asks the source
for a (coalesced) refresh.

A partition that vanishes from the writers' lookup while its leader's connection stays open is
*held* on that leader (``TopicRoutes.held``): youzan hides a partition that refuses writes
(a dead replica, an ISR shrink, a catch-up) although its leader is alive, and that leader is
the first to know when writes work again, one cheap round trip away, long before the next
lookup says so. Pinned publishes keep going there (they get ``E_FAILED_ON_NOT_WRITABLE`` and
probe again, one at a time per partition: :meth:`PartitionPool.probe_delay`); unpinned ones
skip held partitions. A hold ends when lookup names a leader again, the connection closes, or
the node answers that it does not lead the partition or leaves a publish unanswered (a stalled
node: a probe would only queue behind the stalled request, and be written when it ends); a
partition dropped or released while its leader was stalled is held again
(:meth:`PartitionPool.rehold`) by the next publish waiting for it once that leader answers.

While anyone waits for a route change of a topic (:meth:`PartitionPool.changed`), the pool
asks the source for fresh routes every ``wait_refresh`` seconds (the lookup manager spaces
rounds that find nothing new by its own ``refresh_min_interval``..``refresh_max_interval``),
so a failover's end is learned within about that long, not at a retry's back-off. For the
first ``FAST_POLL_FOR`` seconds of a wait, when graceful handoffs end (0.07-4.1 s on the
real cluster), it asks twice as often, for rounds of their own past that spacing: a handoff
is then learned within 50 ms of lookup knowing it.

Failures never spin. A node whose connect fails is not dialled again before a back-off that
doubles per consecutive failure (``reconnect_delay`` .. ``reconnect_delay_max``, jittered);
the failure also asks for a refresh of every topic routed to it, since a dead node is usually
a leader about to be replaced. Callers asking for that node meanwhile get
:class:`NodeBackoff` at once, with the time left, and wait on :meth:`PartitionPool.changed`
(which settles early when the routes move). A node that reappears in a route gets a fresh
chance at once.

Connections nobody used for ``idle_timeout`` seconds (and with nothing pending) are closed by
a sweeper task; the next use reopens them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from .backoff import exponential_delay
from .config import ConnectionConfig
from .connection import Connection
from .errors import ConnectionError_, InvalidArgument, Timeout

if TYPE_CHECKING:  # LookupRouteSource only; smartnsq.lookup is imported when used
    from .lookup import LookupManager, TopicChange, TopicView

FAST_POLL_FOR = 5.0  # s at the start of a wait: rounds of their own, twice as often
FAST_POLL_REARM = 30.0  # s before another wait of the topic gets a fast start again
ROUND_TIMEOUT = 1.0  # s one such round may take

__all__ = [
    "Address",
    "NodeBackoff",
    "PartitionPool",
    "RouteSource",
    "StaticRouteSource",
    "TopicRoutes",
    "parse_address",
    "probe_turn",
]

log = logging.getLogger("smartnsq.pool")

Address = tuple[str, int]
Target = tuple["int | None", Address]  # (partition or None for "no partition token", node)


def address_list(value: object, what: str) -> list[Any]:
    """A client's ``lookupd=``/``nsqd=`` argument as a list: one address string or an
    iterable of them; anything else (a number, bytes, a mapping) is an ``InvalidArgument``
    naming ``what``, not a ``TypeError`` from deep inside."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable) or isinstance(value, bytes | bytearray | Mapping):
        raise InvalidArgument(what, "must be an address or a list of addresses", value)
    return list(value)


def parse_address(text: str | tuple[str, int], what: str = "address") -> Address:
    """``"host:port"`` (or an already split pair) as ``(host, port)``."""
    if isinstance(text, tuple):
        host, port = text
    else:
        if not isinstance(text, str) or ":" not in text:
            raise InvalidArgument(what, "must be 'host:port'", text)
        host, _, port_text = text.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text)
        except ValueError:
            raise InvalidArgument(what, "port must be a number", text) from None
    if not host or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidArgument(what, "must be 'host:port' with a port in 1..65535", text)
    return host, port


@dataclass(frozen=True, eq=False)
class TopicRoutes:
    """Where a topic can be written right now; an immutable snapshot.

    ``partition_num`` is the topic's partition count from lookup meta (0 when unknown: classic
    topics, standalone nodes). ``leaders`` maps each partition that has a writable leader now to
    that leader; a partition missing from it is normal for a while during a failover.
    ``nodes`` are nodes written without a partition token (classic nsqd, or nsqd given
    directly). ``youzan`` is true when the topic is known to live on youzan nodes (partitions or
    meta seen), false when known classic, ``None`` when only the connection will tell.
    ``held``: partitions of ``leaders`` that lookup no longer lists but whose leader is still
    connected (see the module docstring): pinned publishes go there, round-robin does not.
    """

    topic: str
    partition_num: int = 0
    ordered: bool = False
    ext: bool = False
    youzan: bool | None = None
    leaders: Mapping[int, Address] = field(default_factory=dict)
    nodes: tuple[Address, ...] = ()
    held: frozenset[int] = frozenset()
    targets: tuple[Target, ...] = field(init=False)

    def __post_init__(self) -> None:
        # unsharded round-robin order: partitions that have a leader, else the plain nodes
        if self.leaders:
            targets: tuple[Target, ...] = tuple((p, self.leaders[p]) for p in sorted(self.leaders)
                                                if p not in self.held)
        else:
            targets = tuple((None, a) for a in self.nodes)
        object.__setattr__(self, "targets", targets)

    @property
    def partitioned(self) -> bool:
        return self.partition_num > 0 or bool(self.leaders)

    def addresses(self) -> set[Address]:
        return {a for _, a in self.targets} | set(self.leaders.values())

    def same_routes(self, other: TopicRoutes | None) -> bool:
        return (other is not None and self.targets == other.targets
                and self.leaders == other.leaders and self.held == other.held
                and self.partition_num == other.partition_num
                and self.ordered == other.ordered and self.ext == other.ext
                and self.youzan == other.youzan)


RoutesCallback = Callable[[TopicRoutes], None]


class RouteSource(Protocol):
    """Where routes come from: the lookup manager, or a fixed list of nodes."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def routes(self, topic: str) -> TopicRoutes:
        """The topic's routes, looked up now if unknown (raises ``TopicNotFound`` etc.)."""
        ...

    def refresh(self, topic: str, *, now: bool = False) -> None:
        """Ask for fresh routes soon (coalesced; the answer arrives through ``subscribe``);
        ``now``: a round at once, past the source's spacing of rounds that find nothing new.
        (Optional: a source whose ``refresh`` takes no ``now`` gets spaced refreshes only.)"""
        ...

    def subscribe(self, callback: RoutesCallback) -> None:
        """Call ``callback(routes)`` whenever a topic's routes change."""
        ...


class StaticRouteSource:
    """Every topic is on every one of a fixed list of nsqd (``Producer(nsqd=[...])``).

    No partitions are named: each publish goes to the node's default partition, so this is for
    classic nodes and standalone youzan nodes.
    """

    def __init__(self, addresses: Iterable[str | Address]) -> None:
        self._nodes = tuple(dict.fromkeys(parse_address(a, "nsqd")
                                          for a in address_list(addresses, "nsqd")))
        if not self._nodes:
            raise InvalidArgument("nsqd", "needs at least one address", list(addresses))

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def routes(self, topic: str) -> TopicRoutes:
        return TopicRoutes(topic, nodes=self._nodes)

    def refresh(self, topic: str, *, now: bool = False) -> None:
        return None

    def subscribe(self, callback: RoutesCallback) -> None:
        return None


class NodeBackoff(ConnectionError_):
    """A node's connect failed recently; it will not be dialled again for ``retry_in`` s."""

    def __init__(self, address: Address, retry_in: float, cause: BaseException | None) -> None:
        self.address = address
        self.retry_in = retry_in
        self.cause = cause  # the connect failure the node is backing off from
        super().__init__(f"{address[0]}:{address[1]} is backing off for {retry_in:.2f}s after "
                         f"failing to connect: {cause}")


class _Node:
    """One nsqd address: its connection (or the attempt to open it) and failure record."""

    __slots__ = ("address", "conn", "failures", "last_error", "opening", "retry_at",
                 "seen_uses", "uses")

    def __init__(self, address: Address) -> None:
        self.address = address
        self.conn: Connection | None = None
        self.opening: asyncio.Task[Connection] | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.last_error: BaseException | None = None
        self.uses = 0
        self.seen_uses = 0


class PartitionPool:
    """Routes per topic and one shared connection per node; see the module docstring."""

    def __init__(self, source: RouteSource, config: ConnectionConfig | None = None, *,
                 idle_timeout: float | None = 300.0, reconnect_delay: float = 0.05,
                 reconnect_delay_max: float = 2.0, wait_refresh: float = 0.1,
                 connect: Callable[[str, int, ConnectionConfig], Awaitable[Connection]]
                 | None = None) -> None:
        self._source = source
        # a source of this library's, or one written before ``refresh(now=)`` existed
        self._rounds_at_once = "now" in inspect.signature(source.refresh).parameters
        self._wait_refresh = wait_refresh
        self._config = config or ConnectionConfig()
        self._idle_timeout = idle_timeout
        self._reconnect_delay = reconnect_delay
        self._reconnect_delay_max = reconnect_delay_max
        self._connect = connect
        self._routes: dict[str, TopicRoutes] = {}
        self._loading: dict[str, asyncio.Task[TopicRoutes]] = {}
        self._nodes: dict[Address, _Node] = {}
        # waiters per topic, each for any change (partition None) or for one partition
        self._waiters: dict[str, list[tuple[asyncio.Future[None], int | None]]] = {}
        self._polling: dict[str, asyncio.TimerHandle] = {}  # refresh timers while waited on
        self._fast_since: dict[str, float] = {}  # when each topic's last fast start began
        self._probes: dict[tuple[str, int], float] = {}  # next free probe time per partition
        # partitions dropped by lookup while their leader was stalled: that leader, to hold
        # them on once it answers again (``rehold``)
        self._lost: dict[tuple[str, int], Address] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self.leader_changes = 0  # partitions seen moving to another leader (for stats())
        source.subscribe(self._on_routes)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._source.start()
        if self._idle_timeout is not None and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self) -> None:
        """Close every connection (pending publishes fail with ``ConnectionClosed``)."""
        if self._closed:
            return
        self._closed = True
        tasks: list[asyncio.Task[object]] = []
        if self._sweeper is not None:
            self._sweeper.cancel()
            tasks.append(self._sweeper)
        for task in self._loading.values():
            task.cancel()
            tasks.append(task)
        conns = []
        for node in self._nodes.values():
            if node.opening is not None:
                node.opening.cancel()
                tasks.append(node.opening)
            if node.conn is not None:
                conns.append(node.conn)
        for waiters in self._waiters.values():
            for waiter, _ in waiters:
                _settle(waiter)
        self._waiters.clear()
        for handle in self._polling.values():
            handle.cancel()
        self._polling.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        self._nodes.clear()
        await self._source.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- routes -------------------------------------------------------------------------------

    def known_routes(self) -> list[TopicRoutes]:
        """The routes of every topic known now."""
        return list(self._routes.values())

    def routes(self, topic: str) -> TopicRoutes | None:
        """The routes known now (``None`` before the first lookup of ``topic``)."""
        return self._routes.get(topic)

    async def load_routes(self, topic: str) -> TopicRoutes:
        """The routes, looked up once if unknown; concurrent callers share one lookup."""
        routes = self._routes.get(topic)
        if routes is not None:
            return routes
        task = self._loading.get(topic)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(topic))
            self._loading[topic] = task
        return await asyncio.shield(task)

    async def _load(self, topic: str) -> TopicRoutes:
        try:
            routes = await self._source.routes(topic)
            self._on_routes(routes)
            return self._routes.get(topic, routes)
        finally:
            self._loading.pop(topic, None)

    def refresh(self, topic: str, *, now: bool = False) -> None:
        if self._closed:
            return
        if now and self._rounds_at_once:
            self._source.refresh(topic, now=True)
        else:
            self._source.refresh(topic)

    def changed(self, topic: str, timeout: float,
                partition: int | None = None) -> asyncio.Future[None]:
        """A future settling at the next route change of ``topic``, or after ``timeout`` s.

        With a ``partition``, it also settles when a publish to that partition succeeds again
        (:meth:`writable`). It never raises; waiting on it is how callers back off without
        missing a recovery. While it is pending the topic's routes are refreshed: in the first
        ``FAST_POLL_FOR`` s of a wait (at most once per ``FAST_POLL_REARM`` s per topic) every
        ``wait_refresh / 2`` s with rounds of their own, then every ``wait_refresh`` s.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if self._closed:
            waiter.set_result(None)
            return waiter
        self._waiters.setdefault(topic, []).append((waiter, partition))
        handle = loop.call_later(max(timeout, 0.0), _settle, waiter)
        waiter.add_done_callback(lambda _: handle.cancel())
        if topic not in self._polling and self._wait_refresh > 0:
            now = loop.time()
            since = self._fast_since.get(topic, -math.inf)
            if now - since >= FAST_POLL_REARM:  # (waits that keep restarting: one fast start)
                since = self._fast_since[topic] = now
            self._polling[topic] = loop.call_later(self._wait_refresh / 2, self._poll_waited,
                                                   topic, since)
        return waiter

    def _poll_waited(self, topic: str, since: float) -> None:
        """Refresh ``topic`` while someone still waits on it (their back-offs may be long):
        in the wait's first ``FAST_POLL_FOR`` s every ``wait_refresh / 2`` with rounds of
        their own, then every ``wait_refresh`` as lookup spaces them."""
        del self._polling[topic]
        waiters = self._waiters.get(topic)
        if waiters:
            waiters[:] = [w for w in waiters if not w[0].done()]
        if not waiters or self._closed:
            self._waiters.pop(topic, None)
            return
        loop = asyncio.get_running_loop()
        fast = loop.time() - since < FAST_POLL_FOR
        self.refresh(topic, now=fast)
        self._polling[topic] = loop.call_later(
            self._wait_refresh / 2 if fast else self._wait_refresh, self._poll_waited, topic,
            since)

    def writable(self, topic: str, partition: int | None) -> None:
        """A publish to ``partition`` succeeded: wake whoever waits for it (they were refused
        or probing), and end its probe turns."""
        if partition is None or (topic, partition) not in self._probes:
            return
        del self._probes[(topic, partition)]
        waiters = self._waiters.get(topic)
        if waiters:
            for waiter, p in waiters:
                if p == partition:
                    _settle(waiter)

    def probe_delay(self, topic: str, partition: int, period: float,
                    horizon: float) -> float | None:
        """This caller's turn to probe a partition that refused writes (see
        :func:`probe_turn`): seconds to wait, or None when no turn is free within ``horizon``
        (the caller's own back-off: it waits that, woken early by :meth:`writable` or a
        route change)."""
        key = (topic, partition)
        now = asyncio.get_running_loop().time()
        turn = probe_turn(self._probes.get(key, 0.0), now, period, horizon)
        if turn is None:
            return None
        self._probes[key] = turn
        return turn - now

    def _on_routes(self, routes: TopicRoutes) -> None:
        old = self._routes.get(routes.topic)
        self._store(self._hold(old, routes), old)

    def _store(self, routes: TopicRoutes, old: TopicRoutes | None) -> None:
        self._routes[routes.topic] = routes
        if routes.same_routes(old):
            return
        if old is not None:
            before = old.leaders
            self.leader_changes += sum(1 for p, a in routes.leaders.items()
                                       if before.get(p, a) != a)
        if old is not None:
            log.info("routes of %r changed: %s", routes.topic, _describe(routes))
        else:
            log.debug("routes of %r: %s", routes.topic, _describe(routes))
        # a node that (re)appears as a target is worth dialling again at once
        fresh = routes.addresses() - (old.addresses() if old is not None else set())
        for address in fresh:
            node = self._nodes.get(address)
            if node is not None:
                node.retry_at = 0.0
        waiters = self._waiters.pop(routes.topic, None)
        if waiters:
            for waiter, _ in waiters:
                _settle(waiter)

    def _hold(self, old: TopicRoutes | None, routes: TopicRoutes) -> TopicRoutes:
        """``routes`` with the partitions lookup dropped held on their still-connected
        leaders (see the module docstring)."""
        if old is None or not old.leaders or not routes.youzan:
            return routes
        topic = routes.topic
        lost = self._lost
        for p in routes.leaders:
            lost.pop((topic, p), None)
        held = {}
        for p, a in old.leaders.items():
            if p in routes.leaders or (routes.partition_num and p >= routes.partition_num):
                continue
            if self._answering(a):
                held[p] = a
            elif self.connection_open(a):  # stalled for now: maybe later (rehold)
                lost[(topic, p)] = a
        if not held:
            return routes
        return replace(routes, leaders={**routes.leaders, **held}, held=frozenset(held))

    def _release(self, topic: str, picked: Callable[[int, Address], bool], *,
                 remember: bool = False) -> None:
        """End the holds of ``topic`` that ``picked(partition, address)`` chooses
        (``remember``: the leader may be held again once it answers, see :meth:`rehold`)."""
        routes = self._routes.get(topic)
        if routes is None or not routes.held:
            return
        gone = {p for p in routes.held if picked(p, routes.leaders[p])}
        if gone:
            if remember:
                self._lost.update(((topic, p), routes.leaders[p]) for p in gone)
            leaders = {p: a for p, a in routes.leaders.items() if p not in gone}
            self._store(replace(routes, leaders=leaders, held=routes.held - gone), routes)

    def rehold(self, topic: str, partition: int) -> bool:
        """Hold ``partition`` again on the leader it was dropped from while that leader was
        stalled, now that its connection answers again; True if it did (a route change)."""
        address = self._lost.get((topic, partition))
        routes = self._routes.get(topic)
        if address is None or routes is None or partition in routes.leaders \
                or not self._answering(address):
            return False
        del self._lost[(topic, partition)]
        self._store(replace(routes, leaders={**routes.leaders, partition: address},
                            held=routes.held | {partition}), routes)
        return True

    def leader_failed(self, topic: str, partition: int | None, address: Address,
                      code: str | None = None) -> None:
        """``address`` refused to write ``partition`` (``code``: the server's error, if any)."""
        log.debug("%s:%d refused %s/%s (%s); refreshing routes", address[0], address[1], topic,
                  partition, code)
        if code is None:
            # no answer in time (a stalled node): what is sent there now only queues behind
            # the stalled request and is written when it ends, so hold nothing on it
            self._release(topic, lambda p, a: a == address, remember=True)
        elif code != "E_FAILED_ON_NOT_WRITABLE":
            # not the leader (or no such partition there): no place to hold the partition on
            self._release(topic, lambda p, a: p == partition and a == address)
            if partition is not None and self._lost.get((topic, partition)) == address:
                del self._lost[(topic, partition)]
        self.refresh(topic)

    # -- connections --------------------------------------------------------------------------

    def connection(self, address: Address) -> Connection | None:
        """The open connection to ``address``, if any (no I/O)."""
        node = self._nodes.get(address)
        if node is None:
            return None
        conn = node.conn
        if conn is None or conn.is_closed:
            return None
        node.uses += 1
        return conn

    def connection_open(self, address: Address) -> bool:
        """Whether the connection to ``address`` is open (no I/O, not counted as a use)."""
        node = self._nodes.get(address)
        return node is not None and node.conn is not None and not node.conn.is_closed

    def _answering(self, address: Address) -> bool:
        """Whether the connection to ``address`` is open and owes no timed-out answers (a
        node that is not stalled: a probe sent there is answered, not queued)."""
        node = self._nodes.get(address)
        conn = None if node is None else node.conn
        return conn is not None and not conn.is_closed and not conn.timed_out_count

    def connection_for(self, topic: str, partition: int) -> Connection | None:
        """The open connection to the current leader of (topic, partition), if any."""
        routes = self._routes.get(topic)
        if routes is None:
            return None
        address = routes.leaders.get(partition)
        return None if address is None else self.connection(address)

    async def acquire(self, address: Address, timeout: float | None = None) -> Connection:
        """The connection to ``address``, opened (once, shared by concurrent callers) if needed.

        Raises :class:`NodeBackoff` at once while the node is in its reconnect back-off,
        the connect error when opening fails, ``Timeout`` when ``timeout`` passes first (the
        attempt goes on in the background for the next caller).
        """
        if self._closed:
            raise ConnectionError_("the pool is closed")
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = _Node(address)
        conn = node.conn
        if conn is not None and not conn.is_closed:
            node.uses += 1
            return conn
        opening = node.opening
        if opening is None:
            loop = asyncio.get_running_loop()
            wait = node.retry_at - loop.time()
            if wait > 0:
                raise NodeBackoff(address, wait, node.last_error)
            opening = node.opening = loop.create_task(self._open(node))
            # its failure is kept as node.last_error; a caller whose deadline came first no
            # longer reads it, which asyncio would report as "never retrieved"
            opening.add_done_callback(_read_outcome)
        try:
            if timeout is None:
                conn = await asyncio.shield(opening)
            else:
                conn = await asyncio.wait_for(asyncio.shield(opening), max(timeout, 0.0))
        except asyncio.TimeoutError:
            raise Timeout(f"connecting to {address[0]}:{address[1]} took longer than "
                          f"{timeout:g}s") from None
        node.uses += 1
        return conn

    async def _open(self, node: _Node) -> Connection:
        host, port = node.address
        loop = asyncio.get_running_loop()
        try:
            if self._connect is not None:
                conn = await self._connect(host, port, self._config)
            else:
                conn = await Connection.connect(host, port, self._config)
        except asyncio.CancelledError:
            node.opening = None
            raise
        except BaseException as exc:
            node.opening = None
            node.failures += 1
            node.last_error = exc
            delay = exponential_delay(self._reconnect_delay, self._reconnect_delay_max,
                                      node.failures, 0.2, symmetric=True)
            node.retry_at = loop.time() + delay
            log.warning("cannot connect to %s:%d (%d in a row, next try in %.2fs): %s", host,
                        port, node.failures, delay, exc)
            self._refresh_topics_on(node.address)
            raise
        node.opening = None
        if self._closed:
            await conn.close()
            raise ConnectionError_("the pool is closed")
        node.conn = conn
        node.failures = 0
        node.last_error = None
        node.retry_at = 0.0
        node.seen_uses = node.uses
        conn.closed.add_done_callback(lambda fut: self._on_closed(node, conn, fut))
        log.debug("connected to %s:%d (%s)", host, port, conn.version or "unknown version")
        return conn

    def _on_closed(self, node: _Node, conn: Connection,
                   fut: asyncio.Future[BaseException | None]) -> None:
        if node.conn is conn:
            node.conn = None
        reason = fut.result()
        if self._closed:
            return
        address = node.address
        for topic in list(self._routes):  # its holds end with it
            self._release(topic, lambda p, a: a == address)
        if reason is not None:
            log.info("connection to %s:%d closed: %s", address[0], address[1], reason)
            self._refresh_topics_on(address)

    def _refresh_topics_on(self, address: Address) -> None:
        for topic, routes in self._routes.items():
            if address in routes.addresses():
                self.refresh(topic)

    def node_failures(self, address: Address) -> int:
        node = self._nodes.get(address)
        return 0 if node is None else node.failures

    @property
    def connections(self) -> dict[Address, Connection]:
        """Open connections by node address (a copy)."""
        return {a: n.conn for a, n in self._nodes.items()
                if n.conn is not None and not n.conn.is_closed}

    # -- idle connections -----------------------------------------------------------------------

    async def _sweep(self) -> None:
        assert self._idle_timeout is not None
        period = max(self._idle_timeout / 2, 0.05)
        while True:
            await asyncio.sleep(period)
            self.close_idle()

    def close_idle(self) -> list[Address]:
        """Close connections unused since the previous sweep; returns their addresses.

        The sweeper runs this every ``idle_timeout / 2`` s, so a connection closes after
        ``idle_timeout / 2`` to ``idle_timeout`` s without use.
        """
        closed = []
        wanted = set()
        for routes in self._routes.values():
            wanted |= routes.addresses()
        for address, node in list(self._nodes.items()):
            conn = node.conn
            if conn is not None:
                if node.uses == node.seen_uses and conn.pending_count == 0:
                    node.conn = None
                    closed.append(address)
                    log.debug("closing idle connection to %s:%d", *address)
                    task = asyncio.get_running_loop().create_task(conn.close())
                    task.add_done_callback(_ignore_result)
                node.seen_uses = node.uses
            elif node.opening is None and address not in wanted and node.failures == 0:
                del self._nodes[address]
        return closed

    def __repr__(self) -> str:
        return f"<PartitionPool topics={len(self._routes)} connections={len(self.connections)}>"


def probe_turn(next_free: float, now: float, period: float, horizon: float) -> float | None:
    """When a publish refused by a partition's leader (not writable now) may try again.

    Retries of one partition take turns ``period`` apart, so a partition is asked about once
    per ``period`` however many publishes wait on it, and the first success wakes the rest
    (:meth:`PartitionPool.writable`). ``next_free`` is the last turn handed out (0 if none).
    Returns the time of this caller's turn, or None when the next free one is more than
    ``horizon`` away: that caller waits on its ordinary back-off for the wake-up instead.
    """
    turn = max(next_free, now) + period
    if turn - now > horizon:
        return None
    return turn


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _ignore_result(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(BaseException):
        task.result()


def _describe(routes: TopicRoutes) -> str:
    if routes.leaders:
        parts = ", ".join(f"{p}->{a[0]}:{a[1]}{' (held)' if p in routes.held else ''}"
                          for p, a in sorted(routes.leaders.items()))
        missing = ""
        if routes.partition_num:
            gone = sorted(set(range(routes.partition_num)) - set(routes.leaders))
            if gone:
                missing = f"; no leader for {gone}"
        return f"{parts}{missing}"
    if routes.nodes:
        return "nodes " + ", ".join(f"{h}:{p}" for h, p in routes.nodes)
    if routes.partition_num:
        return f"no leader for any of {routes.partition_num} partitions"
    return "no nodes"


class LookupRouteSource:
    """Routes from nsqlookupd, through a :class:`smartnsq.lookup.LookupManager`.

    Writers' views (``access="w"``) become :class:`TopicRoutes`: the partition count,
    ``ordered`` and ``ext`` from the topic's meta, each partition's leader, and the producers
    of a classic topic as plain nodes. Builds and owns a manager from ``lookupd`` addresses
    and ``options`` (:class:`~smartnsq.lookup.LookupConfig` fields), or uses the one given as
    ``lookup=`` without closing it (so several producers can share one).
    """

    def __init__(self, lookupd: Iterable[str] | None, *, lookup: LookupManager | None = None,
                 options: Mapping[str, object] | None = None) -> None:
        from .lookup import LookupManager  # imported when used: nsqd=[...] needs no lookup

        self._lookup: LookupManager
        if lookup is not None:
            if not isinstance(lookup, LookupManager):
                raise InvalidArgument("lookup", "must be a smartnsq.lookup.LookupManager",
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
        """The :class:`~smartnsq.lookup.LookupManager` behind these routes."""
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
            await self._lookup.view(topic, "w", refresh=True, timeout=ROUND_TIMEOUT)
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


def _read_outcome(task: asyncio.Task[Any]) -> None:
    """Mark a background dial's outcome as read (its error is recorded on the node)."""
    if not task.cancelled():
        task.exception()
