"""Loader for the real-server TCP captures in ``tests/fixtures/{classic,youzan}/tcp_*.txt``.

The capture format (fixtures' INDEX files): ``#`` header lines, ``>> SEND n bytes: <label>`` and
``<< RECV n bytes: <label>`` each followed by a hex dump of exactly those bytes, and ``##`` notes.
Compressed connections also carry the plaintext of each exchange as a commented dump
(``## plaintext n bytes: ...`` for what the client compressed, ``## decoded (decompressed) n
bytes: ...`` for what the server's bytes inflate to). TLS exchanges are recorded decrypted.

Tests use the bytes as the ground truth and the recorder's labels (``RESPONSE frame: b'OK'``,
``MESSAGE frame: {json}``) as an independent decoding to compare ours with; the labels were
written by the capture script, not by smartnsq.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

FIXTURES = Path(__file__).resolve().parent / "fixtures"

_EVENT = re.compile(r"^(>> SEND|<< RECV) (\d+) bytes: (.*)$")
_NOTE_EVENT = re.compile(r"^## (plaintext|decoded \(decompressed\)) (\d+) bytes: (.*)$")
_HEX = re.compile(r"^(##)?    ([0-9a-f]{4})  ((?:[0-9a-f]{2} )*[0-9a-f]{2})(?:  |$)")
_FRAME_LABEL = re.compile(r"^(?:\(inside TLS, decrypted\) )?(RESPONSE|ERROR|MESSAGE) frame: (.*)$")

Direction = Literal["send", "recv"]
Transport = Literal["plain", "tls", "snappy", "deflate"]


@dataclass(frozen=True)
class ExpectedFrame:
    """A server frame as the capture script decoded it."""

    kind: Literal["RESPONSE", "ERROR", "MESSAGE"]
    payload: bytes | None = None           # RESPONSE / ERROR
    fields: dict[str, Any] | None = None   # MESSAGE: the script's JSON


@dataclass(frozen=True)
class Event:
    """One recorded exchange.

    ``data`` is exactly what the dump shows. ``nsq`` tells whether ``data`` is NSQ protocol
    bytes (plain or TLS-decrypted, or the annotated plaintext of a compressed exchange) rather
    than the compressed bytes on the wire; ``wire`` whether the bytes were on the socket as is.
    """

    capture: str
    line: int
    direction: Direction
    label: str
    data: bytes
    transport: Transport
    wire: bool
    connection: int  # counts "## connect" lines; best effort (captures interleave sockets)

    @property
    def nsq(self) -> bool:
        return self.transport in ("plain", "tls") or not self.wire

    @property
    def expected(self) -> ExpectedFrame | None:
        """The recorder's decoding of a server frame, if this event is one."""
        if self.direction != "recv" or not self.nsq:
            return None
        m = _FRAME_LABEL.match(self.label)
        if m is None:
            return None
        kind, rest = m.group(1), m.group(2)
        if kind == "MESSAGE":
            return ExpectedFrame("MESSAGE", fields=json.loads(rest))
        payload = ast.literal_eval(rest)
        assert isinstance(payload, bytes), (self.capture, self.line, rest)
        return ExpectedFrame(kind, payload=payload)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.capture}:{self.line} {self.direction} {self.label[:60]!r}"


@dataclass(frozen=True)
class Capture:
    name: str           # "youzan/tcp_06_sub_rdy_fin_req_touch.txt"
    flavor: Literal["classic", "youzan"]
    header: str         # the first "#" line: what the capture shows
    events: tuple[Event, ...] = field(repr=False)
    notes: tuple[tuple[int, str], ...] = field(repr=False, default=())  # "##" lines

    def sends(self, *, nsq_only: bool = True) -> list[Event]:
        return [e for e in self.events if e.direction == "send" and (e.nsq or not nsq_only)]

    def recvs(self, *, nsq_only: bool = True) -> list[Event]:
        return [e for e in self.events if e.direction == "recv" and (e.nsq or not nsq_only)]

    def frames(self) -> list[Event]:
        """Every server frame the recorder decoded (one frame per recorded read)."""
        return [e for e in self.recvs() if e.expected is not None]

    def stream(self) -> bytes:
        """Every NSQ byte the server sent, in order (all connections of the capture)."""
        return b"".join(e.data for e in self.recvs())

    def exchanges(self) -> list[tuple[Event, list[Event]]]:
        """Each NSQ-level client send with the server frames read before the next send."""
        out: list[tuple[Event, list[Event]]] = []
        for e in self.events:
            if not e.nsq:
                continue
            if e.direction == "send":
                out.append((e, []))
            elif out:
                out[-1][1].append(e)
        return out

    def closed_after(self, event: Event) -> bool:
        """Whether a note right after ``event`` says the server closed the connection."""
        for line in self.notes:
            if line[0] > event.line:
                return line[0] < self._next_event_line(event) and (
                    "closed by server" in line[1] or "server CLOSED" in line[1])
        return False

    def _next_event_line(self, event: Event) -> int:
        later = [e.line for e in self.events if e.line > event.line]
        return min(later) if later else 1 << 30


def _transport(label: str) -> Transport:
    if label.startswith("snappy-framed") or label.startswith("raw snappy"):
        return "snappy"
    if label.startswith("raw DEFLATE"):
        return "deflate"
    if label.startswith("(inside TLS"):
        return "tls"
    return "plain"


def _parse(name: str, text: str) -> Capture:
    flavor: Literal["classic", "youzan"] = "classic" if name.startswith("classic/") else "youzan"
    header = ""
    events: list[Event] = []
    notes: list[tuple[int, str]] = []
    pending: tuple[int, Direction, int, str, Transport, bool] | None = None
    buf = bytearray()
    connection = 0

    def close() -> None:
        nonlocal pending
        if pending is None:
            return
        line, direction, size, label, transport, wire = pending
        if len(buf) != size:
            raise ValueError(f"{name}:{line}: dump has {len(buf)} bytes, header says {size}")
        events.append(Event(name, line, direction, label, bytes(buf), transport, wire,
                            connection))
        pending = None
        buf.clear()

    for lineno, raw in enumerate(text.splitlines(), 1):
        hexm = _HEX.match(raw)
        if hexm is not None and pending is not None and bool(hexm.group(1)) == (not pending[5]):
            if int(hexm.group(2), 16) != len(buf):
                raise ValueError(f"{name}:{lineno}: dump offset out of sequence")
            buf += bytes.fromhex(hexm.group(3))
            continue
        close()
        if raw.startswith("## connect "):
            connection += 1
        if raw.startswith("## "):
            notes.append((lineno, raw[3:]))
        if not header and raw.startswith("# "):
            header = raw[2:]
        m = _EVENT.match(raw)
        if m is not None:
            direction: Direction = "send" if m.group(1) == ">> SEND" else "recv"
            label = m.group(3)
            pending = (lineno, direction, int(m.group(2)), label, _transport(label), True)
            continue
        n = _NOTE_EVENT.match(raw)
        if n is not None:
            direction = "send" if n.group(1) == "plaintext" else "recv"
            prev = next((e for e in reversed(events)), None)
            transport: Transport = prev.transport if prev is not None else "plain"
            pending = (lineno, direction, int(n.group(2)), n.group(3), transport, False)
    close()
    return Capture(name, flavor, header, tuple(events), tuple(notes))


@cache
def load(name: str) -> Capture:
    """Load ``"classic/tcp_03_pub.txt"`` (a path relative to tests/fixtures)."""
    return _parse(name, (FIXTURES / name).read_text())


def tcp_capture_names() -> list[str]:
    """Every fixture that records TCP exchanges (tcp_* and the failover timelines)."""
    names = []
    for path in sorted(FIXTURES.glob("*/*.txt")):
        text = path.read_text()
        if ">> SEND " in text or "<< RECV " in text:
            names.append(f"{path.parent.name}/{path.name}")
    return names


def all_events() -> Iterator[Event]:
    for name in tcp_capture_names():
        yield from load(name).events
