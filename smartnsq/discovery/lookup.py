"""Discovery through nsqlookupd: who leads which partition of a topic, kept fresh.

A :class:`LookupManager` owns one keep-alive HTTP client and a set of lookupd addresses:

* **Which lookupds.** The seeds given by the user, plus every lookupd their ``/listlookup``
  names (youzan clusters list all of them). A seed answering 404 there is a classic
  nsqlookupd and is used alone. The list is re-read every ``discover_interval`` and whenever
  no lookupd answers a lookup.
* **Asking.** A lookup asks every known, healthy lookupd at once and merges the answers
  (:func:`~smartnsq.protocol.lookup.merge_views`): lookupds read the same etcd but register
  nsqd on their own, so one of them may briefly miss a node the others see. The round never
  waits for the slowest one: once a lookupd has answered, the others get ``answer_grace``
  more, and the round goes on with what has arrived; a request still running then finishes
  (or hits its deadline) in the background and only updates that lookupd's health. Only when
  *no* lookupd answers is the round retried (jittered exponential back-off,
  :func:`smartnsq.model.backoff.exponential_delay`).
* **Deadlines and bounds.** ``timeout`` bounds each *whole* request (connect, send, the
  complete answer), so a lookupd dripping one byte per second cannot hold anything up; an
  answer over ``max_answer_size`` bytes, listing more than ``max_partitions`` partitions or
  ``max_nodes`` producers, or naming a node that is not a ``host:port`` is refused unread.
* **Health.** A lookupd that fails is skipped for a back-off that doubles per consecutive
  failure, slow ones are asked after healthy ones, discovered ones failing ``forget_after``
  times in a row are forgotten: the rules are :mod:`smartnsq.model.lookupd_health`'s, the racing
  :mod:`smartnsq.discovery.race`'s. Each lookupd's ``state`` (``ok``, ``slow``, ``timeout``,
  ``refused``, ``malformed``, ``error``, ``tls``) is in :meth:`LookupManager.health`,
  ``stats()`` and the log.
* **Addresses.** ``host:port``, ``http://host:port`` or ``https://host:port``; https
  lookupds are asked over TLS (``tls_ca_file``, ``tls_verify``), and the lookupds one of them
  lists are asked the same way. Anything else is refused when the manager is built.
* **Freshness.** The first lookup of a topic happens at once; watched topics are polled every
  ``poll_interval`` (shortened by a random ``jitter`` so clients started together spread out).
  :meth:`LookupManager.refresh` asks for an extra round in the background; a burst of such
  requests (every publish failing on a moved leader) makes one round.
* **Changes.** Subscribers get a :class:`TopicChange` whenever a view changes: which leaders
  moved, which partitions appeared or disappeared.

Parsing lives in the sans-I/O :mod:`smartnsq.protocol.lookup`; this module only does I/O,
timing and bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

from ..config import Rule, check_fields, doc, flag, integer, number, seconds, text
from ..errors import (
    AnswerTooLarge,
    ConnectionFailed,
    HttpConnectError,
    HttpConnectTimeout,
    HttpTLSError,
    InvalidArgument,
    LookupdError,
    LookupFailed,
    LookupTimeout,
    NotHttp,
    NSQError,
    ProtocolError,
    Timeout,
    TopicNotFound,
    TopicNotWritable,
)
from ..model.backoff import exponential_delay
from ..model.lookupd_health import LookupdHealth, LookupdStatus, targets
from ..model.routes import address_list
from ..protocol.diagnose import lookupd_hint
from ..protocol.identify import USER_AGENT
from ..protocol.lookup import (
    ACCEPT_V1,
    LookupLimits,
    Node,
    TopicView,
    lookup_params,
    merge_views,
    parse_listlookup,
    parse_lookup,
    valid_host,
)
from ..protocol.numbers import check_number
from ..protocol.validate import MAX_PARTITION, ascii_int, check_topic
from ..transport.http import HttpClient
from .race import race

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
_V1_HEADERS = {"Accept": ACCEPT_V1}


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


class _Failure(LookupdError):
    """One lookupd request failed; ``state`` says how (see :attr:`LookupdStatus.state`)."""

    def __init__(self, state: str, message: str, *, retriable: bool = True) -> None:
        self.state = state
        super().__init__(0, message, retriable=retriable)


class _NoAnswer(LookupFailed):
    """Internal: no lookupd answered this round (worth another round). Never leaves the
    manager: the last round's is raised as a plain ``LookupFailed``."""


class LookupManager:
    """Views of topics from a set of lookupds; see the module docstring for the policy.

    ``LookupManager(["127.0.0.1:4161"], poll_interval=30)``: keyword options override
    :class:`LookupConfig` fields (or pass ``config=``). ``client=`` shares a
    :class:`smartnsq.transport.http.HttpClient` (not closed here; its TLS settings then apply). Use
    ``async with`` or ``start()``/``close()``; :meth:`view` starts the manager if needed.
    """

    def __init__(self, lookupd: Iterable[str] | str, *, config: LookupConfig | None = None,
                 client: HttpClient | None = None, **options: Any) -> None:
        config = config or LookupConfig()
        if options:
            unknown = set(options) - {f.name for f in fields(LookupConfig)}
            if unknown:
                raise InvalidArgument("LookupManager option", "unknown option",
                                      sorted(unknown))
            config = replace(config, **options)
        self._config = config
        seeds = tuple(dict.fromkeys(normalize_lookupd(a)
                                    for a in address_list(lookupd, "lookupd")))
        if not seeds:
            raise InvalidArgument("lookupd", "needs at least one address", list(seeds))
        self._seeds = seeds
        self._lookupds: dict[str, LookupdHealth] = {a: LookupdHealth(a, True) for a in seeds}
        self._client = client
        self._own_client = client is None
        self._views: dict[Key, TopicView] = {}
        self._inflight: dict[Key, asyncio.Task[TopicView]] = {}
        self._pending: dict[Key, asyncio.Future[TopicView | None]] = {}
        self._last_round: dict[Key, float] = {}
        self._idle_refreshes: Counter[Key] = Counter()  # on-demand rounds that found nothing
        self._watched: Counter[Key] = Counter()
        self._subscribers: list[ChangeCallback] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._discovering: asyncio.Task[None] | None = None
        self._last_discovery = -math.inf
        self._starting: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self.counters: Counter[str] = Counter()
        """``rounds`` (lookup rounds), ``requests`` (HTTP requests), ``refresh_calls``,
        ``refresh_coalesced`` (refresh calls folded into an already pending round),
        ``refresh_rounds``, ``polls``, ``discoveries``, ``changes``, ``failed_rounds``."""

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
        if self._client is None:
            cfg = self._config
            self._client = HttpClient(
                user_agent=cfg.user_agent,
                connect_timeout=min(cfg.connect_timeout, cfg.timeout),
                tls_ca_file=cfg.tls_ca_file, tls_verify=cfg.tls_verify,
                keepalive=min(max(cfg.poll_interval * 2, 30.0), 300.0), max_idle=4,
                trust_env=cfg.trust_env)
        await self._discover()
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
        tasks: list[asyncio.Task[Any]] = [*self._tasks, *self._inflight.values()]
        for task in (self._poller, self._discovering, self._starting):
            if task is not None:
                tasks.append(task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(None)
        self._pending.clear()
        if self._own_client and self._client is not None:
            await self._client.aclose()

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
        return self._seeds

    @property
    def lookupds(self) -> list[str]:
        """Every lookupd known now, seeds first."""
        return list(self._lookupds)

    def health(self) -> list[LookupdStatus]:
        now = self._now()
        return [d.status(now) for d in self._lookupds.values()]

    async def wait_idle(self) -> None:
        """Wait until no request runs in the background (late answers of past rounds,
        discovery); each one ends by its own ``timeout``, so this does too."""
        while True:
            tasks = [t for t in self._tasks if t is not asyncio.current_task()]
            if not tasks:
                return
            await asyncio.wait(tasks)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "lookupds": [_status_dict(s) for s in self.health()],
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

    def _now(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return 0.0

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
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
        self._last_round[key] = self._now()
        self.counters["rounds"] += 1
        try:
            view = await self._round(topic, access)
        except TopicNotFound:
            self._store(key, None)
            raise
        except LookupFailed:
            self.counters["failed_rounds"] += 1  # no lookupd answered (for stats())
            raise
        self._store(key, view)
        return view

    async def _round(self, topic: str, access: str) -> TopicView:
        """Rounds until one has an answer: at most ``attempts``, ``retry_delay`` apart
        (doubling up to ``retry_delay_max``, jittered) while no lookupd answers at all."""
        cfg = self._config
        attempt = 1
        while True:
            try:
                return await self._ask_all(topic, access)
            except _NoAnswer as exc:
                if attempt >= cfg.attempts:  # out of rounds: the public error, same cause
                    public = LookupFailed(*exc.args)
                    raise public from exc.__cause__
            await asyncio.sleep(exponential_delay(cfg.retry_delay, cfg.retry_delay_max,
                                                  attempt, 0.5))
            attempt += 1

    def _targets(self) -> list[LookupdHealth]:
        """Lookupds to ask now (:func:`smartnsq.model.lookupd_health.targets`)."""
        return targets(list(self._lookupds.values()), self._now())

    async def _ask_all(self, topic: str, access: str) -> TopicView:
        """One round: every target at once; done once all answered, or ``answer_grace``
        after the first usable answer (the rest finish in the background)."""
        loop = asyncio.get_running_loop()
        asked = {loop.create_task(self._ask(d, topic, access)): d for d in self._targets()}
        views: list[tuple[int, TopicView]] = []
        not_found: list[TopicNotFound] = []
        errors: list[BaseException] = []
        order = {task: i for i, task in enumerate(asked)}  # healthiest first, for the merge

        def settle(task: asyncio.Task[TopicView]) -> bool:
            error = task.exception()
            if error is None:
                views.append((order[task], task.result()))
                return True
            if isinstance(error, TopicNotFound):
                not_found.append(error)
                return True
            if isinstance(error, (LookupFailed, ProtocolError)):
                errors.append(error)
                return False
            raise error

        await self._race(asked, settle)
        if views:
            return merge_views(view for _, view in sorted(views, key=lambda v: v[0]))
        if not_found:
            # a writable-check answer is more telling than a plain "not found"
            best = next((e for e in not_found if isinstance(e, TopicNotWritable)), not_found[0])
            raise best
        self._kick_discovery()
        final = [e for e in errors if isinstance(e, LookupdError) and not e.retriable]
        detail = "; ".join(str(e) for e in errors) or "no lookupd to ask"
        if final and len(final) == len(errors):
            raise LookupFailed(f"lookup of {topic!r} refused: {detail}")
        raise _NoAnswer(f"no lookupd answered the lookup of {topic!r} ({access}): {detail}") \
            from (errors[-1] if errors else None)

    async def _race(self, asked: dict[asyncio.Task[T], LookupdHealth],
                    settle: Callable[[asyncio.Task[T]], bool]) -> set[asyncio.Task[T]]:
        """Race the requests (:func:`smartnsq.discovery.race.race`); those still running when
        the round goes on end in the background (:meth:`_late`) and are returned."""
        pending = await race(set(asked), settle, self._config.answer_grace)
        for task in pending:
            self._late(task, asked[task])
        return pending

    def _late(self, task: asyncio.Task[Any], lookupd: LookupdHealth) -> None:
        """A request its round did not wait for: let it end (by its deadline) in the
        background; an answer that comes marks the lookupd slow, a failure is already
        recorded by the request itself."""
        self._tasks.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._tasks.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            if error is None or isinstance(error, TopicNotFound):
                streak = lookupd.answered_late()
                level = logging.WARNING if streak == 1 else logging.DEBUG
                log.log(level, "lookupd %s is slow: it answered after its round had gone on "
                        "(%d times in a row); asked after the others now", lookupd.address,
                        streak)

        task.add_done_callback(done)

    async def _ask(self, lookupd: LookupdHealth, topic: str, access: str) -> TopicView:
        cfg = self._config
        status, body = await self._get(lookupd, "/lookup", lookup_params(topic, access))
        try:
            view = parse_lookup(topic, access, status, body, lookupd=lookupd.address,
                                limits=LookupLimits(cfg.max_partitions, cfg.max_nodes))
        except TopicNotFound:
            self._succeeded(lookupd)
            raise
        except LookupdError as exc:
            if exc.retriable:
                self._failed(lookupd, exc, "error")
            else:
                self._succeeded(lookupd)
            raise
        except ProtocolError as exc:
            error = _Failure("malformed", f"{lookupd.address}: {exc}")
            self._failed(lookupd, error, "malformed")
            raise error from exc
        self._succeeded(lookupd)
        return view

    async def _get(self, lookupd: LookupdHealth, path: str,
                   params: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        """``(status, body)`` of one GET, all of it within ``timeout`` and
        ``max_answer_size``; a failure is recorded on ``lookupd`` and raised as
        :class:`_Failure`."""
        client = self._client
        if client is None:
            raise LookupFailed("the LookupManager is not started")
        cfg = self._config
        lookupd.requests += 1
        self.counters["requests"] += 1
        try:
            # the v1 Accept header: bare JSON and the real status, also from youzan lookupds
            answer = await client.request("GET", f"{lookupd.url}{path}", params=params,
                                          headers=_V1_HEADERS, timeout=cfg.timeout,
                                          max_body=cfg.max_answer_size)
            return answer.status, answer.body
        except (ProtocolError, ConnectionFailed, Timeout) as exc:
            failure = _http_failure(lookupd.address, exc, cfg)
        self._failed(lookupd, failure, failure.state)
        raise failure

    def _succeeded(self, lookupd: LookupdHealth) -> None:
        failures = lookupd.succeeded()
        if failures:
            log.info("lookupd %s answers again after %d failures", lookupd.address, failures)

    def _failed(self, lookupd: LookupdHealth, error: BaseException,
                state: str = "error") -> None:
        cfg = self._config
        delay = lookupd.failed(self._now(), str(error), state, cfg.backoff, cfg.backoff_max)
        level = logging.WARNING if lookupd.failures == 1 else logging.DEBUG
        log.log(level, "lookupd %s failed (%s, %d in a row; skipped for %.2fs): %s",
                lookupd.address, state, lookupd.failures, delay, error)
        if (lookupd.forgettable(cfg.forget_after)
                and self._lookupds.get(lookupd.address) is lookupd and len(self._lookupds) > 1):
            del self._lookupds[lookupd.address]
            log.info("forgetting lookupd %s until /listlookup names it again", lookupd.address)

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
                wait = self._last_round.get(key, -math.inf) + gap - self._now()
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

    # -- polling and discovery --------------------------------------------------------------

    async def _poll(self) -> None:
        cfg = self._config
        while True:
            await asyncio.sleep(cfg.poll_interval * (1.0 - cfg.jitter * random.random()))
            try:
                if self._now() - self._last_discovery >= cfg.discover_interval:
                    await self._discover()
                keys = list(self._watched)
                if keys:
                    self.counters["polls"] += 1
                    await asyncio.gather(*(self._quiet_fetch(k) for k in keys))
            except Exception:  # a bug here must not stop polling for good
                log.exception("lookup poll failed")

    def _kick_discovery(self) -> None:
        """Re-read /listlookup soon (at most once per retry_delay_max) after a failed round."""
        if self._closed or self._discovering is not None:
            return
        if self._now() - self._last_discovery < max(self._config.retry_delay_max, 1.0):
            return

        async def run() -> None:
            try:
                await self._discover()
            finally:
                self._discovering = None

        self._discovering = self._spawn(run())

    async def _discover(self) -> None:
        """Ask the seeds (else every known lookupd) for the cluster's lookupds."""
        self._last_discovery = self._now()
        self.counters["discoveries"] += 1
        seeds = [self._lookupds[a] for a in self._seeds]
        answered = await self._listlookup(seeds)
        if answered is None:
            others = [d for d in self._lookupds.values() if not d.seed]
            if others:
                answered = await self._listlookup(others)
        if answered is None:
            log.warning("no lookupd answered /listlookup; keeping %s", ", ".join(self._lookupds))
            return
        for address in answered:
            self._adopt(address)
        for address, lookupd in list(self._lookupds.items()):
            if not lookupd.seed and address not in answered:
                log.info("lookupd %s no longer listed; dropping it", address)
                del self._lookupds[address]

    def _adopt(self, address: str) -> None:
        lookupd = self._lookupds.get(address)
        if lookupd is None:
            log.info("lookupd %s discovered", address)
            lookupd = self._lookupds[address] = LookupdHealth(address, False)
        lookupd.classic = False  # only youzan lookupds list each other

    async def _listlookup(self, lookupds: list[LookupdHealth]) -> dict[str, None] | None:
        """Every lookupd the given ones list (``None`` if none of them answered).

        Like a lookup round, it goes on ``answer_grace`` after the first answer; what a
        slower lookupd lists later is still adopted when it comes (never dropped by it).
        """
        loop = asyncio.get_running_loop()
        asked = {loop.create_task(self._ask_list(d)): d for d in lookupds}
        listed: dict[str, None] = {}
        answered = False

        def settle(task: asyncio.Task[list[str]]) -> bool:
            nonlocal answered
            error = task.exception()
            if error is None:
                answered = True
                listed.update(dict.fromkeys(task.result()))
                return True
            if isinstance(error, (LookupFailed, ProtocolError)):
                return False
            raise error

        for task in await self._race(asked, settle):
            task.add_done_callback(self._adopt_late)
        return listed if answered else None

    def _adopt_late(self, task: asyncio.Task[list[str]]) -> None:
        if self._closed or task.cancelled() or task.exception() is not None:
            return
        for address in task.result():
            self._adopt(address)

    async def _ask_list(self, lookupd: LookupdHealth) -> list[str]:
        status, body = await self._get(lookupd, "/listlookup")
        try:
            answer = parse_listlookup(status, body)
        except (LookupdError, ProtocolError) as exc:
            state = "malformed" if isinstance(exc, ProtocolError) else "error"
            error = _Failure(state, f"{lookupd.address}: {exc}")
            self._failed(lookupd, error, state)
            raise error from exc
        self._succeeded(lookupd)
        lookupd.classic = answer.classic
        return [lookupd.sibling(a) for a in answer.nodes]

    def __repr__(self) -> str:
        return (f"<LookupManager lookupds={len(self._lookupds)} views={len(self._views)} "
                f"watched={len(self._watched)}>")


def _http_failure(address: str, exc: NSQError, cfg: LookupConfig) -> _Failure:
    """What a failed request says about the lookupd, as a one-line failure."""
    reason = getattr(exc, "reason", None) or str(exc)
    if isinstance(exc, HttpTLSError):
        return _Failure("tls", f"{address}: {reason}")
    if isinstance(exc, AnswerTooLarge):
        size = f"of {exc.declared} bytes " if exc.declared is not None else ""
        return _Failure("malformed", f"{address}: answer {size}over max_answer_size "
                        f"({cfg.max_answer_size} bytes)")
    if isinstance(exc, NotHttp):  # nsqd's TCP port, or some other service
        return _Failure("malformed", f"{address}: {lookupd_hint(exc.found)}")
    if isinstance(exc, ProtocolError):
        return _Failure("malformed", f"{address}: {reason}")
    if isinstance(exc, Timeout):
        if isinstance(exc, HttpConnectTimeout):
            return _Failure("timeout", f"{address}: {reason}")
        return _Failure("timeout", f"{address}: no whole answer within {cfg.timeout:g}s "
                        "(timeout)")
    if isinstance(exc, HttpConnectError):
        return _Failure("refused", f"{address}: {reason}")
    return _Failure("error", f"{address}: {reason}")


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _status_dict(status: LookupdStatus) -> dict[str, Any]:
    return {f.name: getattr(status, f.name) for f in fields(status)}


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
