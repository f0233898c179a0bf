"""Asking lookupds which kind they are (the I/O half of :mod:`smartnsq.compat.detect`).

``GET /listlookup`` decides (404: classic, 200: youzan); when it proves nothing (a 5xx, a
proxy in between) ``GET /info`` is asked. A lookupd that answers neither is ``None``
(unknown): callers keep it aside and ask again later, since a cluster may be in the middle of
changing kind, and they never guess from the port. The requests go through
:class:`smartnsq.admin.AsyncAdmin` (its deadline, answer bound and readers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from smartnsq.admin import AsyncAdmin
from smartnsq.discovery.lookup import normalize_lookupd
from smartnsq.errors import AdminError, ConnectionFailed, ProtocolError, Timeout

from .detect import Kind, kind_of_version

__all__ = ["LookupdGroups", "group_lookupds", "probe_lookupd"]

log = logging.getLogger("smartnsq.compat")


async def probe_lookupd(address: str, *, admin: AsyncAdmin | None = None,
                        timeout: float = 2.0) -> Kind | None:
    """The kind of the lookupd at ``address`` (``"host:port"`` or a URL), or ``None``.

    A malformed address raises ``InvalidArgument`` (as everywhere lookupd addresses are
    taken); one that does not answer is ``None``. ``admin`` lends a client (its timeout
    then applies).
    """
    where = normalize_lookupd(address)
    own = admin is None
    client = AsyncAdmin(timeout=timeout) if admin is None else admin
    try:
        try:
            listing = await client.listlookup(where)
            return Kind.CLASSIC if listing.classic else Kind.YOUZAN
        except (AdminError, ProtocolError) as exc:  # a 5xx, a proxy's page: proves nothing
            log.debug("lookupd %s: /listlookup proves nothing (%s); asking /info", where, exc)
        try:
            info = await client.info(where)
        except (AdminError, ProtocolError):
            return None
        return Kind.YOUZAN if info.ha_support is not None else kind_of_version(info.version)
    except (ConnectionFailed, Timeout) as exc:
        log.info("lookupd %s did not answer the kind probe: %s", address, exc)
        return None
    finally:
        if own:
            await client.aclose()


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
    async with AsyncAdmin(timeout=timeout) as admin:
        kinds = await asyncio.gather(*(probe_lookupd(a, admin=admin) for a in wanted))
    groups: dict[Kind | None, list[str]] = {Kind.YOUZAN: [], Kind.CLASSIC: [], None: []}
    for address, kind in zip(wanted, kinds, strict=True):
        groups[kind].append(address)
    return LookupdGroups(tuple(groups[Kind.YOUZAN]), tuple(groups[Kind.CLASSIC]),
                         tuple(groups[None]))
