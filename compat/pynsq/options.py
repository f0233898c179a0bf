"""What pynsq's Reader, Writer and AsyncConn share: their connection keywords and addresses.

pynsq's ``AsyncConn`` keywords (``Reader(**kwargs)`` and ``Writer(**kwargs)`` pass them on) as
smartnsq ``ConnectionConfig`` fields, pynsq's address lists as smartnsq takes them, and the
``conn`` a publish callback or ``heartbeat()`` gets.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

from smartnsq.config import ConnectionConfig
from smartnsq.discovery.lookup import normalize_lookupd
from smartnsq.errors import InvalidArgument

__all__ = ["CONN_ARGS", "Conn", "addresses", "connection_options", "lookupd_addresses"]

# pynsq's AsyncConn keyword arguments (what Reader/Writer accept in **kwargs)
CONN_ARGS = frozenset({
    "timeout", "heartbeat_interval", "requeue_delay", "tls_v1", "tls_options", "snappy",
    "deflate", "deflate_level", "user_agent", "output_buffer_size", "output_buffer_timeout",
    "sample_rate", "auth_secret", "msg_timeout", "hostname",
})


def connection_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """pynsq ``AsyncConn`` keywords as ``ConnectionConfig`` fields, plus ``requeue_delay``."""
    unknown = set(kwargs) - CONN_ARGS
    if unknown:
        raise InvalidArgument("keyword arguments", "not pynsq AsyncConn arguments",
                              sorted(unknown))
    out: dict[str, Any] = {}
    if "timeout" in kwargs:
        out["connect_timeout"] = float(kwargs["timeout"])
    if "heartbeat_interval" in kwargs:
        out["heartbeat_interval"] = float(kwargs["heartbeat_interval"])
    if kwargs.get("snappy"):
        out["compression"] = "snappy"
    if kwargs.get("deflate"):
        if kwargs.get("snappy"):
            raise InvalidArgument("compression", "choose snappy or deflate, not both")
        out["compression"] = "deflate"
    if "deflate_level" in kwargs:
        out["deflate_level"] = kwargs["deflate_level"]
    if kwargs.get("tls_v1"):
        options = dict(kwargs.get("tls_options") or {})
        out["tls"] = True
        if options.get("cert_reqs") == ssl.CERT_NONE:
            out["tls_verify"] = False
        for theirs, ours in (("ca_certs", "tls_ca_file"), ("certfile", "tls_cert_file"),
                             ("keyfile", "tls_key_file")):
            if options.get(theirs):
                out[ours] = options[theirs]
    for name in ("user_agent", "sample_rate", "hostname"):
        if kwargs.get(name) is not None:
            out[name] = kwargs[name]
    if kwargs.get("output_buffer_size") is not None:
        out["output_buffer_size"] = kwargs["output_buffer_size"]
    if kwargs.get("output_buffer_timeout") is not None:
        out["output_buffer_timeout"] = max(10, kwargs["output_buffer_timeout"]) / 1000.0
    if kwargs.get("msg_timeout") is not None:
        out["msg_timeout"] = float(kwargs["msg_timeout"])
    secret = kwargs.get("auth_secret")
    if secret is not None:
        out["auth_secret"] = secret.decode() if isinstance(secret, bytes) else str(secret)
    requeue_delay = float(kwargs.get("requeue_delay", 90))
    ConnectionConfig(**out)  # bad values fail here, with the field's name
    return out, requeue_delay


def addresses(value: str | Iterable[str] | None, what: str) -> list[str]:
    """pynsq's address arguments (one address, or a list) as a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable):
        return list(value)
    raise InvalidArgument(what, "must be an address or a list of addresses", value)


def lookupd_addresses(given: list[str]) -> list[str]:
    """pynsq's ``http://host:port`` addresses as the core takes them (``host:port``)."""
    return [normalize_lookupd(a) for a in given]


class Conn:
    """The ``conn`` a publish callback gets: which nsqd answered (pynsq passes its AsyncConn)."""

    __slots__ = ("host", "id", "port")

    def __init__(self, node: str) -> None:
        self.id = node
        host, _, port = node.rpartition(":")
        self.host = host
        self.port = int(port) if port.isascii() and port.isdigit() else 0

    def __repr__(self) -> str:
        return f"<Conn {self.id}>"

