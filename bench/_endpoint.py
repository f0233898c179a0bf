"""A minimal NSQ endpoint for the client benchmarks (not a server, not a benchmark itself).

    python bench/_endpoint.py [--port P] [--body BYTES]

The dev cluster is a real broker written in Python: it stores every message, keeps channels
and tracks in-flight messages, so it costs more per message than a fast client and capped the
client figures (docs/performance.md, section "Against the dev cluster"). This endpoint does
only what a client can observe and nothing else, so that what the benchmarks measure is the
client:

* it reads the magic, answers IDENTIFY the way a classic nsqd 1.3.0 does (the JSON of the
  ``tests/fixtures/classic`` capture with feature negotiation, ``OK`` without);
* it answers ``OK`` to every PUB, MPUB and DPUB, parsing only the framing needed to find the
  next command and to count messages (no topic check, no storage);
* after SUB it pushes pre-built classic message frames (``--body`` bytes) as fast as RDY
  allows: never more in flight than the last RDY, a FIN (or REQ) frees a slot and the freed
  slots are refilled in one write. The frames come from a ring of pre-built frames with
  distinct ids, larger than any RDY a client may send, so no two in-flight ids are equal.

It prints ``LISTEN host:port`` once it accepts connections, then one JSON line per closed
connection with its counters: ``reads`` (data_received calls), ``pubs`` (PUB/MPUB/DPUB
commands), ``msgs`` (messages in them), ``sent`` (messages pushed), ``fins``, ``fin_reads``
(reads that carried at least one FIN), ``max_in_flight`` (the most messages ever in flight;
it never exceeds the largest RDY), ``rdy`` (the last RDY), ``rdys`` (RDY commands received).
``fins / fin_reads`` says how well the client coalesces its FIN writes (a client that writes
one FIN per syscall can still show more than one FIN per read when the endpoint falls behind,
so it is a lower bound).

The endpoint runs in its own process: it must not share the client's GIL or event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import struct
import sys
import time

MAGIC = b"  V2"
# the classic nsqd 1.3.0 IDENTIFY answer (tests/fixtures/classic/
# tcp_01_identify_feature_negotiation_response.json), served as the capture shows it: compact
IDENTIFY_ANSWER = json.dumps({
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}, separators=(",", ":")).encode()
RING = 16384  # pre-built message frames; > max_rdy_count, so in-flight ids never repeat

_U32 = struct.Struct(">I")
_FRAME_HDR = struct.Struct(">II")


def response(payload: bytes) -> bytes:
    return _FRAME_HDR.pack(4 + len(payload), 0) + payload


def error(payload: bytes) -> bytes:
    return _FRAME_HDR.pack(4 + len(payload), 1) + payload


OK = response(b"OK")
# commands that carry a 4-byte size and a body after their line
BODY_COMMANDS = (b"PUB ", b"MPUB", b"DPUB", b"IDEN", b"AUTH")


def message_frame(seq: int, body: bytes) -> bytes:
    msg_id = b"%016x" % seq
    rest = struct.pack(">QH", time.time_ns(), 1) + msg_id + body
    return _FRAME_HDR.pack(4 + len(rest), 2) + rest


class Endpoint(asyncio.Protocol):
    def __init__(self, ring: memoryview, frame_size: int) -> None:
        self.ring = ring
        self.frame_size = frame_size
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.magic = False
        self.subscribed = False
        self.closing = False
        self.reads = self.pubs = self.msgs = 0
        self.sent = self.fins = self.reqs = self.fin_reads = 0
        self.rdy = self.max_rdy = self.max_in_flight = self.rdys = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        print(json.dumps({
            "reads": self.reads, "pubs": self.pubs, "msgs": self.msgs, "sent": self.sent,
            "fins": self.fins, "reqs": self.reqs, "fin_reads": self.fin_reads,
            "rdy": self.rdy, "max_rdy": self.max_rdy, "max_in_flight": self.max_in_flight,
            "rdys": self.rdys,
        }), flush=True)

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        buf = self.buf
        buf += data
        if not self.magic:
            if len(buf) < 4:
                return
            if buf[:4] != MAGIC:
                assert self.transport is not None
                self.transport.write(error(b"E_BAD_PROTOCOL"))
                self.transport.close()
                return
            del buf[:4]
            self.magic = True
        if self.subscribed:
            self._consumer_commands()
        else:
            self._commands()

    # Before SUB: every command, framed exactly; PUB/MPUB/DPUB answered in one write per read.
    def _commands(self) -> None:
        buf = self.buf
        end = len(buf)
        pos = 0
        oks = 0
        out: list[bytes] = []
        unpack = _U32.unpack_from
        while pos < end:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            head = bytes(buf[pos:pos + 4])
            if head in BODY_COMMANDS:
                if nl + 5 > end:
                    break
                (size,) = unpack(buf, nl + 1)
                stop = nl + 5 + size
                if stop > end:
                    break
                if head == b"PUB " or head == b"DPUB":
                    self.pubs += 1
                    self.msgs += 1
                    oks += 1
                elif head == b"MPUB":
                    self.pubs += 1
                    self.msgs += unpack(buf, nl + 5)[0]
                    oks += 1
                elif head == b"IDEN":
                    if oks:
                        out.append(OK * oks)
                        oks = 0
                    try:
                        wanted = json.loads(bytes(buf[nl + 5:stop]))
                    except ValueError:
                        wanted = {}
                    negotiate = isinstance(wanted, dict) and wanted.get("feature_negotiation")
                    out.append(response(IDENTIFY_ANSWER) if negotiate else OK)
                else:  # AUTH: not enabled, as on the captured nsqd
                    out.append(error(b"E_AUTH_DISABLED AUTH disabled"))
                pos = stop
                continue
            line = bytes(buf[pos:nl])
            pos = nl + 1
            if oks:
                out.append(OK * oks)
                oks = 0
            if line.startswith(b"SUB "):
                out.append(OK)
                self.subscribed = True
                break
            if line == b"CLS":
                out.append(response(b"CLOSE_WAIT"))
            elif line.startswith(b"RDY "):
                self._set_rdy(int(line[4:]))
            # NOP, TOUCH and anything else: no answer, as nsqd
        del buf[:pos]
        if oks:
            out.append(OK * oks)
        if out:
            assert self.transport is not None
            self.transport.write(b"".join(out))
        if self.subscribed and buf:
            self._consumer_commands()

    # After SUB only single-line commands come (FIN/REQ/TOUCH/RDY/NOP/CLS), and the message
    # ids are hex digits, so whole lines can be counted without a loop per command.
    def _consumer_commands(self) -> None:
        buf = self.buf
        last = buf.rfind(b"\n")
        if last < 0:
            self._push()
            return
        lines = bytes(buf[:last + 1])
        del buf[:last + 1]
        fins = lines.count(b"FIN ")
        reqs = lines.count(b"REQ ")
        if fins:
            self.fin_reads += 1
            self.fins += fins
        self.reqs += reqs
        at = lines.rfind(b"RDY ")
        if at >= 0:
            self.rdys += lines.count(b"RDY ")
            self._set_rdy(int(lines[at + 4:lines.index(b"\n", at)]))
        if b"CLS\n" in lines:
            self.closing = True
            assert self.transport is not None
            self.transport.write(response(b"CLOSE_WAIT"))
        self._push()

    def _set_rdy(self, count: int) -> None:
        if not self.subscribed:
            self.rdys += 1
        self.rdy = count
        self.max_rdy = max(self.max_rdy, count)
        if self.subscribed:
            self._push()

    def _push(self) -> None:
        if self.closing or not self.subscribed:
            return
        in_flight = self.sent - self.fins - self.reqs
        credit = self.rdy - in_flight
        if credit <= 0:
            return
        assert self.transport is not None
        size = self.frame_size
        start = self.sent % RING
        first = min(credit, RING - start)
        self.transport.write(self.ring[start * size:(start + first) * size])
        if credit > first:
            self.transport.write(self.ring[:(credit - first) * size])
        self.sent += credit
        self.max_in_flight = max(self.max_in_flight, in_flight + credit)


async def serve(host: str, port: int, body_size: int) -> None:
    body = b"x" * body_size
    frames = [message_frame(i, body) for i in range(RING)]
    frame_size = len(frames[0])
    ring = memoryview(b"".join(frames))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Endpoint(ring, frame_size), host, port,
                                      backlog=128)
    sock = server.sockets[0].getsockname()
    print(f"LISTEN {sock[0]}:{sock[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--body", type=int, default=100, help="pushed message body, bytes")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.body))
    return 0


if __name__ == "__main__":
    sys.exit(main())

