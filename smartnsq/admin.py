"""Administering an NSQ cluster over HTTP: topics, channels, offsets, stats, lookupds.

:class:`AsyncAdmin` (asyncio) and :class:`Admin` (blocking, any thread) speak the nsqd and
nsqlookupd HTTP APIs of youzan's NSQ and of classic NSQ. What the servers answer is read by
:mod:`smartnsq.protocol.admin` (sans-I/O); this module only sends requests, with

* a deadline on every whole request (connect, send, the whole answer), not per read, so a
  server trickling bytes cannot hold a call past its ``timeout``;
* a bound on every answer's size (``max_answer_bytes``);
* errors that say what was asked, where, and why: :class:`~smartnsq.errors.AdminError`
  when a server refused, :class:`~smartnsq.errors.Timeout` past the deadline,
  :class:`~smartnsq.errors.ConnectionFailed` (with the network error as its cause) when a
  server could not be reached.

:meth:`AsyncAdmin.create_topic` is the workflow a real youzan cluster needs
(``docs/admin.md``): the leader lookupd takes the create at once but gives partitions leaders
only when its periodic cluster check runs, so the create is re-sent every few seconds until
every partition has a leader, then each wanted channel is created on each partition's leader
(a youzan lookupd lists a partition for writers only once it has a channel), until writers
see every partition or the timeout passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from .discovery.lookup import normalize_lookupds
from .errors import (
    AdminError,
    AnswerTooLarge,
    ConnectionFailed,
    HttpError,
    HttpTimeout,
    InvalidArgument,
    LookupdError,
    LookupFailed,
    NSQError,
    ProtocolError,
    Timeout,
    TopicNotFound,
)
from .model.lookupd_health import http_url
from .observability.stats import ChannelLag, PartitionLag
from .protocol import admin as p
from .protocol import validate
from .protocol.admin import CreationProgress, NodeInfo, NodeStats
from .protocol.commands import StartPosition
from .protocol.lookup import (
    LookupdList,
    Node,
    TopicView,
    lookup_params,
    merge_views,
    parse_listlookup,
    parse_lookup,
)
from .protocol.numbers import check_int, check_number
from .transport import loop_thread as _loops
from .transport.http import HttpClient
from .transport.loop_thread import LoopThread

__all__ = [
    "Admin",
    "AsyncAdmin",
]

log = logging.getLogger("smartnsq.admin")

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0
DEFAULT_MAX_ANSWER = 16 * 1024 * 1024
_HEADERS = {"Accept": p.ACCEPT_V1}
_GUARD = 5.0  # how much longer a blocking call waits than the async call's own deadline

Progress = Callable[[CreationProgress], object]


def _positive(name: str, value: object) -> float:
    return check_number(name, value, low_open=True)


# how long "No node is available" may be a cluster's nsqd still registering (they register
# with the lookupds as they start, within a second or two)
REGISTRATION_GRACE = 5.0


def _addresses(values: Sequence[str] | str | None, what: str) -> tuple[str, ...]:
    # "a:1,b:2" is two addresses, alone or in a list
    try:
        return tuple(normalize_lookupds(values))
    except InvalidArgument as exc:
        raise InvalidArgument(what, "must be 'host:http_port'", exc.value) from None


class AsyncAdmin:
    """The nsqd/nsqlookupd HTTP API for asyncio code.

    ``lookupd``: the cluster's nsqlookupd HTTP addresses (needed by every cluster-wide call;
    node calls take the nsqd's HTTP address). ``timeout`` bounds each request (a workflow such
    as ``create_topic`` has its own). Nothing is dialled at construction. Use ``async with``
    or call ``aclose()``; ``client`` lends a :class:`smartnsq.transport.http.HttpClient` (not closed
    here).
    """

    def __init__(self, lookupd: Sequence[str] | str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER,
                 client: HttpClient | None = None) -> None:
        self.lookupd = _addresses(lookupd, "lookupd")
        self.timeout = _positive("timeout", timeout)
        check_int("max_answer_bytes", max_answer_bytes, 1024)
        self.max_answer_bytes = max_answer_bytes
        self._client = client
        self._own_client = client is None

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._own_client:
            await client.aclose()

    # -- one request ----------------------------------------------------------------------------

    def _http(self) -> HttpClient:
        if self._client is None:
            # no proxy from the environment: these are internal addresses
            self._client = HttpClient()
            self._own_client = True
        return self._client

    async def _request(self, method: str, address: str, path: str, *, what: str,
                       params: dict[str, str] | None = None, content: bytes = b"",
                       timeout: float | None = None) -> tuple[int, bytes]:
        """``(status, body)`` of one request, within ``timeout`` for the whole of it."""
        limit = self.timeout if timeout is None else timeout
        if limit <= 0:
            raise Timeout(f"{what}: no time left to ask {address}")
        url = http_url(address, path)  # https:// lookupds keep their scheme
        try:
            answer = await self._http().request(
                method, url, params=params, headers=_HEADERS, body=content, timeout=limit,
                max_body=self.max_answer_bytes)
        except HttpTimeout:
            raise Timeout(f"{what}: {address} did not answer within {limit:g}s") from None
        except AnswerTooLarge as exc:
            if exc.declared is not None:
                raise ProtocolError(f"{what}: {address} announced a {exc.declared}-byte "
                                    f"answer (limit {self.max_answer_bytes})") from None
            raise ProtocolError(f"{what}: {address} answered more than "
                                f"{self.max_answer_bytes} bytes") from None
        except HttpError as exc:
            raise ProtocolError(f"{what}: {address}: {exc}") from None
        except ConnectionFailed as exc:
            reason = getattr(exc, "reason", "") or str(exc)
            raise ConnectionFailed(f"{what}: cannot reach {address} ({reason})") from exc
        return answer.status, answer.body

    async def _write(self, address: str, path: str, params: dict[str, str], *, what: str,
                     content: bytes = b"", timeout: float | None = None) -> None:
        status, body = await self._request("POST", address, path, what=what, params=params,
                                           content=content, timeout=timeout)
        p.parse_write(status, body, what=what, address=address)

    def _need_lookupd(self, what: str) -> tuple[str, ...]:
        if not self.lookupd:
            raise InvalidArgument("lookupd", f"{what} needs the cluster's lookupd addresses",
                                  self.lookupd)
        return self.lookupd

    async def _first(self, ask: Callable[[str], Awaitable[T]], what: str) -> T:
        """The answer of the first lookupd (in order) that gives one; else the last error."""
        last: BaseException | None = None
        for address in self._need_lookupd(what):
            try:
                return await ask(address)
            except (AdminError, ConnectionFailed, Timeout, ProtocolError) as exc:
                log.info("%s: lookupd %s: %s", what, address, exc)
                last = exc
        assert last is not None
        raise last

    # -- lookupds -------------------------------------------------------------------------------

    async def listlookup(self, address: str | None = None) -> LookupdList:
        """Every lookupd of the cluster and which one leads (``/listlookup``); ``classic`` in
        the answer when the lookupd is classic (it has no such route)."""
        async def ask(where: str) -> LookupdList:
            status, body = await self._request("GET", where, "/listlookup",
                                               what="nsqlookupd /listlookup")
            try:
                return parse_listlookup(status, body)
            except LookupdError as exc:
                raise AdminError(exc.status, exc.message, what="nsqlookupd /listlookup",
                                 address=where) from None

        if address is not None:
            return await ask(_addresses([address], "address")[0])
        return await self._first(ask, "/listlookup")

    async def leader_lookupd(self) -> str | None:
        """The HTTP address of the lookupd that takes cluster changes (topic create/delete);
        ``None`` on a classic or standalone cluster (no leader: every lookupd is equal)."""
        listing = await self.listlookup()
        return listing.leader

    async def lookup(self, topic: str, access: str = "r", *,
                     timeout: float | None = None) -> TopicView:
        """The topic as every lookupd sees it, merged (all asked at once; one that does not
        answer within ``timeout`` is left out). ``TopicNotFound`` when the answering lookupds
        do not know it; the first lookupd's error when none answered."""
        if access not in ("r", "w"):
            raise InvalidArgument("access", "must be 'r' or 'w'", access)
        validate.check_topic(topic)
        lookupds = self._need_lookupd("lookup")
        params = lookup_params(topic, access)

        async def ask(where: str) -> TopicView:
            status, body = await self._request("GET", where, "/lookup", params=params,
                                               what=f"lookup of {topic}", timeout=timeout)
            return parse_lookup(topic, access, status, body, lookupd=where)

        answers = await asyncio.gather(*(ask(a) for a in lookupds), return_exceptions=True)
        views = [a for a in answers if isinstance(a, TopicView)]
        if views:
            return merge_views(views)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, NSQError):
                raise answer
        not_found = next((a for a in answers if isinstance(a, TopicNotFound)), None)
        if not_found is not None:
            raise not_found
        first = answers[0]
        assert isinstance(first, BaseException)
        raise first

    async def nodes(self) -> tuple[Node, ...]:
        """Every nsqd the lookupds know (``/nodes`` of the first that answers)."""
        async def ask(where: str) -> tuple[Node, ...]:
            status, body = await self._request("GET", where, "/nodes", what="nsqlookupd /nodes")
            return p.parse_nodes(status, body, address=where)

        return await self._first(ask, "/nodes")

    # -- nodes ----------------------------------------------------------------------------------

    async def info(self, address: str) -> NodeInfo:
        """``/info`` of an nsqd or nsqlookupd (HTTP address)."""
        address = _addresses([address], "address")[0]
        status, body = await self._request("GET", address, "/info", what="/info")
        return p.parse_info(status, body, address=address)

    async def stats(self, address: str, topic: str | None = None, channel: str | None = None,
                    *, partition: int | None = None, leader_only: bool = False) -> NodeStats:
        """``/stats?format=json`` of one nsqd (HTTP address)."""
        address = _addresses([address], "address")[0]
        params = p.stats_params(topic, channel, partition, leader_only=leader_only)
        status, body = await self._request("GET", address, "/stats", params=params,
                                           what="nsqd /stats")
        return p.parse_stats(status, body, address=address)

    async def cluster_stats(self, topic: str | None = None, channel: str | None = None, *,
                            nsqd: Sequence[str] | None = None
                            ) -> dict[str, NodeStats | NSQError]:
        """``/stats`` of every nsqd (``nsqd`` HTTP addresses, or every node lookupd knows),
        asked at once: node address -> its stats, or the error it gave."""
        addresses = _addresses(nsqd, "nsqd") if nsqd else tuple(
            n.http_address for n in await self.nodes())
        answers = await asyncio.gather(*(self.stats(a, topic, channel) for a in addresses),
                                       return_exceptions=True)
        out: dict[str, NodeStats | NSQError] = {}
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, NSQError):
                raise answer
            out[address] = answer
        return out

    async def channel_lag(self, topic: str, channel: str, *,
                          nodes: Sequence[tuple[int | None, str]] | None = None
                          ) -> ChannelLag:
        """A channel's backlog per partition: depth, in-flight, deferred, youzan's backlogs and
        the topic's queue ends, each from the ``/stats`` of the node that serves it.

        ``nodes``: ``(partition, nsqd HTTP address)`` pairs to ask (``None`` partition: the
        node's entry for the topic, classic); by default each partition's leader from a read
        lookup (youzan), or every node that has the topic (classic). Every node is asked once,
        all at once; a node that fails gives its partitions an ``error`` instead of failing
        the whole reading."""
        validate.check_topic(topic)
        validate.check_channel(channel)
        if nodes is None:
            view = await self.lookup(topic, "r")
            if view.youzan and view.partitions:
                nodes = [(pid, part.leader.http_address)
                         for pid, part in sorted(view.partitions.items())
                         if part.leader is not None]
            else:
                nodes = [(None, node.http_address) for node in view.producers]
        wanted: dict[str, list[int | None]] = {}
        for partition, address in nodes:
            wanted.setdefault(_addresses([address], "nodes")[0], []).append(partition)
        addresses = list(wanted)
        answers = await asyncio.gather(*(self.stats(a, topic, channel) for a in addresses),
                                       return_exceptions=True)
        parts: list[PartitionLag] = []
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, NSQError):
                raise answer
            for partition in wanted[address]:
                parts.append(_lag_of(answer, topic, channel, partition, address))
        parts.sort(key=lambda p: (-1 if p.partition is None else p.partition, p.node))
        return ChannelLag(topic, channel, time.time(), tuple(parts))

    # -- channels -------------------------------------------------------------------------------

    async def _on_leaders(self, what: str, path: str, topic: str, channel: str,
                          partition: int | None, address: str | None,
                          content: bytes = b"") -> None:
        """``path`` on one nsqd (``address``) or on each partition's leader (youzan) / each
        node serving the topic (classic)."""
        if address is not None:
            address = _addresses([address], "address")[0]
            await self._write(address, path, p.channel_params(topic, channel, partition),
                              what=what, content=content)
            return
        p.channel_params(topic, channel, partition)  # checked before any lookup
        view = await self.lookup(topic, "r")
        if view.youzan and view.partitions:
            wanted = [partition] if partition is not None else sorted(view.partitions)
            for pid in wanted:
                leader = view.leader(pid)
                if leader is None:
                    raise LookupFailed(f"{what}: partition {pid} of {topic!r} has no leader now")
                await self._write(leader.http_address, path,
                                  p.channel_params(topic, channel, pid), what=what,
                                  content=content)
            return
        for node in view.producers:
            await self._write(node.http_address, path, p.channel_params(topic, channel),
                              what=what, content=content)

    async def create_channel(self, topic: str, channel: str, *, partition: int | None = None,
                             address: str | None = None) -> None:
        """Create ``channel`` on one nsqd (``address``), else on each partition's leader."""
        await self._on_leaders("nsqd /channel/create", "/channel/create", topic, channel,
                               partition, address)

    async def delete_channel(self, topic: str, channel: str, *, partition: int | None = None,
                             address: str | None = None) -> None:
        """Delete ``channel`` on one nsqd (``address``), else on each partition's leader."""
        await self._on_leaders("nsqd /channel/delete", "/channel/delete", topic, channel,
                               partition, address)

    async def set_offset(self, topic: str, channel: str, position: StartPosition, *,
                         partition: int | None = None, address: str | None = None) -> None:
        """Move a youzan channel's cursor (``/channel/setoffset``) on one partition's leader
        (``partition``/``address``) or on every partition; the server applies it even with
        consumers connected."""
        body = p.setoffset_body(position)
        await self._on_leaders("nsqd /channel/setoffset", "/channel/setoffset", topic,
                               channel, partition, address, content=body)

    # -- topics ---------------------------------------------------------------------------------

    async def _youzan_leader(self, what: str) -> str | None:
        """The leader lookupd, or ``None`` when the lookupds are classic."""
        listing = await self.listlookup()
        if listing.classic:
            return None
        if listing.leader is None:
            raise AdminError(503, "no lookupd is leading the cluster (standalone lookupd, or "
                                  "an election under way)", what=what)
        return listing.leader

    async def delete_topic(self, topic: str) -> None:
        """Delete a topic: every partition through the leader lookupd (youzan), or on every
        nsqd and lookupd (classic)."""
        validate.check_topic(topic)
        leader = await self._youzan_leader("topic delete")
        if leader is not None:
            await self._write(leader, "/topic/delete", p.topic_delete_params(topic),
                              what="nsqlookupd /topic/delete")
            return
        params = p.topic_delete_params(topic, youzan=False)
        for node in await self.nodes():
            await self._write(node.http_address, "/topic/delete", params,
                              what="nsqd /topic/delete")
        for lookupd in self.lookupd:
            with contextlib.suppress(AdminError):  # a lookupd that never saw it says 404
                await self._write(lookupd, "/topic/delete", params,
                                  what="nsqlookupd /topic/delete")

    async def create_topic(self, topic: str, partitions: int = 1, replicas: int = 1, *,
                           ordered: bool = False, ext: bool = False,
                           multipart: bool | None = None,
                           disable_channel_auto_create: bool = False,
                           channels: Iterable[str] = (), wait: bool = True,
                           timeout: float = 60.0, resend_interval: float = 5.0,
                           poll_interval: float = 0.5,
                           progress: Progress | None = None) -> CreationProgress:
        """Create a topic, and with ``wait`` (the default) return only once it is usable.

        Youzan: ``POST /topic/create`` on the leader lookupd, re-sent every
        ``resend_interval`` seconds until the topic is usable; meanwhile each of
        ``channels`` is created on each partition's leader, until a write lookup lists every
        partition (without ``channels`` it returns once every partition has a leader: a
        youzan lookupd shows a partition to writers only once it has a channel).
        ``multipart`` defaults to whether ``partitions x replicas`` exceeds the nsqd count.
        Classic: the topic and channels are created on every nsqd lookupd knows.

        ``progress`` is called after every round with a :class:`CreationProgress`. Raises
        :class:`~smartnsq.errors.Timeout` (saying how far it got) when ``timeout`` passes,
        :class:`AdminError` when the cluster refuses (bad parameters, not enough nodes).
        A youzan lookupd's "No node is available for topic" while fewer nsqd are registered
        than ``replicas`` is taken for a cluster still starting for the first
        :data:`REGISTRATION_GRACE` seconds: the create is re-sent meanwhile (a ``Timeout`` then
        quotes that answer); after it, the refusal is raised.
        """
        channels = list(dict.fromkeys(channels))
        for name in channels:
            validate.check_channel(name)
        limit = _positive("timeout", timeout)
        resend = _positive("resend_interval", resend_interval)
        poll = _positive("poll_interval", poll_interval)
        p.topic_create_params(topic, partitions, replicas, ordered=ordered, ext=ext)
        started = time.monotonic()
        deadline = started + limit

        def left() -> float:
            return min(self.timeout, deadline - time.monotonic())

        note = ["asking the lookupds which one leads"]  # how far it got, for the Timeout
        try:
            return await asyncio.wait_for(
                self._create(topic, partitions, replicas, ordered, ext, multipart,
                             disable_channel_auto_create, channels, wait, started, deadline,
                             resend, poll, progress, left, note),
                limit)
        except asyncio.TimeoutError:
            raise Timeout(f"creating topic {topic!r}: not usable within {limit:g}s "
                          f"({note[0]})") from None

    async def _create(self, topic: str, partitions: int, replicas: int, ordered: bool,
                      ext: bool, multipart: bool | None, disable_auto: bool,
                      channels: list[str], wait: bool, started: float, deadline: float,
                      resend_interval: float, poll: float, progress: Progress | None,
                      left: Callable[[], float], note: list[str]) -> CreationProgress:
        leader = await self._youzan_leader("topic create")
        if leader is None:
            return await self._create_classic(topic, channels, started)
        if multipart is None:
            multipart = False
            if not ordered and partitions * replicas > 1:
                with contextlib.suppress(NSQError):
                    multipart = partitions * replicas > len(await self.nodes())
        params = p.topic_create_params(topic, partitions, replicas, ordered=ordered, ext=ext,
                                       multipart=multipart,
                                       disable_channel_auto_create=disable_auto)
        last_sent: float | None = None
        registered: set[str] = set()  # disable_channel_auto_create: allowed on the lookupd
        ready: dict[str, set[int]] = {c: set() for c in channels}
        read: TopicView | None = None
        write: TopicView | None = None
        last_error = ""
        while True:
            now = time.monotonic()
            state = p.creation_progress(
                topic, partitions, read=read, write=write,
                channels_ready=set.intersection(*ready.values()) if ready else (),
                want_channels=bool(channels), started=started, last_sent=last_sent, now=now,
                resend_interval=resend_interval)
            note[0] = state.describe() + (f"; last error: {last_error}"
                                                      if last_error else "")
            if state.resend:
                try:
                    await self._write(leader, "/topic/create", params,
                                      what="nsqlookupd /topic/create", timeout=left())
                    last_sent = time.monotonic()
                    log.debug("sent /topic/create %s to %s", topic, leader)
                except AdminError as exc:
                    if not exc.not_leader and not await self._registering(exc, replicas,
                                                                          started):
                        raise
                    last_error = str(exc)
                    if exc.not_leader:
                        leader = await self._youzan_leader("topic create") or leader
                except (ConnectionFailed, Timeout) as exc:
                    if last_sent is None and len(self.lookupd) == 1:
                        raise
                    last_error = str(exc)  # the leader lookupd may be changing: ask again
                    with contextlib.suppress(NSQError):
                        leader = await self._youzan_leader("topic create") or leader
            if disable_auto and last_sent is not None:
                for channel in channels:
                    if channel not in registered:
                        await self._register_channel(leader, topic, channel, left())
                        registered.add(channel)
            if progress is not None:
                progress(state)
            if state.done or not wait:
                return state
            read = await self._view(topic, "r", left)
            if read is not None and channels:
                for pid, node in sorted(read.leaders().items()):
                    for channel in channels:
                        if pid in ready[channel]:
                            continue
                        try:
                            await self._write(node.http_address, "/channel/create",
                                              p.channel_params(topic, channel, pid),
                                              what="nsqd /channel/create", timeout=left())
                            ready[channel].add(pid)
                        except AdminError as exc:
                            # E_FAILED_ON_NOT_LEADER while leaders settle: next round
                            if not exc.retriable:
                                raise
                            last_error = str(exc)
                        except (ConnectionFailed, Timeout) as exc:
                            last_error = str(exc)
                write = await self._view(topic, "w", left)
            if not state.done:
                await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    async def _registering(self, exc: AdminError, replicas: int, started: float) -> bool:
        """Whether a refused create is a cluster still starting: the lookupd says no node
        is available while fewer nsqd have registered than ``replicas`` asks for, within
        :data:`REGISTRATION_GRACE` of the call's start.

        A youzan lookupd counts only the nodes whose registration it has seen, so right after
        the cluster starts it refuses a create that will succeed once they are in; with
        enough nodes registered, or past the grace (a cluster that has too few nodes), the
        same answer is the cluster's final word.
        """
        if exc.status != 400 or "no node is available" not in exc.message.lower() \
                or time.monotonic() - started > REGISTRATION_GRACE:
            return False
        try:
            registered = len(await self.nodes())
        except NSQError:
            return False
        return registered < replicas

    async def _register_channel(self, leader: str, topic: str, channel: str,
                                timeout: float) -> None:
        """Allow ``channel`` of a topic created with ``disable_channel_auto_create`` (the
        leader lookupd's ``/channel/create``; one already allowed is fine)."""
        try:
            await self._write(leader, "/channel/create", {"topic": topic, "channel": channel},
                              what="nsqlookupd /channel/create", timeout=timeout)
        except AdminError as exc:
            if "already registered" not in exc.message:
                raise

    async def _view(self, topic: str, access: str, left: Callable[[], float]
                    ) -> TopicView | None:
        """The merged view, ``None`` while the lookupds do not show the topic (yet)."""
        try:
            return await self.lookup(topic, access, timeout=left())
        except (LookupFailed, ConnectionFailed, Timeout, ProtocolError) as exc:
            log.debug("lookup of %s (%s) during creation: %s", topic, access, exc)
            return None

    async def _create_classic(self, topic: str, channels: list[str],
                              started: float) -> CreationProgress:
        nodes = await self.nodes()
        if not nodes:
            raise AdminError(503, "the lookupds know no nsqd to create the topic on",
                             what="topic create")
        for node in nodes:
            await self._write(node.http_address, "/topic/create", {"topic": topic},
                              what="nsqd /topic/create")
            for channel in channels:
                await self._write(node.http_address, "/channel/create",
                                  p.channel_params(topic, channel),
                                  what="nsqd /channel/create")
        return CreationProgress(topic, 0, frozenset(), frozenset(), frozenset(),
                                bool(channels), time.monotonic() - started, False)


class Admin:
    """:class:`AsyncAdmin` as blocking calls, safe from any thread (same arguments, results
    and errors). Runs on a :class:`~smartnsq.transport.loop_thread.LoopThread` (default: the
    process-wide one); nothing is dialled at construction. Close it (or use ``with``)."""

    def __init__(self, lookupd: Sequence[str] | str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT, max_answer_bytes: int = DEFAULT_MAX_ANSWER,
                 loop_thread: LoopThread | None = None) -> None:
        self._async = AsyncAdmin(lookupd, timeout=timeout, max_answer_bytes=max_answer_bytes)
        self._shared = loop_thread is None
        self._thread = _loops.shared() if loop_thread is None else loop_thread.start()
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_admin, self._thread, self._shared,
                                           self._async)

    @property
    def async_admin(self) -> AsyncAdmin:
        """The async client behind this facade (use it only on ``loop_thread.loop``)."""
        return self._async

    @property
    def loop_thread(self) -> LoopThread:
        return self._thread

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("this Admin is closed")
        return self._thread.run(coro, timeout + _GUARD)

    def listlookup(self, address: str | None = None) -> LookupdList:
        return self._run(self._async.listlookup(address),
                         self._async.timeout * max(1, len(self._async.lookupd)))

    def leader_lookupd(self) -> str | None:
        return self._run(self._async.leader_lookupd(),
                         self._async.timeout * max(1, len(self._async.lookupd)))

    def lookup(self, topic: str, access: str = "r") -> TopicView:
        return self._run(self._async.lookup(topic, access), self._async.timeout)

    def nodes(self) -> tuple[Node, ...]:
        return self._run(self._async.nodes(),
                         self._async.timeout * max(1, len(self._async.lookupd)))

    def info(self, address: str) -> NodeInfo:
        return self._run(self._async.info(address), self._async.timeout)

    def stats(self, address: str, topic: str | None = None, channel: str | None = None, *,
              partition: int | None = None, leader_only: bool = False) -> NodeStats:
        return self._run(self._async.stats(address, topic, channel, partition=partition,
                                           leader_only=leader_only), self._async.timeout)

    def cluster_stats(self, topic: str | None = None, channel: str | None = None, *,
                      nsqd: Sequence[str] | None = None) -> dict[str, NodeStats | NSQError]:
        return self._run(self._async.cluster_stats(topic, channel, nsqd=nsqd),
                         self._async.timeout * (1 + len(self._async.lookupd)))

    def channel_lag(self, topic: str, channel: str, *,
                    nodes: Sequence[tuple[int | None, str]] | None = None) -> ChannelLag:
        return self._run(self._async.channel_lag(topic, channel, nodes=nodes),
                         self._async.timeout * 2)

    def _per_partition(self) -> float:
        return self._async.timeout * (2 + 256)  # a lookup, then one request per partition

    def create_channel(self, topic: str, channel: str, *, partition: int | None = None,
                       address: str | None = None) -> None:
        self._run(self._async.create_channel(topic, channel, partition=partition,
                                             address=address), self._per_partition())

    def delete_channel(self, topic: str, channel: str, *, partition: int | None = None,
                       address: str | None = None) -> None:
        self._run(self._async.delete_channel(topic, channel, partition=partition,
                                             address=address), self._per_partition())

    def set_offset(self, topic: str, channel: str, position: StartPosition, *,
                   partition: int | None = None, address: str | None = None) -> None:
        self._run(self._async.set_offset(topic, channel, position, partition=partition,
                                         address=address), self._per_partition())

    def delete_topic(self, topic: str) -> None:
        self._run(self._async.delete_topic(topic), self._per_partition())

    def create_topic(self, topic: str, partitions: int = 1, replicas: int = 1, *,
                     timeout: float = 60.0, progress: Progress | None = None,
                     **options: Any) -> CreationProgress:
        """Blocking :meth:`AsyncAdmin.create_topic`; ``progress`` runs on the loop thread."""
        limit = _positive("timeout", timeout)
        return self._run(self._async.create_topic(topic, partitions, replicas, timeout=limit,
                                                  progress=progress, **options), limit)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<smartnsq.admin.Admin {', '.join(self._async.lookupd) or '-'} {state}>"


def _lag_of(answer: NodeStats | NSQError, topic: str, channel: str, partition: int | None,
            address: str) -> PartitionLag:
    """One partition's :class:`PartitionLag` from its node's ``/stats`` (or its error)."""
    if isinstance(answer, NSQError):
        return PartitionLag(partition, address, error=str(answer))
    entry = answer.topic(topic, partition)
    if entry is None:
        return PartitionLag(partition, address, error="the node does not have the topic")
    chan = entry.channel(channel)
    if chan is None:
        return PartitionLag(partition, address, topic_depth=entry.depth,
                            message_count=entry.message_count,
                            backend_start=entry.backend_start,
                            backend_depth=entry.backend_depth,
                            error="the node does not have the channel")
    return PartitionLag(entry.partition if partition is None else partition, address,
                        depth=chan.depth, in_flight=chan.in_flight, deferred=chan.deferred,
                        requeued=chan.requeued, timed_out=chan.timed_out,
                        clients=chan.clients, backlogs=chan.backlogs,
                        topic_depth=entry.depth, message_count=entry.message_count,
                        backend_start=entry.backend_start, backend_depth=entry.backend_depth)


def _close_admin(thread: LoopThread, shared: bool, client: AsyncAdmin) -> None:
    try:
        if thread.running and not thread.in_loop_thread():
            with contextlib.suppress(Exception):
                thread.run(client.aclose(), _GUARD)
    finally:
        if shared:
            _loops.release_shared(thread)
