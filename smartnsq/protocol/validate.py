"""Checks applied before any byte is built, so a bad value never reaches the server.

The rules are the server's own (docs/protocol.md §3.3, §3.5, §3.7): the server would close
the connection on most of these, taking every other in-flight call with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import InvalidArgument
from .numbers import check_int

MAX_NAME_LENGTH = 64
MAX_PARTITION = 1023  # ids carry the partition in 10 bits: (internal_id >> 50) & 0x3FF
MAX_UINT64 = (1 << 64) - 1
MAX_EXT_LENGTH = 0xFFFF  # the ext block's length is a uint16
DEFAULT_MAX_MSG_SIZE = 1024 * 1024
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
MAX_DESIRED_TAG_LENGTH = 100
TRACE_ID_HEADER = "##trace_id"  # the ext header carrying a trace id (PUB_EXT answers traced)

# \Z, not $: "$" also matches before a trailing "\n", which would end the command line early
_NAME_RE = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?\Z")
_HEADER_NAME_RE = re.compile(r"^[!-~]+\Z")  # printable ASCII, no spaces
_TAG_RE = re.compile(r"[a-zA-Z0-9_-]*\Z")  # youzan nsqd's tag rule (empty: no tag)


def ascii_int(text: str, *, signed: bool = False) -> int | None:
    """The value of a plain ASCII decimal number of at most 19 digits (``-`` allowed with
    ``signed``), else None.

    Peers' text goes through this, not ``str.isdigit``: that accepts ``'²'``, which ``int``
    refuses with a bare ``ValueError``, and other scripts' digits, which ``int`` reads.
    """
    digits = text[1:] if signed and text[:1] == "-" else text
    if len(digits) > 19 or not (digits.isascii() and digits.isdigit()):
        return None  # (over 19 digits no field fits 64 bits; over 4300 int() raises)
    return int(text)


def check_name(kind: str, name: str) -> str:
    """Validate a topic or channel name: ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1..64 chars."""
    if not isinstance(name, str):
        raise InvalidArgument(kind, "must be a str", name)
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise InvalidArgument(kind, f"length must be 1..{MAX_NAME_LENGTH}", name)
    if _NAME_RE.match(name) is None:
        raise InvalidArgument(kind, "must match ^[.a-zA-Z0-9_-]+(#ephemeral)?$", name)
    return name


def check_tag(tag: str) -> str:
    """A youzan ``desired_tag``: at most 100 bytes of ``[a-zA-Z0-9_-]``, as youzan nsqd
    checks it at IDENTIFY (refused there, the connection fails; checked here, the caller
    hears why before anything is sent)."""
    if not isinstance(tag, str):
        raise InvalidArgument("desired_tag", "must be a str", tag)
    if len(tag.encode()) > MAX_DESIRED_TAG_LENGTH:
        raise InvalidArgument("desired_tag", f"at most {MAX_DESIRED_TAG_LENGTH} bytes", tag)
    if _TAG_RE.match(tag) is None:
        raise InvalidArgument("desired_tag", "letters, digits, '_' and '-' only", tag)
    return tag


def check_topic(name: str) -> str:
    return check_name("topic", name)


def check_channel(name: str) -> str:
    return check_name("channel", name)


def check_partition(partition: int) -> int:
    """A partition id is 0..1023 (-1, "the node's default", is expressed by omitting it)."""
    check_int("partition", partition, 0, MAX_PARTITION)
    return partition


def check_uint64(field: str, value: int) -> int:
    check_int(field, value, 0, MAX_UINT64)
    return value


def check_trace_id(trace_id: int) -> int:
    return check_uint64("trace_id", trace_id)


def invalid_message_id(msg_id: object) -> InvalidArgument:
    return InvalidArgument("message id", "must be the 16 raw bytes received", msg_id)


def check_message_id(msg_id: bytes) -> bytes:
    if not isinstance(msg_id, bytes | bytearray | memoryview) or len(msg_id) != 16:
        raise invalid_message_id(msg_id)
    return bytes(msg_id)


def check_body(body: bytes, max_size: int = DEFAULT_MAX_MSG_SIZE, field: str = "body") -> bytes:
    """A message body is non-empty and at most ``max_size`` bytes (the negotiated limit)."""
    if not isinstance(body, bytes | bytearray | memoryview):
        raise InvalidArgument(field, "must be bytes", type(body).__name__)
    # a memoryview's len() counts items, not bytes: a view of 4-byte ints is 4 times bigger
    n = body.nbytes if isinstance(body, memoryview) else len(body)
    if n == 0:
        raise InvalidArgument(field, "must not be empty", body)
    if n > max_size:
        raise InvalidArgument(field, f"size {n} exceeds max_msg_size {max_size}", f"<{n} bytes>")
    return bytes(body)


def check_count(field: str, value: int, low: int, high: int) -> int:
    return check_int(field, value, low, high)


def check_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """Ext header names are non-empty printable ASCII without spaces; values are strings.

    ``##trace_id`` must hold a decimal uint64 string, as the server checks it.
    """
    if not isinstance(headers, Mapping):
        raise InvalidArgument("headers", "must be a mapping of str to str", headers)
    for name, value in headers.items():
        if not isinstance(name, str) or _HEADER_NAME_RE.match(name) is None:
            raise InvalidArgument("header name", "must be non-empty printable ASCII, no spaces",
                                  name)
        if not isinstance(value, str):
            raise InvalidArgument(f"header {name!r}", "value must be a str", value)
        if name == TRACE_ID_HEADER and (not value.isdigit() or int(value) > MAX_UINT64):
            raise InvalidArgument(f"header {TRACE_ID_HEADER!r}",
                                  "must be a decimal uint64 string", value)
    return headers
