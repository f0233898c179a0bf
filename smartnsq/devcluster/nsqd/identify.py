"""IDENTIFY on the server side: decoding the JSON as Go does, and each flavour's rules.

Go's ``json.Unmarshal`` into nsqd's ``identifyDataV2`` decides what a malformed body is: a
wrong type for a known field (a string for ``heartbeat_interval``, ``1.5`` for an int) fails
the whole decode, unknown fields are ignored, ``null`` leaves the default, and field names
match case-insensitively. The value rules then differ between youzan (output buffer defaults
100 bytes / 50 ms, timeouts 1-9 forced to 10, ``desired_tag``, ``extend_support``) and classic
1.3 (16 KiB / 250 ms, a 25 ms minimum timeout); the texts are the servers' own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["IdentifyData", "IdentifyLimits", "decode_identify"]

_TAG_RE: Final = re.compile(r"[a-zA-Z0-9_-]+\Z")  # (\Z: Go's $ matches no newline)
MAX_TAG_LEN: Final = 100

# field name -> (kind, bits) as declared in the Go struct
_FIELDS: Final[dict[str, tuple[str, int]]] = {
    "short_id": ("str", 0), "long_id": ("str", 0), "client_id": ("str", 0),
    "hostname": ("str", 0), "heartbeat_interval": ("int", 64),
    "output_buffer_size": ("int", 64), "output_buffer_timeout": ("int", 64),
    "feature_negotiation": ("bool", 0), "tls_v1": ("bool", 0), "deflate": ("bool", 0),
    "deflate_level": ("int", 64), "snappy": ("bool", 0), "sample_rate": ("int", 32),
    "user_agent": ("str", 0), "msg_timeout": ("int", 64),
}
_YOUZAN_FIELDS: Final[dict[str, tuple[str, int]]] = {
    "desired_tag": ("str", 0), "extend_support": ("bool", 0), "ext_filter": ("object", 0),
}


@dataclass
class IdentifyData:
    """The decoded request; zero values where the client sent nothing (Go semantics)."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    heartbeat_interval: int = 0
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    msg_timeout: int = 0
    desired_tag: str = ""
    extend_support: bool = False
    ext_filter: dict[str, Any] = field(default_factory=dict)


def decode_identify(body: bytes, *, youzan: bool) -> IdentifyData:
    """Decode like ``json.Unmarshal``; ``ValueError`` where Go's decode fails."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("invalid JSON") from exc
    data = IdentifyData()
    if value is None:
        return data
    if not isinstance(value, dict):
        raise ValueError("not an object")
    known = dict(_FIELDS)
    if youzan:
        known.update(_YOUZAN_FIELDS)
    values: dict[str, Any] = {}
    for key, item in value.items():
        name = key if key in known else next(
            (k for k in known if k.lower() == key.lower()), None)
        if name is None or item is None:
            continue
        kind, bits = known[name]
        if kind == "str":
            if not isinstance(item, str):
                raise ValueError(f"{name} is not a string")
        elif kind == "bool":
            if not isinstance(item, bool):
                raise ValueError(f"{name} is not a bool")
        elif kind == "int":
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"{name} is not an integer")
            if not -(1 << (bits - 1)) <= item < 1 << (bits - 1):
                raise ValueError(f"{name} overflows int{bits}")
        elif not isinstance(item, dict):
            raise ValueError(f"{name} is not an object")
        values[name] = item
    data.client_id = values.get("client_id") or values.get("short_id", "")
    data.hostname = values.get("hostname") or values.get("long_id", "")
    for name in ("user_agent", "heartbeat_interval", "output_buffer_size",
                 "output_buffer_timeout", "feature_negotiation", "tls_v1", "deflate",
                 "deflate_level", "snappy", "sample_rate", "msg_timeout", "desired_tag",
                 "extend_support", "ext_filter"):
        if name in values:
            setattr(data, name, values[name])
    return data


@dataclass(frozen=True)
class IdentifyLimits:
    """The server options IDENTIFY values are checked against (all in ms / bytes)."""

    max_heartbeat_interval: int
    max_output_buffer_size: int
    min_output_buffer_timeout: int
    max_output_buffer_timeout: int
    max_msg_timeout: int


def heartbeat(value: int, current: int, limits: IdentifyLimits) -> int:
    if value == -1:
        return 0
    if value == 0:
        return current
    if 1000 <= value <= limits.max_heartbeat_interval:
        return value
    raise ValueError(f"heartbeat interval ({value}) is invalid")


def youzan_output_buffer_size(value: int, current: int, limits: IdentifyLimits) -> int:
    if value == -1:
        return 1
    if value == 0:
        return current
    if value >= 64:
        return min(value, limits.max_output_buffer_size)
    raise ValueError(f"output buffer size ({value}) is invalid")


def youzan_output_buffer_timeout(value: int, current: int, limits: IdentifyLimits) -> int:
    if value == -1:
        return 0
    if value == 0:
        return current
    if 1 <= value <= limits.max_output_buffer_timeout:
        return max(value, 10)
    raise ValueError(f"output buffer timeout ({value}) is invalid")


def classic_output_buffer(size: int, timeout: int, cur_size: int, cur_timeout: int,
                          limits: IdentifyLimits) -> tuple[int, int]:
    if timeout == -1:
        cur_timeout = 0
    elif timeout == 0:
        pass
    elif limits.min_output_buffer_timeout <= timeout <= limits.max_output_buffer_timeout:
        cur_timeout = timeout
    else:
        raise ValueError(f"output buffer timeout ({timeout}) is invalid")
    if size == -1:
        return 1, 0
    if size == 0:
        return cur_size, cur_timeout
    if 64 <= size <= limits.max_output_buffer_size:
        return size, cur_timeout
    raise ValueError(f"output buffer size ({size}) is invalid")


def sample_rate(value: int) -> int:
    if not 0 <= value <= 99:
        raise ValueError(f"sample rate ({value}) is invalid")
    return value


def msg_timeout(value: int, current: int, limits: IdentifyLimits) -> int:
    if value == 0:
        return current
    if 1000 <= value <= limits.max_msg_timeout:
        return value
    raise ValueError(f"msg timeout ({value}) is invalid")


def desired_tag(value: str) -> str:
    """youzan's ``ext.ValidateTag`` (an empty tag keeps the current one)."""
    if len(value.encode()) > MAX_TAG_LEN:
        raise ValueError(f"invalid tag len {len(value.encode())}, exceed limit {MAX_TAG_LEN}")
    if _TAG_RE.match(value) is None:
        raise ValueError(f"invalid tag {value}")
    return value
