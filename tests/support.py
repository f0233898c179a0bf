"""Helpers shared by the test suites: waiting on events instead of sleeping.

``tests/conftest.py`` puts this directory on ``sys.path``, so test modules simply
``from support import Watch, watch_channels, wait_until``.

A test that sleeps to wait for something is flaky. What a test waits for changes in one of
two places, and both can signal:

* in a handler the test wrote: the handler calls ``Watch.poke()`` after recording what it got
  (from any thread: the sync facade runs handlers in worker threads);
* on a dev-cluster channel (FIN, REQ, RDY, deliveries, timeouts, a consumer leaving):
  ``watch_channels(watch, channel, ...)`` makes the channel poke the watch after each change;
* inside the library, where a component logs what it does (a producer logs each failed
  attempt before retrying): ``with poke_on_log(watch, "smartnsq.producer"):``.

``await watch.until(condition)`` then re-checks ``condition`` only when it may have changed,
with a timeout. ``wait_until`` (polling) remains for the rare state nothing signals; prefer a
watch wherever there is a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

WAIT = 20.0
"""The bound of every wait in the suites (one value, here): long enough for a loaded 2-core CI
box and a cluster failover, never reached when the awaited thing happens. Spark's suites wait
longer (a JVM starts), and a stress test derives its bound from its message count."""


DEADLINE_SLACK = 1.0
"""How far past its timeout a public call may finish: no public call outlives its timeout by
more than 1 s; precise figures belong in bench/, not in tests."""


_names = itertools.count(1)


def fresh_name(prefix: str) -> str:
    """A topic or channel name no other test of this run uses (the real cluster of a shape
    is shared by the whole session, so fixed names would collide)."""
    return f"{prefix}-{os.getpid() % 100000}-{next(_names)}"


class DeadlineExceeded(AssertionError):
    """A public call outlived its timeout by more than :data:`DEADLINE_SLACK`."""


@contextlib.contextmanager
def keeps_deadline(timeout: float, slack: float = DEADLINE_SLACK) -> Iterator[None]:
    """Check that the block (one public call, sync or async) ends within ``timeout + slack``.

    Whatever the block raises passes through; if it took too long, the check fails with how
    long it took. Used around every call the fault tests make, so a call that ignores its
    deadline fails the test that provoked it.
    """
    started = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - started
        if took > timeout + slack:
            raise DeadlineExceeded(f"took {took:.2f}s against a timeout of {timeout}s")


@contextlib.asynccontextmanager
async def bounded(timeout: float, slack: float = DEADLINE_SLACK) -> AsyncIterator[None]:
    """``keeps_deadline`` that also cancels the block at ``timeout + slack + 1`` so a call that
    would hang forever fails the test instead of hanging the suite."""
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def cancel() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    with keeps_deadline(timeout, slack):
        handle = asyncio.get_running_loop().call_later(timeout + slack + 1.0, cancel)
        try:
            yield
        except asyncio.CancelledError:
            if fired:
                raise DeadlineExceeded(f"still running {timeout + slack + 1.0:.1f}s after "
                                       f"being given {timeout}s") from None
            raise
        finally:
            handle.cancel()


class Watch:
    """Conditions re-checked each time something they read may have changed.

    ``poke()`` is cheap and safe from any thread; waiters live on the loop that called
    ``until()``. Registering a waiter before checking the condition makes the pair race-free:
    a change either happened before the check (seen by it) or pokes the registered waiter.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def poke(self) -> None:
        """Something changed: re-check the waiting conditions (on the waiters' loop)."""
        loop = self._loop
        if loop is None or not self._waiters:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._check()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._check)

    def _check(self) -> None:
        for entry in list(self._waiters):
            condition, future = entry
            if future.done():
                continue
            try:
                if condition():
                    future.set_result(None)
            except Exception as exc:  # a broken condition fails the wait, not the poker
                future.set_exception(exc)

    async def until(self, condition: Callable[[], bool], timeout: float = WAIT,
                    what: str | None = None) -> None:
        """Return once ``condition()`` holds; ``TimeoutError`` naming ``what`` past ``timeout``."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a Watch serves the waiters of one event loop")
        future: asyncio.Future[None] = loop.create_future()
        entry = (condition, future)
        self._waiters.append(entry)
        try:
            if condition():
                return
            try:
                await asyncio.wait_for(future, timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"not reached in {timeout} s: {what or condition}") from None
        finally:
            self._waiters.remove(entry)
            if not future.done():
                future.cancel()


_HOOKED: weakref.WeakKeyDictionary[Any, list[Watch]] = weakref.WeakKeyDictionary()


def watch_channels(watch: Watch, *channels: Any) -> Watch:
    """Make dev-cluster channels poke ``watch`` after every change of their state.

    Every change of a ``smartnsq.devcluster`` channel (FIN, REQ, a message timing out, RDY, a
    consumer joining or leaving, a publish) ends by scheduling a dispatch, and dispatching is
    what changes in-flight counts: observing those two calls sees every change without
    altering what the server does. Returns ``watch`` for chaining.
    """
    for channel in channels:
        watches = _HOOKED.get(channel)
        if watches is None:
            watches = _HOOKED[channel] = []
            _observe(channel, watches)
        if watch not in watches:
            watches.append(watch)
    return watch


def _observe(channel: Any, watches: list[Watch]) -> None:
    schedule_pump = channel.schedule_pump
    pump = channel.pump

    def schedule_pump_observed() -> None:
        schedule_pump()
        for watch in list(watches):
            watch.poke()

    def pump_observed() -> None:
        pump()
        for watch in list(watches):
            watch.poke()

    # instance attributes shadow the methods: the channel's own ``self.schedule_pump()`` and
    # ``loop.call_soon(self.pump)`` go through them too
    channel.schedule_pump = schedule_pump_observed
    channel.pump = pump_observed


async def channel_reaches(channel: Any, condition: Callable[[], bool], timeout: float = WAIT,
                          what: str | None = None) -> None:
    """Wait until ``condition()`` (reading ``channel``'s server-side state) holds."""
    watch = watch_channels(Watch(), channel)
    try:
        await watch.until(condition, timeout, what)
    finally:
        unwatch_channels(watch, channel)


def unwatch_channels(watch: Watch, *channels: Any) -> None:
    """Stop poking ``watch`` from these channels."""
    for channel in channels:
        watches = _HOOKED.get(channel)
        if watches is not None and watch in watches:
            watches.remove(watch)


class _PokeHandler(logging.Handler):
    def __init__(self, watch: Watch) -> None:
        super().__init__(logging.DEBUG)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        self.watch.poke()


@contextlib.contextmanager
def poke_on_log(watch: Watch, logger: str) -> Iterator[Watch]:
    """Poke ``watch`` on every record ``logger`` emits (its level lowered to DEBUG meanwhile).

    For library state that has no hook but is logged as it changes: the condition reads the
    state itself, the log record only says "look again", so no message text is relied on.
    """
    target = logging.getLogger(logger)
    handler = _PokeHandler(watch)
    level = target.level
    target.addHandler(handler)
    target.setLevel(logging.DEBUG)
    try:
        yield watch
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


async def wait_until(condition: Callable[[], bool], timeout: float = WAIT,
                     interval: float = 0.005) -> None:
    """Poll ``condition`` until it holds (bounded by ``timeout``).

    Last resort, for states nothing signals (what a consumer has taken in but not yet handed
    to a handler): prefer ``Watch.until`` with a poke from where the state changes.
    """
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(interval)

    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"not reached in {timeout} s: {condition}") from None


async def settled_lag(consumer: Any, timeout: float = 10.0) -> Any:
    """``consumer.lag()`` once the nodes have taken in every answer it sent: depth and
    in-flight 0 on every partition that answered, polled (a server counter: nothing signals
    it; a real youzan channel counts a message in its depth until the FIN is processed).
    Bounded by ``timeout``; the last reading is returned either way, for the test to check."""
    deadline = time.monotonic() + timeout
    async with bounded(timeout + 5):
        while True:
            lag = await consumer.lag()
            if all(p.depth == 0 and p.in_flight == 0 for p in lag.partitions
                   if p.error is None) or time.monotonic() >= deadline:
                return lag
            await asyncio.sleep(0.1)


class BackgroundCluster:
    """A dev cluster on a loop thread of its own, as a remote cluster is to blocking code.

    ``topics`` maps each topic to create to its partition count (one replica each);
    ``options`` go to ``DevCluster`` (``proxied=True`` for connection faults).
    """

    def __init__(self, nodes: int, topics: dict[str, int], wait: float = 10.0,
                 **options: Any) -> None:
        from smartnsq.devcluster import DevCluster
        from smartnsq.transport.loop_thread import LoopThread

        self.wait = wait
        self.thread = LoopThread("devcluster").start()

        async def start() -> DevCluster:
            cluster = DevCluster(nodes=nodes, lookupds=1, **options)
            await cluster.start()
            for topic, partitions in topics.items():
                await cluster.create_topic(topic, partitions=partitions, replicas=1)
            return cluster

        self.cluster = self.thread.run(start(), wait)

    @property
    def lookupd(self) -> list[str]:
        return list(self.cluster.lookupd_http_addresses)

    def messages(self, topic: str, partition: int) -> list[Any]:
        return self.thread.call(
            lambda: list(self.cluster.state.topics[topic].partitions[partition].log.messages))

    def stop(self) -> None:
        self.thread.run(self.cluster.stop(), self.wait)
        self.thread.stop()


def http_capture(name: str) -> tuple[int, bytes]:
    """``(HTTP status, body)`` of a captured HTTP answer in ``tests/fixtures`` (the youzan and
    the classic capture layouts: comment lines, the status line, headers, a blank line)."""
    from capture import FIXTURES  # the captures' one home (tests/fixtures)

    lines = (FIXTURES / name).read_bytes().split(b"\n")
    i = 0
    while not lines[i].startswith(b"HTTP"):
        i += 1
    status = int(lines[i].split()[1])
    i += 1
    while lines[i].strip():
        i += 1
    return status, b"\n".join(lines[i + 1:]).strip()


def slow_topic_creation(cluster: Any, sends_needed: int,
                        topics: Iterable[str] | None = None) -> list[str]:
    """Make the dev cluster's leader lookupd create topics as the real one does (docs/protocol.md
    §10.1; docs/devcluster.md, "Slow topic creation"): the partitions get leaders only with the
    ``sends_needed``-th ``/topic/create`` of the topic (``topics``: only these). Returns the
    list each send's topic name is appended to.

    Counted in sends, where the fault profile's ``slow_creation`` runs on a clock: a test needs
    a re-sent create, not a wait.
    """
    state = cluster.state
    original = state.create_topic
    only = None if topics is None else set(topics)
    sends: list[str] = []
    leaders: dict[tuple[str, int], str | None] = {}

    def create_topic(name: str, *args: Any, **kwargs: Any) -> Any:
        info = original(name, *args, **kwargs)
        if only is not None and name not in only:
            return info
        sends.append(name)
        for p in info.partitions:
            leaders.setdefault((name, p.partition), p.leader)
            ready = sends.count(name) >= sends_needed
            p.leader = leaders[(name, p.partition)] if ready else None
        return info

    state.create_topic = create_topic
    return sends


# -- what the dev cluster stored, and ports nobody listens on --------------------------------

def stored(cluster: Any, topic: str) -> dict[bytes, list[int]]:
    """body -> the partitions of a youzan topic it is stored in (the dev cluster's logs)."""
    where: dict[bytes, list[int]] = {}
    for part in cluster.state.topics[topic].partitions:
        for msg in part.log.messages:
            where.setdefault(msg.body, []).append(part.partition)
    return where


def classic_bodies(cluster: Any, topic: str) -> list[bytes]:
    """Every body a classic topic holds, over the dev cluster's nodes."""
    out: list[bytes] = []
    for i in range(len(cluster.nodes)):
        copy = cluster.state.classic_partition(topic, cluster.node_info(i).node_id,
                                               create=False)
        if copy is not None:
            out.extend(m.body for m in copy.log.messages)
    return out


def closed_port() -> int:
    """A loopback port that was free a moment ago (nothing listens on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rows(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a command's output."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def cli(*argv: str, stdin: str = "", timeout: float = 120.0) -> tuple[int, str, str]:
    """``smartnsq ARGV...`` run in-process (in a thread: the command runs its own loop):
    exit code, stdout, stderr; ``timeout`` bounds a command that would hang."""
    import io

    from smartnsq.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.wait_for(asyncio.to_thread(
        main, list(argv), stdin=io.StringIO(stdin), stdout=out, stderr=err), timeout)
    return code, out.getvalue(), err.getvalue()
