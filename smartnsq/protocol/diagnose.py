"""What a peer that does not speak the expected protocol looks like it is (sans-I/O).

A wrong address is the commonest setup error: nsqd's TCP port (4150) given as a lookupd, its
HTTP port (4151) given as a lookupd, a web server's port, or nsqlookupd's HTTP port (4161) given
as an nsqd. The bytes say which; these functions read them and return one short line that
names what answered and the usual port, never the answer itself: at most its first line, cut
to :data:`LINE`, so a multi-line page never reaches an error or the log.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = [
    "LINE",
    "LOOKUPD_HTTP_PORT",
    "NSQD_HTTP_PORT",
    "NSQD_TCP_PORT",
    "describe_start",
    "first_line",
    "is_html",
    "looks_like_http",
    "lookupd_hint",
    "not_lookupd",
    "nsqd_hint_for_http",
]

LOOKUPD_HTTP_PORT: Final = 4161
NSQD_TCP_PORT: Final = 4150
NSQD_HTTP_PORT: Final = 4151
LINE: Final = 80
"""The most of an answer's text shown in an error."""

_HTTP: Final = b"HTTP/"
_NO_ROUTE: Final = "NOT_FOUND"  # nsqd's (any Go NSQ daemon's) answer to a path it lacks
# routes both nsqlookupd kinds serve and nsqd lacks (classic lookupds lack /listlookup)
_EVERY_LOOKUPD_ROUTE: Final = frozenset({"/lookup", "/nodes"})
_NSQ_FRAME_TYPES: Final = {0: "response", 1: "error", 2: "message"}


def first_line(data: bytes | str, limit: int = LINE) -> str:
    """The first non-blank line of ``data``, stripped and cut to ``limit`` characters."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return ""


def looks_like_http(data: bytes | bytearray) -> bool:
    """The bytes start like an HTTP/1.x response (``HTTP/``, or a prefix of it)."""
    head = bytes(data[:len(_HTTP)])
    return bool(head) and _HTTP.startswith(head)


def is_html(body: bytes | str, content_type: str | None = None) -> bool:
    """An HTML page (by its content type, or by its first characters)."""
    if content_type is not None and "html" in content_type.lower():
        return True
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else body
    start = text.lstrip()[:15].lower()
    return start.startswith(("<!doctype html", "<html", "<head", "<body", "<center", "<h1",
                             "<title"))


def _nsq_frame(data: bytes) -> str | None:
    """``"an NSQ error frame (E_BAD_PROTOCOL ...)"`` when ``data`` starts with a plausible
    NSQ frame header (size, type 0..2), else None."""
    if len(data) < 8:
        return None
    size = int.from_bytes(data[:4], "big")
    kind = _NSQ_FRAME_TYPES.get(int.from_bytes(data[4:8], "big"))
    if kind is None or not 4 <= size <= 16 * 1024 * 1024:
        return None
    payload = data[8:4 + size]
    shown = first_line(payload, 40) if kind != "message" else ""
    return f"an NSQ {kind} frame" + (f" ({shown})" if shown else "")


def describe_start(data: bytes | bytearray) -> str:
    """What the first bytes of an answer are, in a few words: an NSQ frame, HTTP (its status
    line), an HTML page, some text (its first line) or binary data (its first bytes)."""
    data = bytes(data)
    frame = _nsq_frame(data)
    if frame is not None:
        return frame
    if looks_like_http(data):
        return f"HTTP ({first_line(data)!r})"
    if is_html(data):
        return f"an HTML page ({first_line(data)!r})"
    text = data[:LINE].decode("ascii", "replace")
    if text and all(c.isprintable() or c in "\r\n\t" for c in text):
        return f"text ({first_line(data)!r})"
    return f"binary data ({data[:16].hex(' ')}{' ...' if len(data) > 16 else ''})"


def lookupd_hint(found: str) -> str:
    """The line for a lookupd address that answered ``found`` (from :func:`describe_start`
    or a description of an HTTP answer): what it looks like, and the usual lookupd port."""
    if found.startswith("an NSQ"):
        where = f"this looks like nsqd's TCP port (usually {NSQD_TCP_PORT})"
    elif found.startswith("nsqd's"):
        where = f"this looks like nsqd's HTTP port (usually {NSQD_HTTP_PORT})"
    else:
        where = "not nsqlookupd"
    return (f"answered with {found}: {where}; is this nsqlookupd's HTTP port "
            f"(usually {LOOKUPD_HTTP_PORT})?")


def nsqd_hint_for_http(data: bytes | bytearray) -> str:
    """The line for an nsqd TCP address that answered the protocol magic with HTTP."""
    return (f"answered with HTTP ({first_line(bytes(data))!r}), not NSQ's TCP protocol: is "
            f"this nsqd's TCP port (usually {NSQD_TCP_PORT})? ({NSQD_HTTP_PORT} is nsqd's "
            f"HTTP port, {LOOKUPD_HTTP_PORT} nsqlookupd's)")


def _error_text(body: bytes | str) -> str:
    """The error text of a JSON error answer (either envelope) or of a plain-text one."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else body
    try:
        value: Any = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(value, dict):
        found = value.get("message", value.get("status_txt"))
        return found if isinstance(found, str) else ""
    return ""


def not_lookupd(status: int, body: bytes | str, path: str) -> bool:
    """The HTTP answer to ``path`` shows the peer is some server other than nsqlookupd: a web
    page below 500 (a 5xx page is a proxy's, whose lookupd may come back), or nsqd's
    ``404 NOT_FOUND`` to ``/lookup`` or ``/nodes`` (routes every lookupd has; ``/listlookup``
    answers so on a classic lookupd). Such a peer answers the same way every time: a wrong
    address, not a fault to wait out."""
    if is_html(body):
        return status < 500
    return path in _EVERY_LOOKUPD_ROUTE and status == 404 and _error_text(body) == _NO_ROUTE
