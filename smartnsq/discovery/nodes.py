"""Partition-keyed connections: (topic, partition) -> the leader's connection.

The pool holds one connection per nsqd *address*, so every partition a node leads, of every
topic, shares one connection: nsqd serves any partition over any connection (the partition
travels in each command) and one busy connection coalesces writes better than many idle ones.
Which node leads which partition, how sure we are and when to ask again is the route book's
(:class:`smartnsq.discovery.route_book.RouteBook`, reached as :attr:`NodePool.book`): a leader
change moves a key by itself, since the next publish reads the new route and takes (or opens) the
new leader's connection.

Failures never spin. A node whose connect fails is not dialled again before a back-off that
doubles per consecutive failure (``reconnect_delay`` .. ``reconnect_delay_max``, jittered);
the failure also asks for a refresh of every topic routed to it, since a dead node is usually
a leader about to be replaced. Callers asking for that node meanwhile get
:class:`NodeBackoff` at once, with the time left, and wait on a route change (which settles
early when the routes move). A node that reappears in a route gets a fresh chance at once.

Connections nobody used for ``idle_timeout`` seconds (and with nothing pending) are closed by
a sweeper task; the next use reopens them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from ..config import ConnectionConfig
from ..errors import ConnectionFailed, NodeBackoff, Timeout
from ..model.backoff import exponential_delay
from ..model.routes import (
    Address,
    RoutesCallback,
    RouteSource,
    TopicRoutes,
    address_text,
)
from ..transport.connection import Connection
from .race import outcome_read
from .route_book import RouteBook

# NodePool with the route names its callers hand it (defined in model.routes and route_source)
__all__ = [
    "Address",
    "NodePool",
    "RoutesCallback",
]

log = logging.getLogger("smartnsq.pool")


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


class NodePool:
    """One shared connection per node, found by the routes of the pool's :attr:`book`; see
    the module docstring."""

    def __init__(self, source: RouteSource, config: ConnectionConfig | None = None, *,
                 idle_timeout: float | None = 300.0, reconnect_delay: float = 0.05,
                 reconnect_delay_max: float = 2.0, wait_refresh: float = 0.1,
                 connect: Callable[[str, int, ConnectionConfig], Awaitable[Connection]]
                 | None = None) -> None:
        self._source = source
        self._config = config or ConnectionConfig()
        self._idle_timeout = idle_timeout
        self._reconnect_delay = reconnect_delay
        self._reconnect_delay_max = reconnect_delay_max
        self._connect = connect
        self._nodes: dict[Address, _Node] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self.book = RouteBook(source, wait_refresh=wait_refresh, answering=self._answering,
                              connected=self.connection_open, fresh=self._fresh)
        """Who leads what, the waits on it and the holds
        (:class:`smartnsq.discovery.route_book.RouteBook`)."""
        self.routes: Callable[[str], TopicRoutes | None] = self.book.get
        """The routes of a topic known now (``None`` before its first lookup): the book's,
        bound here once, as every publish reads them."""

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
        conns = []
        for node in self._nodes.values():
            if node.opening is not None:
                node.opening.cancel()
                tasks.append(node.opening)
            if node.conn is not None:
                conns.append(node.conn)
        await self.book.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        self._nodes.clear()
        await self._source.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- routes (the book's; kept here for the callers that take them with a connection) ----

    @property
    def leader_changes(self) -> int:
        """Partitions seen moving to another leader (for stats())."""
        return self.book.leader_changes

    def known_routes(self) -> list[TopicRoutes]:
        """The routes of every topic known now."""
        return self.book.known()

    async def load_routes(self, topic: str) -> TopicRoutes:
        """The routes, looked up once if unknown; concurrent callers share one lookup."""
        return await self.book.load(topic)

    def refresh(self, topic: str, *, now: bool = False) -> None:
        self.book.refresh(topic, now=now)

    def changed(self, topic: str, timeout: float,
                partition: int | None = None) -> asyncio.Future[None]:
        """:meth:`RouteBook.changed <smartnsq.discovery.route_book.RouteBook.changed>`."""
        return self.book.changed(topic, timeout, partition)

    def writable(self, topic: str, partition: int | None) -> None:
        """:meth:`RouteBook.writable <smartnsq.discovery.route_book.RouteBook.writable>`."""
        self.book.writable(topic, partition)

    def _fresh(self, addresses: Iterable[Address]) -> None:
        """Nodes that (re)appeared in a route get a fresh chance at once."""
        for address in addresses:
            node = self._nodes.get(address)
            if node is not None:
                node.retry_at = 0.0

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
        routes = self.book.get(topic)
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
            raise ConnectionFailed("the pool is closed")
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
                raise NodeBackoff(address, wait, node.last_error, address_text(address))
            opening = node.opening = loop.create_task(self._open(node))
            # its failure is kept as node.last_error; a caller whose deadline came first no
            # longer reads it, which asyncio would report as "never retrieved"
            opening.add_done_callback(outcome_read)
        try:
            if timeout is None:
                conn = await asyncio.shield(opening)
            else:
                conn = await asyncio.wait_for(asyncio.shield(opening), max(timeout, 0.0))
        except asyncio.TimeoutError:
            assert timeout is not None
            if timeout <= 0:  # the caller's deadline passed on its way here
                raise Timeout(f"connecting to {address_text(address)}: the call's deadline "
                              "had passed before the connection could open") from None
            raise Timeout(f"connecting to {address_text(address)} took longer than the "
                          f"call's deadline left ({timeout:.3g}s)") from None
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
            log.warning("cannot connect to %s (%d in a row, next try in %.2fs): %s",
                        address_text(node.address), node.failures, delay, exc)
            self.book.refresh_on(node.address)
            raise
        node.opening = None
        if self._closed:
            await conn.close()
            raise ConnectionFailed("the pool is closed")
        node.conn = conn
        node.failures = 0
        node.last_error = None
        node.retry_at = 0.0
        node.seen_uses = node.uses
        conn.closed.add_done_callback(lambda fut: self._on_closed(node, conn, fut))
        log.debug("connected to %s (%s)", address_text(node.address),
                  conn.version or "unknown version")
        return conn

    def _on_closed(self, node: _Node, conn: Connection,
                   fut: asyncio.Future[BaseException | None]) -> None:
        if node.conn is conn:
            node.conn = None
        reason = fut.result()
        if self._closed:
            return
        address = node.address
        self.book.node_closed(address)  # its holds end with it
        if reason is not None:
            log.info("connection to %s closed: %s", address_text(address), reason)
            self.book.refresh_on(address)

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
        wanted = self.book.addresses()
        for address, node in list(self._nodes.items()):
            conn = node.conn
            if conn is not None:
                if node.uses == node.seen_uses and conn.pending_count == 0:
                    node.conn = None
                    closed.append(address)
                    log.debug("closing idle connection to %s", address_text(address))
                    task = asyncio.get_running_loop().create_task(conn.close())
                    task.add_done_callback(outcome_read)
                node.seen_uses = node.uses
            elif node.opening is None and address not in wanted and node.failures == 0:
                del self._nodes[address]
        return closed

    def __repr__(self) -> str:
        return (f"<NodePool topics={len(self.book.known())} "
                f"connections={len(self.connections)}>")
