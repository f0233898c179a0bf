"""The secrets table that stands in for nsqd's ``--auth-http-address`` server.

A real nsqd sends each AUTH secret to an HTTP auth server and caches the answer: an identity
and a list of authorizations (topic regexp, channel regexps, permissions). The dev cluster asks
a table instead, built from exactly that answer format, so a table can be copied from a real
auth server's configuration::

    auth = {
        "goodsecret": {"identity": "x", "identity_url": "",
                       "authorizations": [{"topic": "^allowed_.*$", "channels": [".*"],
                                           "permissions": ["subscribe", "publish"]}]},
        "noperms": {"identity": "y", "authorizations": []},
    }

A secret missing from the table is what the auth server's 403 gives: ``E_AUTH_FAILED``. The
values may also be :class:`Identity` objects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AuthTable", "Authorization", "Identity"]


@dataclass(frozen=True)
class Authorization:
    """One grant: topics matching ``topic``, channels matching any of ``channels``."""

    topic: str
    channels: tuple[str, ...] = (".*",)
    permissions: tuple[str, ...] = ("subscribe", "publish")

    def allows(self, topic: str, channel: str) -> bool:
        """nsqd's ``Authorization.IsAllowed``: PUB checks ``publish``, SUB ``subscribe``."""
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        if re.search(self.topic, topic) is None:
            return False
        return any(re.search(pattern, channel) is not None for pattern in self.channels)


@dataclass(frozen=True)
class Identity:
    identity: str
    authorizations: tuple[Authorization, ...] = ()
    identity_url: str = ""

    def allows(self, topic: str, channel: str) -> bool:
        return any(a.allows(topic, channel) for a in self.authorizations)


@dataclass
class AuthTable:
    """secret -> :class:`Identity`."""

    identities: dict[str, Identity] = field(default_factory=dict)

    @classmethod
    def build(cls, table: AuthTable | Mapping[str, Any] | None) -> AuthTable | None:
        if table is None or isinstance(table, AuthTable):
            return table
        return cls({str(secret): _identity(value) for secret, value in table.items()})

    def lookup(self, secret: str) -> Identity | None:
        return self.identities.get(secret)


def _identity(value: Any) -> Identity:
    if isinstance(value, Identity):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"auth table values are Identity or mappings, not {type(value)!r}")
    grants = tuple(_authorization(a) for a in value.get("authorizations") or ())
    return Identity(str(value.get("identity", "")), grants, str(value.get("identity_url", "")))


def _authorization(value: Any) -> Authorization:
    if isinstance(value, Authorization):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"authorizations are Authorization or mappings, not {type(value)!r}")
    channels: Iterable[str] = value.get("channels") or ()
    permissions: Iterable[str] = value.get("permissions") or ()
    return Authorization(str(value.get("topic", "")), tuple(channels), tuple(permissions))
