"""The publishers' route book: each topic's current routes, who waits on them, and when to ask.

A :class:`RouteBook` keeps the latest :class:`~smartnsq.model.routes.TopicRoutes` of every
topic a producer uses, replaced whenever its route source reports a change, and carries out
the decisions of :mod:`smartnsq.model.failover` with timers:

* **Waiting for a change** (:meth:`RouteBook.changed`): a future that settles at the next route
  change of the topic (or a success of the partition waited for), or after a timeout. While
  anyone waits, the topic is chased (:class:`~smartnsq.model.failover.Chase`): rounds of their
  own every ``wait_refresh / 2`` s in the first ``FAST_POLL_FOR`` s, then a refresh every
  ``wait_refresh`` s as the lookup manager spaces them.
* **Holds.** A partition that vanishes from the writers' lookup while its leader's connection
  stays open is *held* on that leader (``TopicRoutes.held``): youzan hides a partition that
  refuses writes (a dead replica, an ISR shrink, a catch-up) although its leader is alive,
  and that leader is the first to know when writes work again. Pinned publishes keep going
  there (they get ``E_FAILED_ON_NOT_WRITABLE`` and probe again, one at a time per partition,
  the turns further apart per refusal up to ``PROBE_PERIOD_MAX``:
  :meth:`RouteBook.probe_delay`); unpinned ones skip held partitions. A hold ends when lookup
  names a leader again, the connection closes, or the node answers that it does not lead the
  partition or leaves a publish unanswered (a stalled node: a probe would only queue behind
  the stalled request); a partition dropped or released while its leader was stalled is held
  again (:meth:`RouteBook.rehold`) by the next publish waiting for it once that leader answers.
* **After a failed publish** (:meth:`RouteBook.after_failure`): tell the book what failed,
  then wait the delay the retry decision chose, shortened by a reheld partition or a probe
  turn, woken early by a route change.
* **A deleted topic** (:meth:`RouteBook.forget`): once lookup says a topic a node refused
  does not exist, its routes go, so publishes fail at their lookup rather than on the nodes.

The book owns no connection: whether a node's connection is open and answering is asked of
the pool through the two callables it is built with.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..model import failover as policy
from ..model.failover import Chase, ProbePace, holds, wait_delay
from ..model.routes import Address, RouteSource, TopicRoutes, address_text, describe
from .race import outcome_read

__all__ = ["Pause", "RouteBook"]

log = logging.getLogger("smartnsq.pool")  # (the logger users already filter on)

NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
_NOT_REFUSING = ProbePace()


class RouteBook:
    """Routes per topic, their waiters, chases, probe turns and holds; see the module
    docstring. ``answering(address)``: the node's connection is open and owes no timed-out
    answer; ``connected(address)``: it is open; ``fresh(addresses)``: nodes that just
    (re)appeared in a route (worth dialling again at once)."""

    def __init__(self, source: RouteSource, *, wait_refresh: float,
                 answering: Callable[[Address], bool], connected: Callable[[Address], bool],
                 fresh: Callable[[Iterable[Address]], None]) -> None:
        self._source = source
        # a source of this library's, or one written before ``refresh(now=)`` existed
        self._rounds_at_once = "now" in inspect.signature(source.refresh).parameters
        self._wait_refresh = wait_refresh
        self._answering = answering
        self._connected = connected
        self._fresh = fresh
        self._routes: dict[str, TopicRoutes] = {}
        self.get: Callable[[str], TopicRoutes | None] = self._routes.get
        """The routes of a topic known now, or None (the dict's own ``get``: every publish
        reads it, so no Python frame in between)."""
        self._loading: dict[str, asyncio.Task[TopicRoutes]] = {}
        # waiters per topic, each for any change (partition None) or for one partition
        self._waiters: dict[str, list[tuple[asyncio.Future[None], int | None]]] = {}
        self.polling: dict[str, asyncio.TimerHandle] = {}  # chase timers while waited on
        self._chases: dict[str, Chase] = {}
        # per refusing partition: refusals in a row and its next free probe turn
        self._probes: dict[tuple[str, int], ProbePace] = {}
        # partitions dropped by lookup while their leader was stalled: that leader, to hold
        # them on once it answers again (``rehold``)
        self._lost: dict[tuple[str, int], Address] = {}
        self._closed = False
        self.leader_changes = 0  # partitions seen moving to another leader (for stats())
        source.subscribe(self._on_routes)

    @property
    def source(self) -> RouteSource:
        return self._source

    async def close(self) -> None:
        """Settle every waiter, stop every timer and lookup in flight."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._loading.values())
        for task in tasks:
            task.cancel()
        for waiters in self._waiters.values():
            for waiter, _ in waiters:
                _settle(waiter)
        self._waiters.clear()
        for handle in self.polling.values():
            handle.cancel()
        self.polling.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- routes -------------------------------------------------------------------------------

    def known(self) -> list[TopicRoutes]:
        return list(self._routes.values())

    def addresses(self) -> set[Address]:
        """Every node some topic's routes name now."""
        wanted: set[Address] = set()
        for routes in self._routes.values():
            wanted |= routes.addresses()
        return wanted

    async def load(self, topic: str) -> TopicRoutes:
        """The routes, looked up once if unknown; concurrent callers share one lookup."""
        routes = self._routes.get(topic)
        if routes is not None:
            return routes
        task = self._loading.get(topic)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(topic))
            self._loading[topic] = task
            # a caller whose deadline came first leaves the lookup running for the next one;
            # its failure, if nobody is left to read it, must not be "never retrieved"
            task.add_done_callback(outcome_read)
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

    def refresh_on(self, address: Address) -> None:
        """Refresh every topic routed to ``address`` (a dead node is usually a leader about
        to be replaced)."""
        for topic, routes in self._routes.items():
            if address in routes.addresses():
                self.refresh(topic)

    def forget(self, topic: str) -> None:
        """Lookup says ``topic`` does not exist (deleted): drop its routes, probe turns and
        holds. The next publish then looks it up and fails at once, instead of writing to
        nodes that refuse it until its deadline; whoever waits on the topic wakes to find out.
        A topic created again comes back with the lookup's next answer."""
        self._routes.pop(topic, None)
        for key in [k for k in (*self._probes, *self._lost) if k[0] == topic]:
            self._probes.pop(key, None)
            self._lost.pop(key, None)
        for waiter, _ in self._waiters.pop(topic, ()):
            _settle(waiter)

    def node_closed(self, address: Address) -> None:
        """The connection to ``address`` closed: the holds on it end with it."""
        for topic in list(self._routes):
            self._release(topic, lambda p, a: a == address)

    # -- waiting ------------------------------------------------------------------------------

    def changed(self, topic: str, timeout: float,
                partition: int | None = None) -> asyncio.Future[None]:
        """A future settling at the next route change of ``topic``, or after ``timeout`` s.

        With a ``partition``, it also settles when a publish to that partition succeeds again
        (:meth:`writable`). It never raises; waiting on it is how callers back off without
        missing a recovery. While it is pending the topic is chased (module docstring).
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if self._closed:
            waiter.set_result(None)
            return waiter
        self._waiters.setdefault(topic, []).append((waiter, partition))
        handle = loop.call_later(max(timeout, 0.0), _settle, waiter)
        waiter.add_done_callback(lambda _: handle.cancel())
        if topic not in self.polling and self._wait_refresh > 0:
            self._chases[topic] = self._chases.get(topic, Chase()).waited(
                loop.time(), policy.FAST_POLL_REARM)
            self.polling[topic] = loop.call_later(self._wait_refresh / 2, self._poll_waited,
                                                  topic)
        return waiter

    def _poll_waited(self, topic: str) -> None:
        """One step of the chase of ``topic`` while someone still waits on it."""
        del self.polling[topic]
        waiters = self._waiters.get(topic)
        if waiters:
            waiters[:] = [w for w in waiters if not w[0].done()]
        if not waiters or self._closed:
            self._waiters.pop(topic, None)
            return
        loop = asyncio.get_running_loop()
        step = self._chases[topic].step(loop.time(), fast_for=policy.FAST_POLL_FOR,
                                        fast_period=self._wait_refresh / 2,
                                        period=self._wait_refresh)
        self.refresh(topic, now=step.own_round)
        if step.next_in is not None:
            self.polling[topic] = loop.call_later(step.next_in, self._poll_waited, topic)

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
        :class:`~smartnsq.model.failover.ProbePace`: turns ``period`` apart at first, the gap
        doubling per refusal up to ``PROBE_PERIOD_MAX``): seconds to wait, or None when no
        turn is free within ``horizon`` (the caller's own back-off: it waits that, woken
        early by :meth:`writable` or a route change)."""
        key = (topic, partition)
        now = asyncio.get_running_loop().time()
        self._probes[key], turn = self._probes.get(key, _NOT_REFUSING).turn(now, period, horizon)
        if turn is None:
            return None
        return turn - now

    def after_failure(self, topic: str, partition: int | None, delay: float, *,
                      refresh: bool, refused_by: Address | None, code: str | None,
                      no_leader: bool, probe: bool, probe_period: float) -> Pause:
        """What a publisher does between a failed attempt and the next one, in one place:
        learn what failed, and say how long to wait (then :meth:`Pause.wait`).

        ``partition``: the partition the attempt went to (or None); ``delay``: the back-off
        the retry decision chose; ``refresh``: it asked for fresh routes, ``refused_by`` the
        node that refused the write (``code`` its error, None when no answer came in time);
        ``no_leader``: the partition (kept) had no leader in the routes; ``probe``: the
        partition refused writes for now and the caller may take a probe turn
        (``probe_period`` apart).
        """
        if refresh:
            if refused_by is not None:
                self.leader_failed(topic, partition, refused_by, code)
            else:
                self.refresh(topic)
        reheld = no_leader and partition is not None and self.rehold(topic, partition)
        probing = partition if probe else None
        turn = None
        if probing is not None:  # the partition's next probe turn, if one comes sooner
            turn = self.probe_delay(topic, probing, probe_period, 0.0 if reheld else delay)
        return Pause(self, topic, wait_delay(delay, reheld=reheld, turn=turn), probing)

    # -- holds --------------------------------------------------------------------------------

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
            log.info("routes of %r changed: %s", routes.topic, describe(routes))
        else:
            log.debug("routes of %r: %s", routes.topic, describe(routes))
        # a node that (re)appears as a target is worth dialling again at once
        self._fresh(routes.addresses() - (old.addresses() if old is not None else set()))
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
        decided = holds(old.leaders, routes.leaders, routes.partition_num, self._answering,
                        self._connected)
        lost.update(((topic, p), a) for p, a in decided.lost.items())
        if not decided.held:
            return routes
        return replace(routes, leaders={**routes.leaders, **decided.held},
                       held=frozenset(decided.held))

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
        log.debug("%s refused %s/%s (%s); refreshing routes", address_text(address), topic,
                  partition, code)
        if code is None:
            # no answer in time (a stalled node): what is sent there now only queues behind
            # the stalled request and is written when it ends, so hold nothing on it
            self._release(topic, lambda p, a: a == address, remember=True)
        elif code != NOT_WRITABLE:
            # not the leader (or no such partition there): no place to hold the partition on
            self._release(topic, lambda p, a: p == partition and a == address)
            if partition is not None and self._lost.get((topic, partition)) == address:
                del self._lost[(topic, partition)]
        self.refresh(topic)


class Pause:
    """A publisher's wait after a failure (:meth:`RouteBook.after_failure`): ``delay`` s,
    woken early by a route change of ``topic`` (or a success of ``partition``)."""

    __slots__ = ("_book", "delay", "partition", "topic")

    def __init__(self, book: RouteBook, topic: str, delay: float,
                 partition: int | None) -> None:
        self._book = book
        self.topic = topic
        self.delay = delay
        self.partition = partition

    async def wait(self) -> None:
        if self.delay > 0:
            await self._book.changed(self.topic, self.delay, self.partition)


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
