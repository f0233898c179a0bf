"""Asking lookupds which kind they are (the I/O half of :mod:`smartnsq.compat.detect`).

``GET /listlookup`` decides (404: classic, 200: youzan); when it proves nothing (a 5xx, a
proxy in between) ``GET /info`` is asked. A lookupd that answers neither is ``None``
(unknown): callers keep it aside and ask again later, since a cluster may be in the middle of
changing kind, and they never guess from the port.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from .detect import Kind, kind_of_info, kind_of_listlookup

__all__ = ["LookupdGroups", "group_lookupds", "probe_lookupd"]

log = logging.getLogger("smartnsq.compat")

ACCEPT_V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def _url(address: str, path: str) -> str:
    base = address if "://" in address else f"http://{address}"
    return base.rstrip("/") + path


def _json(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        return None


async def probe_lookupd(address: str, *, client: httpx.AsyncClient | None = None,
                        timeout: float = 2.0) -> Kind | None:
    """The kind of the lookupd at ``address`` (``"host:port"`` or a URL), or ``None``."""
    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout)
    try:
        try:
            response = await http.get(_url(address, "/listlookup"), headers=ACCEPT_V1,
                                      timeout=timeout)
            kind = kind_of_listlookup(response.status_code, _json(response))
            if kind is not None:
                return kind
            response = await http.get(_url(address, "/info"), headers=ACCEPT_V1,
                                      timeout=timeout)
            if response.status_code == 200:
                return kind_of_info(_json(response))
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
    async with httpx.AsyncClient(timeout=timeout) as client:
        kinds = await asyncio.gather(*(probe_lookupd(a, client=client, timeout=timeout)
                                       for a in wanted))
    groups: dict[Kind | None, list[str]] = {Kind.YOUZAN: [], Kind.CLASSIC: [], None: []}
    for address, kind in zip(wanted, kinds, strict=True):
        groups[kind].append(address)
    return LookupdGroups(tuple(groups[Kind.YOUZAN]), tuple(groups[Kind.CLASSIC]),
                         tuple(groups[None]))
