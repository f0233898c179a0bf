"""The lookupds a lookup manager asks: which ones, how healthy each is, and asking them.

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
  times in a row are forgotten: the rules are :mod:`smartnsq.model.lookupd_health`'s, the
  racing :mod:`smartnsq.discovery.race`'s. Each lookupd's ``state`` (``ok``, ``slow``,
  ``timeout``, ``refused``, ``malformed``, ``error``, ``tls``) is in
  :meth:`LookupdSet.health` and the log.
* **The wrong kind of server.** A lookupd that answers as something else (nsqd's TCP or
  HTTP port, a web server's page: :func:`smartnsq.protocol.diagnose.not_lookupd`) would
  answer the same way again: once every known lookupd last answered so, a round raises a
  ``LookupFailed`` that is not ``retriable`` instead of retrying. Nothing listening, a
  timeout or a 5xx may pass (a lookupd restarting) and is always retried.
* **Addresses.** https lookupds are asked over TLS, and the lookupds one of them lists are
  asked the same way (:meth:`~smartnsq.model.lookupd_health.LookupdHealth.sibling`).

The set keeps no topic views: what a round returns is the manager's to store and announce.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..errors import (
    AnswerTooLarge,
    ConnectionFailed,
    HttpConnectError,
    HttpConnectTimeout,
    HttpTLSError,
    LookupdError,
    LookupdRequestFailed,
    LookupFailed,
    NotHttp,
    NSQError,
    ProtocolError,
    Timeout,
    TopicNotFound,
    TopicNotWritable,
)
from ..model.backoff import exponential_delay
from ..model.lookupd_health import LookupdHealth, LookupdStatus, targets
from ..protocol.diagnose import lookupd_hint, not_lookupd
from ..protocol.lookup import (
    ACCEPT_V1,
    LookupLimits,
    TopicView,
    lookup_params,
    merge_views,
    parse_listlookup,
    parse_lookup,
)
from ..transport.http import HttpClient
from .race import race

__all__ = ["LookupdSet", "LookupdSettings", "loop_time"]

log = logging.getLogger("smartnsq.lookup")

T = TypeVar("T")
_V1_HEADERS = {"Accept": ACCEPT_V1}


class LookupdSettings(Protocol):
    """What the set reads of a :class:`~smartnsq.discovery.lookup.LookupConfig`, named by
    shape: the lookup manager imports this module, so this one cannot import the config."""

    @property
    def timeout(self) -> float: ...
    @property
    def answer_grace(self) -> float: ...
    @property
    def max_answer_size(self) -> int: ...
    @property
    def max_partitions(self) -> int: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def retry_delay(self) -> float: ...
    @property
    def retry_delay_max(self) -> float: ...
    @property
    def discover_interval(self) -> float: ...
    @property
    def backoff(self) -> float: ...
    @property
    def backoff_max(self) -> float: ...
    @property
    def forget_after(self) -> int: ...
    @property
    def poll_interval(self) -> float: ...  # the HTTP client's keep-alive follows it
    @property
    def user_agent(self) -> str: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def tls_ca_file(self) -> str | None: ...
    @property
    def tls_verify(self) -> bool: ...
    @property
    def trust_env(self) -> bool: ...


def loop_time() -> float:
    """The running loop's clock (the one health and spacing are measured on); 0 outside a
    loop, where nothing is due yet anyway."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return 0.0


@dataclass(frozen=True)
class _Unanswered:
    """A round no lookupd answered: worth another round while attempts are left, so it is a
    value rather than an error until the last one."""

    message: str
    cause: BaseException | None


class LookupdSet:
    """The seeds and the lookupds they list, each with its health; asks them for views.

    ``counters`` is the manager's (``requests`` and ``discoveries`` are counted here).
    ``client`` is the caller's, never closed here; without one, :meth:`start` makes one
    from the settings and :meth:`close` closes it.
    """

    def __init__(self, seeds: tuple[str, ...], settings: LookupdSettings,
                 counters: Counter[str], client: HttpClient | None = None) -> None:
        self._settings = settings
        self._seeds = seeds
        self._lookupds: dict[str, LookupdHealth] = {a: LookupdHealth(a, True) for a in seeds}
        self._counters = counters
        self._client = client
        self._own_client = client is None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._discovering: asyncio.Task[None] | None = None
        self._last_discovery = -math.inf
        self._closed = False
        self._wrong: set[str] = set()  # answered last as a server that is not nsqlookupd

    async def start(self) -> None:
        """Make the HTTP client (unless given one) and learn the cluster's lookupds."""
        if self._client is None:
            cfg = self._settings
            self._client = HttpClient(
                user_agent=cfg.user_agent,
                connect_timeout=min(cfg.connect_timeout, cfg.timeout),
                tls_ca_file=cfg.tls_ca_file, tls_verify=cfg.tls_verify,
                keepalive=min(max(cfg.poll_interval * 2, 30.0), 300.0), max_idle=4,
                trust_env=cfg.trust_env)
        await self.discover()

    def stop(self) -> list[asyncio.Task[Any]]:
        """Start no more background work; cancel what runs and hand it to the caller to
        await with its own tasks, so the manager's close cancels everything in one turn."""
        self._closed = True
        tasks = list(self._tasks)
        if self._discovering is not None:
            tasks.append(self._discovering)
        for task in tasks:
            task.cancel()
        return tasks

    async def close(self) -> None:
        """Stop (if :meth:`stop` has not), wait for what ran, close the client made here."""
        tasks = self.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._own_client and self._client is not None:
            await self._client.aclose()

    @property
    def seeds(self) -> tuple[str, ...]:
        return self._seeds

    @property
    def addresses(self) -> list[str]:
        """Every lookupd known now, seeds first."""
        return list(self._lookupds)

    def health(self) -> list[LookupdStatus]:
        now = loop_time()
        return [d.status(now) for d in self._lookupds.values()]

    def background(self) -> list[asyncio.Task[Any]]:
        """The requests still running after their round went on, and discovery runs."""
        return list(self._tasks)

    # -- lookup rounds ----------------------------------------------------------------------

    async def lookup(self, topic: str, access: str) -> TopicView:
        """Rounds until one has an answer: at most ``attempts``, ``retry_delay`` apart
        (doubling up to ``retry_delay_max``, jittered) while no lookupd answers at all."""
        cfg = self._settings
        attempt = 1
        while True:
            outcome = await self._ask_all(topic, access)
            if isinstance(outcome, TopicView):
                return outcome
            if attempt >= cfg.attempts:  # out of rounds: the last lookupd's failure as cause
                raise LookupFailed(outcome.message) from outcome.cause
            await asyncio.sleep(exponential_delay(cfg.retry_delay, cfg.retry_delay_max,
                                                  attempt, 0.5))
            attempt += 1

    def _targets(self) -> list[LookupdHealth]:
        """Lookupds to ask now (:func:`smartnsq.model.lookupd_health.targets`)."""
        return targets(list(self._lookupds.values()), loop_time())

    async def _ask_all(self, topic: str, access: str) -> TopicView | _Unanswered:
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
        # a lookupd skipped this round for answering as another server: what it said is the
        # telling part (a wrong port), whichever failure the round itself ended with
        asked_now = {d.address for d in asked.values()}
        told = [d.last_error for d in self._lookupds.values()
                if d.address in self._wrong and d.address not in asked_now and d.last_error]
        detail = "; ".join([*(str(e) for e in errors), *told]) or "no lookupd to ask"
        if self._lookupds and self._wrong.issuperset(self._lookupds):
            # each one answered as some other server: asking again meets the same answers
            wrong = "; ".join(d.last_error or d.address for d in self._lookupds.values())
            raise LookupFailed(f"lookup of {topic!r} failed: no lookupd given is nsqlookupd "
                               f"(fix the lookupd addresses): {wrong}", retriable=False)
        if final and len(final) == len(errors):
            raise LookupFailed(f"lookup of {topic!r} refused: {detail}")
        return _Unanswered(f"no lookupd answered the lookup of {topic!r} ({access}): {detail}",
                           errors[-1] if errors else None)

    async def _race(self, asked: dict[asyncio.Task[T], LookupdHealth],
                    settle: Callable[[asyncio.Task[T]], bool]) -> set[asyncio.Task[T]]:
        """Race the requests (:func:`smartnsq.discovery.race.race`); those still running when
        the round goes on end in the background (:meth:`_late`) and are returned."""
        pending = await race(set(asked), settle, self._settings.answer_grace)
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
        cfg = self._settings
        status, body = await self._get(lookupd, "/lookup", lookup_params(topic, access))
        try:
            view = parse_lookup(topic, access, status, body, lookupd=lookupd.address,
                                limits=LookupLimits(cfg.max_partitions, cfg.max_nodes))
        except TopicNotFound:
            self._succeeded(lookupd)
            raise
        except LookupdError as exc:
            if not_lookupd(status, body, "/lookup"):
                self._wrong_kind(lookupd, exc)
            elif exc.retriable:
                self._failed(lookupd, exc, "error")
            else:
                self._succeeded(lookupd)
            raise
        except ProtocolError as exc:
            error = LookupdRequestFailed(lookupd.address, "malformed", str(exc),
                                         retriable=not not_lookupd(status, body, "/lookup"))
            self._failed(lookupd, error, "malformed")
            raise error from exc
        self._succeeded(lookupd)
        return view

    async def _get(self, lookupd: LookupdHealth, path: str,
                   params: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        """``(status, body)`` of one GET, all of it within ``timeout`` and
        ``max_answer_size``; a failure is recorded on ``lookupd`` and raised as
        :class:`~smartnsq.errors.LookupdRequestFailed`."""
        client = self._client
        if client is None:
            raise LookupFailed("the LookupManager is not started")
        cfg = self._settings
        lookupd.requests += 1
        self._counters["requests"] += 1
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

    def _wrong_kind(self, lookupd: LookupdHealth, error: LookupdError) -> None:
        """The lookupd answered as some other server (nsqd's HTTP API): a failure that keeps
        it skipped (logged once), and counts towards failing the lookup at once."""
        self._failed(lookupd, LookupdRequestFailed(lookupd.address, "malformed",
                                                   error.message, retriable=False), "malformed")

    def _succeeded(self, lookupd: LookupdHealth) -> None:
        self._wrong.discard(lookupd.address)
        failures = lookupd.succeeded()
        if failures:
            log.info("lookupd %s answers again after %d failures", lookupd.address, failures)

    def _failed(self, lookupd: LookupdHealth, error: BaseException,
                state: str = "error") -> None:
        cfg = self._settings
        if getattr(error, "retriable", True):
            self._wrong.discard(lookupd.address)  # a fault that may pass: keep asking
        else:
            self._wrong.add(lookupd.address)
        delay = lookupd.failed(loop_time(), str(error), state, cfg.backoff, cfg.backoff_max)
        level = logging.WARNING if lookupd.failures == 1 else logging.DEBUG
        log.log(level, "lookupd %s failed (%s, %d in a row; skipped for %.2fs): %s",
                lookupd.address, state, lookupd.failures, delay, error)
        if (lookupd.forgettable(cfg.forget_after)
                and self._lookupds.get(lookupd.address) is lookupd and len(self._lookupds) > 1):
            del self._lookupds[lookupd.address]
            log.info("forgetting lookupd %s until /listlookup names it again", lookupd.address)

    # -- discovery --------------------------------------------------------------------------

    async def discover_if_due(self) -> None:
        """Re-read the cluster's lookupds when ``discover_interval`` has passed."""
        if loop_time() - self._last_discovery >= self._settings.discover_interval:
            await self.discover()

    def _kick_discovery(self) -> None:
        """Re-read /listlookup soon (at most once per retry_delay_max) after a failed round."""
        if self._closed or self._discovering is not None:
            return
        if loop_time() - self._last_discovery < max(self._settings.retry_delay_max, 1.0):
            return

        async def run() -> None:
            try:
                await self.discover()
            finally:
                self._discovering = None

        self._discovering = self._spawn(run())

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def discover(self) -> None:
        """Ask the seeds (else every known lookupd) for the cluster's lookupds."""
        self._last_discovery = loop_time()
        self._counters["discoveries"] += 1
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
            error = LookupdRequestFailed(lookupd.address, state, str(exc),
                                         retriable=not not_lookupd(status, body, "/listlookup"))
            self._failed(lookupd, error, state)
            raise error from exc
        self._succeeded(lookupd)
        lookupd.classic = answer.classic
        return [lookupd.sibling(a) for a in answer.nodes]


def _http_failure(address: str, exc: NSQError, cfg: LookupdSettings) -> LookupdRequestFailed:
    """What a failed request says about the lookupd, as a one-line failure."""
    reason = getattr(exc, "reason", None) or str(exc)
    if isinstance(exc, HttpTLSError):
        return LookupdRequestFailed(address, "tls", reason)
    if isinstance(exc, AnswerTooLarge):
        size = f"of {exc.declared} bytes " if exc.declared is not None else ""
        return LookupdRequestFailed(address, "malformed", f"answer {size}over max_answer_size "
                                    f"({cfg.max_answer_size} bytes)")
    if isinstance(exc, NotHttp):  # nsqd's TCP port, or some other service
        return LookupdRequestFailed(address, "malformed", lookupd_hint(exc.found),
                                    retriable=False)
    if isinstance(exc, ProtocolError):
        return LookupdRequestFailed(address, "malformed", reason)
    if isinstance(exc, Timeout):
        if isinstance(exc, HttpConnectTimeout):
            return LookupdRequestFailed(address, "timeout", reason)
        return LookupdRequestFailed(address, "timeout",
                                    f"no whole answer within {cfg.timeout:g}s (timeout)")
    if isinstance(exc, HttpConnectError):
        return LookupdRequestFailed(address, "refused", reason)
    return LookupdRequestFailed(address, "error", reason)
