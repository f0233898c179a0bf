"""The request layer every admin call shares, and the lookupd calls the others build on.

:class:`AdminBase` holds what one HTTP exchange needs (the deadline of the whole request, the
bound on the answer, errors that say what was asked where) and the cluster-wide reads every
workflow starts from (``/listlookup``, ``/lookup`` of every lookupd at once, ``/nodes``), so
the topic creation (:mod:`.creation`), the operator's actions (:mod:`.operator`) and the
node reads (:mod:`.client`) are written once over the same requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..discovery.lookup import normalize_lookupds
from ..errors import (
    AdminError,
    AnswerTooLarge,
    ConnectionFailed,
    HttpError,
    HttpTimeout,
    InvalidArgument,
    LookupdError,
    LookupFailed,
    NotHttp,
    NSQError,
    ProtocolError,
    Timeout,
    TopicNotFound,
)
from ..model.lookupd_health import http_url
from ..protocol import admin as p
from ..protocol import validate
from ..protocol.diagnose import first_line, is_html, lookupd_hint, not_lookupd
from ..protocol.lookup import (
    LookupdList,
    Node,
    TopicView,
    lookup_params,
    merge_views,
    parse_listlookup,
    parse_lookup,
)
from ..protocol.numbers import check_int, check_number
from ..transport.http import HttpClient

__all__ = ["DEFAULT_MAX_ANSWER", "DEFAULT_TIMEOUT", "AdminBase", "check_addresses", "positive"]

log = logging.getLogger("smartnsq.admin")

T = TypeVar("T")
A = TypeVar("A", bound="AdminBase")

DEFAULT_TIMEOUT = 5.0
DEFAULT_MAX_ANSWER = 16 * 1024 * 1024
_HEADERS = {"Accept": p.ACCEPT_V1}

ParamsOf = Callable[[int | None], dict[str, str]]
"""The query of one node's request, given the partition it is sent for (``None``: classic)."""


def positive(name: str, value: object) -> float:
    return check_number(name, value, low_open=True)


def check_addresses(values: Sequence[str] | str | None, what: str) -> tuple[str, ...]:
    """``"a:1,b:2"`` is two addresses, alone or in a list; a bad one names ``what``."""
    try:
        return tuple(normalize_lookupds(values))
    except InvalidArgument as exc:
        raise InvalidArgument(what, "must be 'host:http_port'", exc.value) from None


class AdminBase:
    """The requests of :class:`smartnsq.admin.AsyncAdmin` (which documents the arguments)."""

    def __init__(self, lookupd: Sequence[str] | str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER,
                 client: HttpClient | None = None) -> None:
        self.lookupd = check_addresses(lookupd, "lookupd")
        self.timeout = positive("timeout", timeout)
        check_int("max_answer_bytes", max_answer_bytes, 1024)
        self.max_answer_bytes = max_answer_bytes
        self._client = client
        self._own_client = client is None

    async def __aenter__(self: A) -> A:
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
        except NotHttp as exc:
            if address in self.lookupd:  # nsqd's TCP port given as a lookupd, say
                raise ProtocolError(f"{what}: {address}: {lookupd_hint(exc.found)}") from None
            raise ProtocolError(f"{what}: {address}: {exc}") from None
        except HttpError as exc:
            raise ProtocolError(f"{what}: {address}: {exc}") from None
        except ConnectionFailed as exc:
            reason = getattr(exc, "reason", "") or str(exc)
            raise ConnectionFailed(f"{what}: cannot reach {address} ({reason})") from exc
        if address in self.lookupd and not_lookupd(answer.status, answer.body, path):
            # another kind of server answers there, the same way every time: the sentence the
            # producer's and the consumer's lookups give for the same wrong address
            found = (f"an HTML page (HTTP {answer.status}, {first_line(answer.body)!r})"
                     if is_html(answer.body) else
                     f"nsqd's {answer.status} NOT_FOUND to {path}")
            raise ProtocolError(f"{what}: {address}: {lookupd_hint(found)}")
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
            return await ask(check_addresses([address], "address")[0])
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

    async def _on_leaders(self, what: str, path: str, topic: str, params_of: ParamsOf,
                          partition: int | None, address: str | None,
                          content: bytes = b"") -> list[tuple[int | None, str]]:
        """``path`` on one nsqd (``address``) or on each partition's leader (youzan) / each
        node serving the topic (classic); the ``(partition, node)`` pairs it was sent to.

        ``params_of(partition)`` is called once before any lookup, so a bad argument is
        refused before anything is asked."""
        params_of(partition)
        if address is not None:
            address = check_addresses([address], "address")[0]
            await self._write(address, path, params_of(partition), what=what, content=content)
            return [(partition, address)]
        view = await self.lookup(topic, "r")
        done: list[tuple[int | None, str]] = []
        if view.youzan and view.partitions:
            wanted = [partition] if partition is not None else sorted(view.partitions)
            for pid in wanted:
                leader = view.leader(pid)
                if leader is None:
                    raise LookupFailed(f"{what}: partition {pid} of {topic!r} has no leader now")
                await self._write(leader.http_address, path, params_of(pid), what=what,
                                  content=content)
                done.append((pid, leader.http_address))
            return done
        for node in view.producers:
            await self._write(node.http_address, path, params_of(None), what=what,
                              content=content)
            done.append((None, node.http_address))
        return done

    async def _youzan_leader(self, what: str) -> str | None:
        """The leader lookupd, or ``None`` when the lookupds are classic."""
        listing = await self.listlookup()
        if listing.classic:
            return None
        if listing.leader is None:
            raise AdminError(503, "no lookupd is leading the cluster (standalone lookupd, or "
                                  "an election under way)", what=what)
        return listing.leader
