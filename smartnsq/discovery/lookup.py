"""Topic views from nsqlookupd, kept fresh: what a client reads of who leads which partition.

A :class:`LookupManager` keeps one view per (topic, access) and hands it out without I/O once
known; the lookupds it asks, their health and their discovery are
:class:`~smartnsq.discovery.lookupds.LookupdSet`'s (see that module for how a round asks them).

* **Addresses.** ``host:port``, ``http://host:port`` or ``https://host:port``
  (:func:`normalize_lookupd`); https lookupds are asked over TLS (``tls_ca_file``,
  ``tls_verify``). Anything else is refused when the manager is built.
* **Freshness.** The first lookup of a topic happens at once; watched topics are polled every
  ``poll_interval`` (shortened by a random ``jitter`` so clients started together spread out).
  :meth:`LookupManager.refresh` asks for an extra round in the background; a burst of such
  requests (every publish failing on a moved leader) makes one round.
* **Changes.** Subscribers get a :class:`TopicChange` whenever a view changes: which leaders
  moved, which partitions appeared or disappeared.

Parsing lives in the sans-I/O :mod:`smartnsq.protocol.lookup`; this module only does timing
and bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

from ..config import Rule, check_fields, doc, flag, integer, number, refuse_unknown, seconds, text
from ..errors import InvalidArgument, LookupFailed, LookupTimeout, TopicNotFound
from ..model.backoff import exponential_delay
from ..model.lookupd_health import LookupdStatus
from ..model.routes import address_list
from ..protocol.identify import USER_AGENT
from ..protocol.lookup import Node, TopicView, valid_host
from ..protocol.numbers import check_number
from ..protocol.validate import MAX_PARTITION, ascii_int, check_topic
from ..transport.http import HttpClient
from .lookupds import LookupdSet, loop_time

__all__ = [
    "LookupConfig",
    "LookupManager",
    "TopicChange",
    "normalize_lookupd",
]

log = logging.getLogger("smartnsq.lookup")

Key = tuple[str, str]  # (topic, access)
ChangeCallback = Callable[["TopicChange"], None]
T = TypeVar("T")
_ACCESSES = ("r", "w")


@dataclass(frozen=True)
class LookupConfig:
    """How lookupds are asked, how often, and how failures are handled."""

    poll_interval: float = field(default=60.0, metadata=doc(
        "How often each watched topic is looked up again.", unit="s", check=seconds()))
    jitter: float = field(default=0.3, metadata=doc(
        "Each poll interval is shortened by up to this fraction, at random, so clients "
        "started together do not poll together.",
        check=number(0, high=1, what="fraction")))
    timeout: float = field(default=5.0, metadata=doc(
        "Deadline of one whole HTTP request to a lookupd (connect, send, read the complete "
        "answer): a lookupd sending one byte per second is cut off here.",
        unit="s", check=seconds()))
    answer_grace: float = field(default=0.05, metadata=doc(
        "Once one lookupd has answered a round, how much longer the others are waited for; "
        "the round then goes on with the answers it has (late ones only update health).",
        unit="s", check=seconds(low_open=False)))
    max_answer_size: int = field(default=4 * 1024 * 1024, metadata=doc(
        "Largest lookupd answer read; a longer one is refused (and the lookupd counted as "
        "malformed) without being read to the end.", unit="bytes", check=integer(1024, 2**31 - 1)))
    max_partitions: int = field(default=MAX_PARTITION + 1, metadata=doc(
        "Most partitions an answer may list (and partition ids stay below it); partition ids "
        "are 0..1023 whatever it says (the one partition limit, as for publish's partition=).",
        check=integer(1, MAX_PARTITION + 1)))
    max_nodes: int = field(default=4096, metadata=doc(
        "Most producers (nsqd) an answer may list.", check=integer(1, 1_000_000)))
    tls_verify: bool = field(default=True, metadata=doc(
        "Verify the certificate of https:// lookupds.", check=flag()))
    tls_ca_file: str | None = field(default=None, metadata=doc(
        "CA bundle (PEM) for https:// lookupds; None uses the system store.",
        check=Rule("path or None", text(optional=True).check)))
    connect_timeout: float = field(default=2.0, metadata=doc(
        "Deadline of the TCP connect to a lookupd (capped by timeout).", unit="s",
        check=seconds()))
    discover_interval: float = field(default=60.0, metadata=doc(
        "How often the seeds' /listlookup is read again to learn the cluster's lookupds.",
        unit="s", check=seconds()))
    attempts: int = field(default=3, metadata=doc(
        "Rounds tried per lookup when no lookupd answers at all.",
        check=integer(1, 100)))
    retry_delay: float = field(default=0.1, metadata=doc(
        "First wait between such rounds; it doubles, with jitter.", unit="s",
        check=seconds(low_open=False), concept="attempt"))
    retry_delay_max: float = field(default=2.0, metadata=doc(
        "Longest wait between such rounds.", unit="s",
        check=seconds("retry_delay", low_open=False), concept="attempt"))
    refresh_delay: float = field(default=0.02, metadata=doc(
        "An on-demand refresh waits this long before asking, so a burst of requests makes "
        "one round.", unit="s", check=seconds(low_open=False)))
    refresh_min_interval: float = field(default=0.1, metadata=doc(
        "After an on-demand refresh round that found nothing new, the next one of the topic "
        "starts at least this long after it; the gap doubles per such round. A round that "
        "finds a change resets it, so the refresh after a leader move goes at once.",
        unit="s", check=seconds(low_open=False), concept="refresh"))
    refresh_max_interval: float = field(default=0.1, metadata=doc(
        "Longest gap between on-demand refresh rounds of one topic (while it keeps finding "
        "nothing new, e.g. a partition without leader during a failover).",
        unit="s", check=seconds("refresh_min_interval", low_open=False), concept="refresh"))
    backoff: float = field(default=1.0, metadata=doc(
        "How long a lookupd that just failed is skipped; doubles per consecutive failure.",
        unit="s", check=seconds(), concept="skip"))
    backoff_max: float = field(default=60.0, metadata=doc(
        "Longest a failing lookupd is skipped before it is probed again.",
        unit="s", check=seconds("backoff", low_open=False), concept="skip"))
    forget_after: int = field(default=5, metadata=doc(
        "Consecutive failures after which a discovered (non-seed) lookupd is dropped until "
        "/listlookup names it again; seeds are never dropped.", check=integer(1, 1000)))
    trust_env: bool = field(default=False, metadata=doc(
        "Send requests to http:// lookupds through the proxy the environment names "
        "(HTTP_PROXY, NO_PROXY); https:// lookupds are always asked directly.",
        check=flag()))
    user_agent: str = field(default=USER_AGENT, metadata=doc(
        "User-Agent header of lookupd requests.", check=text()))

    def __post_init__(self) -> None:
        check_fields(self)


_LOOKUPD_RULE = "must be 'host:http_port', 'http://host:http_port' or 'https://host:http_port'"


def normalize_lookupd(address: str) -> str:
    """``"host:port"`` from ``"host:port"``, ``"http://host:port/"`` or ``" host:port "``;
    ``"https://host:port"`` keeps its scheme (the lookupd is asked over TLS).

    One address per string: ``"h:1,h2:2"`` is refused (split lists before), as is anything
    with a path, a user, a space or a port outside 1..65535.
    """
    if not isinstance(address, str):
        raise InvalidArgument("lookupd", _LOOKUPD_RULE, address)
    text = address.strip()
    scheme = ""
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme.lower() not in ("http", "https"):
            raise InvalidArgument("lookupd", _LOOKUPD_RULE, address)
        scheme = scheme.lower()
        if text.endswith("/"):
            text = text[:-1]
    host, sep, port = text.rpartition(":")
    number = ascii_int(port) if len(port) <= 5 else None
    if not sep or not valid_host(host) or number is None or not 0 < number < 65536:
        raise InvalidArgument("lookupd", _LOOKUPD_RULE, address)
    if host.count(":") and not host.startswith("["):
        raise InvalidArgument("lookupd", "an IPv6 address goes in brackets: '[::1]:4161'",
                              address)
    base = f"{host}:{number}"
    return f"https://{base}" if scheme == "https" else base


def normalize_lookupds(addresses: Iterable[str] | str | None) -> list[str]:
    """:func:`normalize_lookupd` of each address, ``"a:1,b:2"`` being two (alone or in a
    list): the form of ``SMARTNSQ_LOOKUPD`` and ``--lookupd``, so a value copied from them
    works in code too; an error names the bad address. Duplicates are dropped."""
    out: list[str] = []
    for item in address_list(addresses, "lookupd"):
        parts = item.split(",") if isinstance(item, str) else [item]
        out.extend(normalize_lookupd(part) for part in parts if str(part).strip())
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class TopicChange:
    """A topic's view changed (``old`` is ``None`` the first time, ``new`` when it is gone).

    ``leaders_moved`` maps each partition present before and after whose leader changed to
    ``(old leader, new leader)``; ``added``/``removed`` are partitions that appeared in or
    disappeared from the view (a partition without a leader is not listed by lookupd).
    """

    topic: str
    access: str
    old: TopicView | None
    new: TopicView | None
    leaders_moved: Mapping[int, tuple[Node | None, Node | None]] = field(
        default_factory=lambda: MappingProxyType({}))
    added: frozenset[int] = frozenset()
    removed: frozenset[int] = frozenset()

    def __reduce__(self) -> tuple[Any, ...]:  # a mappingproxy does not pickle; a dict does
        return (TopicChange, (self.topic, self.access, self.old, self.new,
                              dict(self.leaders_moved), self.added, self.removed))

    def __post_init__(self) -> None:
        if not isinstance(self.leaders_moved, MappingProxyType):
            object.__setattr__(self, "leaders_moved", MappingProxyType(dict(self.leaders_moved)))

    @classmethod
    def between(cls, old: TopicView | None, new: TopicView | None) -> TopicChange:
        view = new if new is not None else old
        assert view is not None
        before = dict(old.partitions) if old is not None else {}
        after = dict(new.partitions) if new is not None else {}
        moved: dict[int, tuple[Node | None, Node | None]] = {}
        for pid in sorted(set(before) & set(after)):
            a, b = before[pid].leader, after[pid].leader
            if (a.address if a else None) != (b.address if b else None):
                moved[pid] = (a, b)
        return cls(view.topic, view.access, old, new, MappingProxyType(moved),
                   frozenset(set(after) - set(before)), frozenset(set(before) - set(after)))


class LookupManager:
    """Views of topics from a set of lookupds; the module docstrings (this one's and
    :mod:`smartnsq.discovery.lookupds`'s) give the policy.

    ``LookupManager(["127.0.0.1:4161"], poll_interval=30)``: keyword options override
    :class:`LookupConfig` fields (or pass ``config=``). ``client=`` shares a
    :class:`smartnsq.transport.http.HttpClient` (not closed here; its TLS settings then apply). Use
    ``async with`` or ``start()``/``close()``; :meth:`view` starts the manager if needed.
    """

    def __init__(self, lookupd: Iterable[str] | str, *, config: LookupConfig | None = None,
                 client: HttpClient | None = None, **options: Any) -> None:
        config = config or LookupConfig()
        if options:
            refuse_unknown("LookupManager", options, {f.name for f in fields(LookupConfig)},
                           LookupManager.__init__)
            config = replace(config, **options)
        self._config = config
        seeds = tuple(normalize_lookupds(lookupd))  # ("a:1,b:2" is two, as --lookupd takes)
        if not seeds:
            raise InvalidArgument("lookupd", "needs at least one address", list(seeds))
        self.counters: Counter[str] = Counter()
        """``rounds`` (lookup rounds), ``requests`` (HTTP requests), ``refresh_calls``,
        ``refresh_coalesced`` (refresh calls folded into an already pending round),
        ``refresh_rounds``, ``polls``, ``discoveries``, ``changes``, ``failed_rounds``."""
        self._lookupds = LookupdSet(seeds, config, self.counters, client)
        self._views: dict[Key, TopicView] = {}
        self._inflight: dict[Key, asyncio.Task[TopicView]] = {}
        self._pending: dict[Key, asyncio.Future[TopicView | None]] = {}
        self._last_round: dict[Key, float] = {}
        self._idle_refreshes: Counter[Key] = Counter()  # on-demand rounds that found nothing
        self._watched: Counter[Key] = Counter()
        self._subscribers: list[ChangeCallback] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> LookupManager:
        """Learn the cluster's lookupds (``/listlookup``) and start polling; idempotent."""
        if self._closed:
            raise RuntimeError("a closed LookupManager cannot start again")
        if self._started:
            return self
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(self._starting)
        return self

    async def _start(self) -> None:
        await self._lookupds.start()
        self._poller = asyncio.get_running_loop().create_task(self._poll())
        self._started = True
        for key in self._watched:  # watched before start: look them up now
            if key not in self._views and key not in self._inflight:
                self._spawn(self._quiet_fetch(key))

    async def close(self) -> None:
        """Stop polling and close the HTTP client (if this manager made it)."""
        if self._closed:
            return
        self._closed = True
        tasks: list[asyncio.Task[Any]] = [*self._tasks, *self._inflight.values(),
                                          *self._lookupds.stop()]
        for task in (self._poller, self._starting):
            if task is not None:
                tasks.append(task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(None)
        self._pending.clear()
        await self._lookupds.close()

    async def __aenter__(self) -> LookupManager:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def config(self) -> LookupConfig:
        return self._config

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def seeds(self) -> tuple[str, ...]:
        return self._lookupds.seeds

    @property
    def lookupds(self) -> list[str]:
        """Every lookupd known now, seeds first."""
        return self._lookupds.addresses

    def health(self) -> list[LookupdStatus]:
        return self._lookupds.health()

    async def wait_idle(self) -> None:
        """Wait until no request runs in the background (late answers of past rounds,
        discovery); each one ends by its own ``timeout``, so this does too."""
        while True:
            tasks = [t for t in (*self._tasks, *self._lookupds.background())
                     if t is not asyncio.current_task()]
            if not tasks:
                return
            await asyncio.wait(tasks)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "lookupds": [asdict(s) for s in self.health()],
                "watched": sorted(f"{t}/{a}" for t, a in self._watched)}

    # -- views ------------------------------------------------------------------------------

    async def view(self, topic: str, access: str = "w", *, refresh: bool = False,
                   timeout: float | None = None) -> TopicView:
        """The topic's view, looked up now if not known (or if ``refresh``).

        ``timeout`` bounds the whole call (start, discovery, every round and retry): past
        it :class:`~smartnsq.errors.LookupTimeout` (a ``LookupFailed`` and a ``Timeout``) is
        raised, while the round itself goes on for whoever else waits on it. Raises
        :class:`~smartnsq.errors.TopicNotFound` (``TopicNotWritable`` for a youzan topic with
        no channel yet, asked with ``access="w"``) or :class:`~smartnsq.errors.LookupFailed`
        when no lookupd answered.
        """
        key = self._key(topic, access)
        if timeout is not None:
            check_number("timeout", timeout, low_open=True)
        if not refresh and self._started:
            view = self._views.get(key)
            if view is not None:
                return view
        if timeout is None:
            return await self._view(key, refresh)
        try:
            return await asyncio.wait_for(self._view(key, refresh), timeout)
        except asyncio.TimeoutError:
            raise LookupTimeout(f"no lookup answer for {topic!r} ({access}) within "
                                f"{timeout:g}s") from None

    async def _view(self, key: Key, refresh: bool) -> TopicView:
        if not self._started:
            await self.start()
        if not refresh:
            view = self._views.get(key)
            if view is not None:
                return view
        return await self._fetch(key)

    def cached(self, topic: str, access: str = "w") -> TopicView | None:
        """The last view of the topic, without any I/O (``None`` if never looked up)."""
        return self._views.get((topic, access))

    def watch(self, topic: str, access: str = "w") -> None:
        """Keep ``topic`` fresh: poll it every interval (looked up at once if not known).

        Calls are counted; :meth:`unwatch` as many times to stop.
        """
        key = self._key(topic, access)
        self._watched[key] += 1
        if (self._started and not self._closed and key not in self._views
                and key not in self._inflight):
            self._spawn(self._quiet_fetch(key))

    def unwatch(self, topic: str, access: str = "w") -> None:
        key = (topic, access)
        if self._watched[key] > 1:
            self._watched[key] -= 1
        else:
            self._watched.pop(key, None)

    def refresh(self, topic: str, access: str | None = None) -> asyncio.Future[None]:
        """Ask for a fresh lookup in the background; returns a future settled once done.

        ``access=None`` refreshes every access of the topic known here. Requests for a
        topic made while one is pending join it, so a burst makes one round; rounds of one
        topic that keep finding nothing new are spaced out (``refresh_min_interval``, doubling
        up to ``refresh_max_interval``). The future never raises.
        """
        loop = asyncio.get_running_loop()
        if access is None:
            accesses = [a for a in _ACCESSES
                        if (topic, a) in self._views or (topic, a) in self._watched
                        or (topic, a) in self._inflight]
        else:
            self._key(topic, access)
            accesses = [access]
        self.counters["refresh_calls"] += 1
        futures: list[asyncio.Future[TopicView | None]] = []
        for a in accesses:
            key = (topic, a)
            fut = self._pending.get(key)
            if fut is not None:
                self.counters["refresh_coalesced"] += 1
            elif self._closed:
                continue
            else:
                fut = self._pending[key] = loop.create_future()
                self._spawn(self._refresh_later(key, fut))
            futures.append(fut)
        done: asyncio.Future[None] = loop.create_future()
        if not futures:
            done.set_result(None)
            return done
        gathered = asyncio.gather(*futures, return_exceptions=True)
        gathered.add_done_callback(lambda _: _settle(done))
        return done

    def subscribe(self, callback: ChangeCallback) -> None:
        """Call ``callback(change)`` (in the event loop) whenever a view changes."""
        if callback not in self._subscribers:
            self._subscribers.append(callback)

    def unsubscribe(self, callback: ChangeCallback) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(callback)

    # -- rounds -----------------------------------------------------------------------------

    @staticmethod
    def _key(topic: str, access: str) -> Key:
        check_topic(topic)
        if access not in _ACCESSES:
            raise InvalidArgument("access", "must be 'r' (readers) or 'w' (writers)", access)
        return (topic, access)

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _fetch(self, key: Key) -> TopicView:
        """One round for ``key``, shared by everyone asking while it runs."""
        if self._closed:
            raise LookupFailed("the LookupManager is closed")
        if not self._started:
            await self.start()
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._run(key))
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._forget_task(key, t))
        return await asyncio.shield(task)

    def _forget_task(self, key: Key, task: asyncio.Task[TopicView]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: callers that left early must not leave it unseen

    async def _quiet_fetch(self, key: Key) -> TopicView | None:
        try:
            return await self._fetch(key)
        except LookupFailed as exc:
            log.debug("lookup of %s/%s failed: %s", key[0], key[1], exc)
            return None

    async def _run(self, key: Key) -> TopicView:
        topic, access = key
        self._last_round[key] = loop_time()
        self.counters["rounds"] += 1
        try:
            view = await self._lookupds.lookup(topic, access)
        except TopicNotFound:
            self._store(key, None)
            raise
        except LookupFailed:
            self.counters["failed_rounds"] += 1  # no lookupd answered (for stats())
            raise
        self._store(key, view)
        return view

    def _store(self, key: Key, view: TopicView | None) -> None:
        old = self._views.get(key)
        if view is None:
            if old is None:
                return
            del self._views[key]
        else:
            self._views[key] = view
            if old == view:
                return
        change = TopicChange.between(old, view)
        self.counters["changes"] += 1
        self._idle_refreshes.pop(key, None)  # news: the next refresh may go at once
        if old is not None:
            log.info("lookup of %s/%s changed: %s", key[0], key[1], _describe_change(change))
        for callback in list(self._subscribers):
            try:
                callback(change)
            except Exception:
                log.exception("TopicChange subscriber %r failed", callback)

    async def _refresh_later(self, key: Key, fut: asyncio.Future[TopicView | None]) -> None:
        cfg = self._config
        result: TopicView | None = None
        try:
            if cfg.refresh_delay:
                await asyncio.sleep(cfg.refresh_delay)
            idle = self._idle_refreshes[key]
            if idle:
                gap = exponential_delay(cfg.refresh_min_interval, cfg.refresh_max_interval,
                                        idle)
                wait = self._last_round.get(key, -math.inf) + gap - loop_time()
                if wait > 0:
                    await asyncio.sleep(wait)
            running = self._inflight.get(key)
            if running is not None:  # it may have asked before the news; ask again after it
                await asyncio.wait([running])
            if self._pending.get(key) is fut:
                del self._pending[key]  # later requests need a round of their own
            self.counters["refresh_rounds"] += 1
            before = self._views.get(key)
            result = await self._fetch(key)
            if result == before:
                self._idle_refreshes[key] += 1
        except LookupFailed as exc:
            self._idle_refreshes[key] += 1  # no news either: do not hammer the lookupds
            log.debug("refresh of %s/%s failed: %s", key[0], key[1], exc)
        finally:
            if self._pending.get(key) is fut:
                del self._pending[key]
            if not fut.done():
                fut.set_result(result)

    # -- polling ----------------------------------------------------------------------------

    async def _poll(self) -> None:
        cfg = self._config
        while True:
            await asyncio.sleep(cfg.poll_interval * (1.0 - cfg.jitter * random.random()))
            try:
                await self._lookupds.discover_if_due()
                keys = list(self._watched)
                if keys:
                    self.counters["polls"] += 1
                    await asyncio.gather(*(self._quiet_fetch(k) for k in keys))
            except Exception:  # a bug here must not stop polling for good
                log.exception("lookup poll failed")

    def __repr__(self) -> str:
        return (f"<LookupManager lookupds={len(self._lookupds.addresses)} "
                f"views={len(self._views)} watched={len(self._watched)}>")


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _node_text(node: Node | None) -> str:
    return "none" if node is None else str(node)


def _describe_change(change: TopicChange) -> str:
    parts = [f"p{pid} {_node_text(a)} -> {_node_text(b)}"
             for pid, (a, b) in change.leaders_moved.items()]
    if change.added:
        parts.append(f"added {sorted(change.added)}")
    if change.removed:
        parts.append(f"removed {sorted(change.removed)}")
    if change.new is None:
        parts.append("topic gone")
    return "; ".join(parts) or "nodes or meta changed"
