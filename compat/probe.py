"""Asking lookupds which kind they are (the I/O half of :mod:`smartnsq.compat.detect`).

``GET /listlookup`` decides (404: classic, 200: youzan); when it proves nothing (a 5xx, a
proxy in between) ``GET /info`` is asked. A lookupd that answers neither is ``None``
(unknown): callers keep it aside and ask again later, since a cluster may be in the middle of
changing kind, and they never guess from the port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from smartnsq.errors import ProtocolError
from smartnsq.lookup import normalize_lookupd
from smartnsq.protocol.lookup import ACCEPT_V1, unwrap

from .detect import Kind, kind_of_info, kind_of_listlookup

__all__ = ["LookupdGroups", "group_lookupds", "probe_lookupd"]

log = logging.getLogger("smartnsq.compat")

_HEADERS = {"Accept": ACCEPT_V1}


def _client(timeout: float) -> httpx.AsyncClient:
    # as the rest of the library: no proxy or credentials from the environment (a lookupd is
    # an internal address; HTTP(S)_PROXY would route the probe elsewhere)
    return httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False)


async def _get(http: httpx.AsyncClient, base: str, path: str, timeout: float) \
        -> tuple[int, object] | None:
    """``(status, data)`` of a lookupd answer, through the core's envelope reader; ``None``
    when the body is not JSON (a proxy's page: it proves nothing)."""
    response = await http.get(base + path, headers=_HEADERS, timeout=timeout)
    try:
        status, data, _ = unwrap(response.status_code, response.content)
    except ProtocolError:
        return None
    return status, data


async def probe_lookupd(address: str, *, client: httpx.AsyncClient | None = None,
                        timeout: float = 2.0) -> Kind | None:
    """The kind of the lookupd at ``address`` (``"host:port"`` or a URL), or ``None``.

    A malformed address raises ``InvalidArgument`` (as everywhere lookupd addresses are
    taken); one that does not answer is ``None``.
    """
    base = f"http://{normalize_lookupd(address)}"
    own = client is None
    http = client or _client(timeout)
    try:
        try:
            answer = await _get(http, base, "/listlookup", timeout)
            if answer is not None:
                kind = kind_of_listlookup(*answer)
                if kind is not None:
                    return kind
            answer = await _get(http, base, "/info", timeout)
            if answer is not None and answer[0] == 200:
                return kind_of_info(answer[1])
            return None
        except httpx.HTTPError as exc:
            log.info("lookupd %s did not answer the kind probe: %s", address, exc)
            return None
    finally:
        if own:
            await http.aclose()


@dataclass(frozen=True)
class LookupdGroups:
    """Lookupd addresses split by kind; ``unknown`` did not answer (ask again later)."""

    youzan: tuple[str, ...]
    classic: tuple[str, ...]
    unknown: tuple[str, ...]

    @property
    def mixed(self) -> bool:
        return bool(self.youzan) and bool(self.classic)


async def group_lookupds(addresses: Iterable[str], *, timeout: float = 2.0) -> LookupdGroups:
    """Probe every lookupd at once and split them by kind (order kept within each group)."""
    wanted = list(dict.fromkeys(addresses))
    async with _client(timeout) as client:
        kinds = await asyncio.gather(*(probe_lookupd(a, client=client, timeout=timeout)
                                       for a in wanted))
    groups: dict[Kind | None, list[str]] = {Kind.YOUZAN: [], Kind.CLASSIC: [], None: []}
    for address, kind in zip(wanted, kinds, strict=True):
        groups[kind].append(address)
    return LookupdGroups(tuple(groups[Kind.YOUZAN]), tuple(groups[Kind.CLASSIC]),
                         tuple(groups[None]))
