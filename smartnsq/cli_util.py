"""Small helpers shared by the ``smartnsq`` commands: errors, addresses, tables, progress, HTTP.

Kept apart from ``smartnsq.cli`` so each command module imports only what it needs and the
parser module stays a readable table of commands.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

import httpx

from .errors import InvalidArgument, ProtocolError
from .lookup import http_url, normalize_lookupd
from .protocol.lookup import ACCEPT_V1, unwrap

__all__ = [
    "V1_HEADERS",
    "CLIError",
    "Progress",
    "format_table",
    "http_get",
    "http_get_json",
    "split_addresses",
]

V1_HEADERS = {"Accept": ACCEPT_V1}
"""nsqlookupd and youzan nsqd answer bare JSON with real status codes only with this header."""


class CLIError(Exception):
    """A failure the user can act on; ``main`` prints it as one line and exits ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def split_addresses(values: Iterable[str] | str | None, what: str) -> list[str]:
    """``["a:1,b:2", "c:3"]`` -> ``["a:1", "b:2", "c:3"]``; an ``http://`` prefix is dropped.

    Addresses are checked here so that a typo is reported before anything is dialled. Every
    kind of address (lookupd, nsqd TCP or HTTP) is ``HOST:PORT`` read the way the library
    reads lookupd addresses (``smartnsq.lookup.normalize_lookupd``), so the CLI accepts
    exactly what the API does.
    """
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            try:
                out.append(normalize_lookupd(item))
            except InvalidArgument:
                raise CLIError(f"bad {what} address {item!r}: expected HOST:PORT") from None
    return out


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]],
                 right: Iterable[int] = ()) -> str:
    """A plain-text table: columns padded to their widest cell, ``right`` columns aligned right."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align_right = set(right)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(widths[i]) if i in align_right else c.ljust(widths[i])
                 for i, c in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Progress:
    """One status line on stderr, rewritten in place with a carriage return.

    Redraws at most every ``interval`` seconds so a tight loop costs almost nothing; ``done()``
    ends the line. Disabled (every call a no-op) unless ``enabled``: by default only when
    stderr is a terminal, so logs and pipes never fill with ``\\r`` noise.
    """

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None,
                 interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _isatty(self.stream)
        self.enabled = enabled
        self.interval = interval
        self._last = 0.0
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        columns = shutil.get_terminal_size((100, 24)).columns
        if len(text) >= columns:  # a wrapped line cannot be rewritten with \r
            text = text[:max(10, columns - 2)] + "~"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def done(self, text: str | None = None) -> None:
        if not self.enabled:
            return
        if text is not None:
            self.update(text, force=True)
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0


def bar(fraction: float, width: int = 24) -> str:
    """``[#########---------]`` for a fraction in 0..1."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


async def http_get(client: httpx.AsyncClient, address: str, path: str,
                   params: Mapping[str, str] | None = None, *, what: str) -> httpx.Response:
    """GET ``http://address/path`` asking for v1 answers; whatever status it answers.

    Only not getting an answer fails, as a one-line ``CLIError`` naming ``what`` and where:
    the answer itself is for ``smartnsq.protocol.lookup``'s parsers (or ``http_get_json``).
    """
    url = http_url(address, path)  # https:// lookupds keep their scheme
    try:
        return await client.get(url, params=params, headers=V1_HEADERS)
    except httpx.TimeoutException:
        raise CLIError(f"{what}: {address} did not answer in time") from None
    except httpx.HTTPError as exc:
        raise CLIError(f"{what}: cannot reach {address} ({_reason(exc)})") from None


async def http_get_json(client: httpx.AsyncClient, address: str, path: str,
                        params: Mapping[str, str] | None = None, *, what: str) -> Any:
    """GET ``http://address/path`` as JSON, bare or in youzan's ``{"status_code", "data"}``.

    The envelope is read by ``smartnsq.protocol.lookup.unwrap`` (nsqd and nsqlookupd share
    it); failures become one-line ``CLIError``s naming ``what`` was asked and where.
    """
    response = await http_get(client, address, path, params, what=what)
    try:
        status, data, message = unwrap(response.status_code, response.content)
    except ProtocolError:
        raise CLIError(f"{what}: {address} answered something that is not JSON") from None
    if status != 200:
        message = message or response.text.strip()[:200] or response.reason_phrase
        raise CLIError(f"{what}: {address} answered HTTP {status}: {message}")
    return {} if data is None else data


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message (or its type), its cause when that helps."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({' '.join(str(cause).split())})"
    return text


def dumps(value: Any) -> str:
    """Compact, key-ordered JSON for ``--json`` output rows."""
    return json.dumps(value, separators=(",", ":"), sort_keys=False, default=str)


def cluster_addresses(args: Any) -> tuple[list[str], list[str]]:
    """The ``--lookupd`` and ``--nsqd`` addresses of a command; exactly one kind is required."""
    lookupd = split_addresses(getattr(args, "lookupd", None), "lookupd")
    nsqd = split_addresses(getattr(args, "nsqd", None), "nsqd")
    if lookupd and nsqd:
        raise CLIError("give --lookupd or --nsqd, not both")
    if not lookupd and not nsqd:
        raise CLIError("no cluster given: use --lookupd HOST:PORT (or set SMARTNSQ_LOOKUPD) "
                       "or --nsqd HOST:PORT")
    return lookupd, nsqd


def check_topic(topic: str) -> str:
    """The topic name rules, checked before anything is dialled."""
    from .errors import InvalidArgument
    from .protocol import validate

    try:
        return validate.check_topic(topic)
    except InvalidArgument as exc:
        raise CLIError(f"bad topic name {topic!r}: {exc.rule}") from None
