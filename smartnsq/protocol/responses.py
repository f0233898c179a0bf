"""Decoding of response payloads: the traced-publish receipt, IDENTIFY's and AUTH's JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from struct import Struct
from typing import Any

from ..errors import ProtocolError
from .diagnose import describe_start, first_line
from .frames import partition_of

_TRACED = Struct(">2sQQQI")
TRACED_RESPONSE_SIZE = _TRACED.size  # 30


@dataclass(frozen=True)
class PublishReceipt:
    """What youzan nsqd reports for PUB_TRACE, MPUB_TRACE and PUB_EXT with ``##trace_id``.

    For MPUB_TRACE the id and offset are the first message's, ``trace_id`` is 0 and
    ``raw_size`` covers the whole batch.
    """

    internal_id: int
    trace_id: int
    queue_offset: int
    raw_size: int

    @property
    def partition(self) -> int:
        return partition_of(self.internal_id)


def parse_publish_response(data: bytes) -> PublishReceipt | None:
    """``None`` for a plain ``OK``; a receipt for the 30-byte traced answer."""
    fields = publish_response_fields(data)
    return None if fields is None else PublishReceipt(*fields)


def publish_response_fields(data: bytes) -> tuple[int, int, int, int] | None:
    """``None`` for a plain ``OK``; (internal id, trace id, queue offset, raw size) of the
    30-byte traced answer: what a publish result copies, without building a receipt."""
    if data == b"OK":
        return None
    if len(data) != TRACED_RESPONSE_SIZE or data[:2] != b"OK":
        raise ProtocolError(f"unexpected publish response {bytes(data[:40])!r}")
    _, internal_id, trace_id, offset, raw_size = _TRACED.unpack(data)
    return internal_id, trace_id, offset, raw_size


def encode_publish_receipt(receipt: PublishReceipt) -> bytes:
    return _TRACED.pack(b"OK", receipt.internal_id, receipt.trace_id, receipt.queue_offset,
                        receipt.raw_size)


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise ProtocolError(f"{what} is not JSON: {describe_start(bytes(data[:256]))}") \
            from exc
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is not a JSON object: {first_line(bytes(data[:256]))!r}")
    return value


@dataclass(frozen=True)
class IdentifyResponse:
    """The server's answer to IDENTIFY with ``feature_negotiation``.

    Without feature negotiation the server answers a bare ``OK``; ``negotiated`` is then false
    and every field keeps the server defaults a client must assume.
    """

    negotiated: bool = False
    version: str = ""
    max_rdy_count: int = 2500
    max_msg_timeout: int = 900_000
    msg_timeout: int = 60_000
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    max_deflate_level: int = 6
    snappy: bool = False
    sample_rate: int = 0
    auth_required: bool = False
    output_buffer_size: int = 16384
    output_buffer_timeout: int = 250
    desired_tag: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_youzan(self) -> bool:
        """Youzan (HA) nodes report versions such as ``0.3.7-HA.1.13.0``."""
        return "-HA." in self.version

    @property
    def upgrades(self) -> int:
        """How many extra ``OK`` frames follow (one per TLS, snappy, deflate upgrade)."""
        return int(self.tls_v1) + int(self.snappy) + int(self.deflate)


_INT_FIELDS = ("max_rdy_count", "max_msg_timeout", "msg_timeout", "deflate_level",
               "max_deflate_level", "sample_rate", "output_buffer_size", "output_buffer_timeout")
_BOOL_FIELDS = ("tls_v1", "deflate", "snappy", "auth_required")


def parse_identify_response(data: bytes) -> IdentifyResponse:
    if data == b"OK":
        return IdentifyResponse()
    obj = _json_object(data, "IDENTIFY response")
    kwargs: dict[str, Any] = {"negotiated": True, "raw": obj}
    for name in _INT_FIELDS:
        if name in obj:
            if not isinstance(obj[name], int) or isinstance(obj[name], bool):
                raise ProtocolError(f"IDENTIFY response field {name} is not an integer")
            kwargs[name] = obj[name]
    for name in _BOOL_FIELDS:
        if name in obj:
            kwargs[name] = bool(obj[name])
    kwargs["version"] = str(obj.get("version", ""))
    kwargs["desired_tag"] = str(obj.get("desired_tag", "") or "")
    return IdentifyResponse(**kwargs)


@dataclass(frozen=True)
class AuthResponse:
    identity: str
    identity_url: str
    permission_count: int


def parse_auth_response(data: bytes) -> AuthResponse:
    obj = _json_object(data, "AUTH response")
    try:
        return AuthResponse(str(obj["identity"]), str(obj.get("identity_url", "")),
                            int(obj["permission_count"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"AUTH response lacks identity/permission_count: {obj!r}") from exc
