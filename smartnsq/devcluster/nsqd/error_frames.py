"""Error frames of the dev cluster's nsqd, worded byte for byte as the real Go servers word them.

Clients match codes, but people read texts, and captures compare bytes: so the texts keep Go's
formatting quirks (``%q`` quoting, ``%v`` of byte slices as decimal lists, strconv's error
messages), produced here by small helpers instead of being scattered through the handlers.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "ClientError",
    "GoParseError",
    "fatal",
    "go_atoi",
    "go_base10",
    "go_bytes",
    "go_param_list",
    "go_parse_bool",
    "go_quote",
    "nonfatal",
]

_INT_RE: Final = re.compile(rb"[+-]?[0-9]+")
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_ESCAPES: Final = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v",
                   34: '\\"', 92: "\\\\"}


class ClientError(Exception):
    """An error frame to send; ``fatal`` means the server closes the connection after it."""

    def __init__(self, code: str, text: bytes | str = b"", fatal: bool = True) -> None:
        self.code = code
        self.text = text.encode() if isinstance(text, str) else text
        self.fatal = fatal
        super().__init__(f"{code} {self.text.decode('utf-8', 'replace')}")

    @property
    def payload(self) -> bytes:
        """``CODE + " " + TEXT`` (the space stays when the text is empty, as in Go)."""
        return self.code.encode() + b" " + self.text


def fatal(code: str, text: bytes | str = b"") -> ClientError:
    return ClientError(code, text, True)


def nonfatal(code: str, text: bytes | str = b"") -> ClientError:
    return ClientError(code, text, False)


class GoParseError(ValueError):
    """A strconv failure, with Go's message as ``str(exc)``."""


def go_quote(value: bytes | str) -> str:
    """Go's ``%q`` of a string (``strconv.Quote``): printable UTF-8 kept, the rest escaped."""
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    out = ['"']
    text = data.decode("utf-8", "surrogateescape")
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not valid UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code in _ESCAPES:
            out.append(_ESCAPES[code])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x80 or ch.isprintable():
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_bytes(data: bytes) -> str:
    """Go's ``%v`` of a byte slice or array: ``[1 2 3]``."""
    return "[" + " ".join(str(b) for b in data) + "]"


def go_param_list(params: list[bytes]) -> str:
    """Go's ``%v`` of ``[][]byte`` (youzan's ``invalid command`` text)."""
    return "[" + " ".join(go_bytes(p) for p in params) + "]"


def go_atoi(data: bytes) -> int:
    """``strconv.Atoi`` on a 64-bit platform."""
    if _INT_RE.fullmatch(data) is None:
        raise GoParseError(f"strconv.Atoi: parsing {go_quote(data)}: invalid syntax")
    value = int(data)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise GoParseError(f"strconv.Atoi: parsing {go_quote(data)}: value out of range")
    return value


def go_parse_bool(data: bytes) -> bool:
    """``strconv.ParseBool``."""
    if data in (b"1", b"t", b"T", b"TRUE", b"true", b"True"):
        return True
    if data in (b"0", b"f", b"F", b"FALSE", b"false", b"False"):
        return False
    raise GoParseError(f"strconv.ParseBool: parsing {go_quote(data)}: invalid syntax")


def go_base10(data: bytes) -> int:
    """nsqd's ``protocol.ByteToBase10``: digits only (empty is 0), uint64 wrapping."""
    n = 0
    for b in data:
        if not 48 <= b <= 57:
            raise GoParseError("failed to convert to Base10")
        n = (n * 10 + b - 48) & 0xFFFFFFFFFFFFFFFF
    return n


def as_int64(value: int) -> int:
    """Reinterpret a uint64 as Go's int64."""
    return value - (1 << 64) if value >= 1 << 63 else value
