"""Codec throughput: decoding message frames and encoding commands, no sockets.

    python bench/codec.py [--quick] [--messages N] [--body BYTES] [--chunk BYTES]

Decoding: one stream of N message frames (100-byte bodies) is cut into 64 KiB chunks at
arbitrary offsets, as a socket would hand them over, and fed to each decoder; msgs/s is the
best of a few repetitions. smartnsq's FrameReader runs on the classic, youzan and
youzan+ext+detail layouts, and its RunReader (the Spark range reads' decoder, a chunk's
messages as columns) on the last; the peers decode the classic stream (the only one they know).
pynsq and gnsq do not have a chunk decoder (tornado's / gevent's stream reads each frame
exactly), so they are given the best case: the whole stream in one buffer, sliced frame by
frame with their own unpack functions. ansq and asyncnsq have a feed()/get() reader; they
are also run at the read size their connection really uses (4 KiB and 52 bytes).

Baseline: the simplest pure-Python loop over the same chunks (one ``struct.unpack_from`` per
frame, one small object per message with the same fields as smartnsq's ``Message``), run on
every layout; smartnsq's rate is printed as a share of it (goal: >= 80%).

Encoding: ops/s of building PUB (100-byte body), MPUB of 100 bodies, FIN and RDY.
"""

from __future__ import annotations

import argparse
import gc
import struct
import sys
import time
from collections.abc import Callable

from _common import command_line, environment, fmt_rate, fmt_ratio, table

from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    CLASSIC_LAYOUT,
    YOUZAN_LAYOUT,
    FrameReader,
    MessageLayout,
    encode_message,
    youzan_message_id,
)
from smartnsq.protocol.runs import MessageRun, RunReader

EXT_DETAIL = MessageLayout(youzan=True, ext=True, detail=True)


def build_stream(layout: MessageLayout, count: int, body_size: int) -> bytes:
    body = b"x" * body_size
    ts = time.time_ns()
    frames = []
    ext = b'{"##trace_id":"123456789","k":"v"}'
    for i in range(count):
        msg_id = youzan_message_id((1 << 50) | i, i) if layout.youzan else b"%016x" % i
        frames.append(encode_message(ts, 1, msg_id, body, layout, ext_version=4 if layout.ext
                                     else 0, ext=ext if layout.ext else None,
                                     queue_offset=i * 150, raw_size=150))
    return b"".join(frames)


def chunks(stream: bytes, size: int) -> list[bytes]:
    return [stream[i:i + size] for i in range(0, len(stream), size)]


def interleaved_best(jobs: list[tuple[int, Callable[[], int]]], repeat: int) -> list[float]:
    """Best rate (items/s) of each job over ``repeat`` rounds; every round runs every job once,
    so a burst of load on the shared machine hits one repetition of each, not all of one."""
    best = [float("inf")] * len(jobs)
    for _ in range(repeat):
        for i, (count, fn) in enumerate(jobs):
            gc.collect()
            start = time.perf_counter()
            done = fn()
            elapsed = time.perf_counter() - start
            if done != count:
                raise RuntimeError(f"did {done} items, expected {count}")
            best[i] = min(best[i], elapsed)
    return [count / t for (count, _), t in zip(jobs, best, strict=True)]


# -- decoders -------------------------------------------------------------------------------

def smartnsq_decoder(layout: MessageLayout, parts: list[bytes]) -> Callable[[], int]:
    def run() -> int:
        reader = FrameReader(layout)
        n = 0
        for part in parts:
            n += len(reader.feed(part))
        return n
    return run


def smartnsq_run_decoder(layout: MessageLayout, parts: list[bytes]) -> Callable[[], int]:
    """The range reads' decoder: each chunk's messages as one MessageRun of columns."""
    def run() -> int:
        reader = RunReader(layout)
        n = 0
        for part in parts:
            for item in reader.feed_runs(part):
                n += len(item) if isinstance(item, MessageRun) else 1
        return n
    return run


def pynsq_decoder(stream: bytes) -> Callable[[], int] | None:
    try:
        from nsq import protocol
    except Exception:
        return None
    unpack_l = struct.Struct(">l").unpack_from

    def run() -> int:
        n = 0
        pos = 0
        end = len(stream)
        while pos < end:
            (size,) = unpack_l(stream, pos)
            data = stream[pos + 4:pos + 4 + size]
            pos += 4 + size
            frame, data = protocol.unpack_response(data)
            if frame == protocol.FRAME_TYPE_MESSAGE:
                protocol.decode_message(data)
                n += 1
        return n
    return run


def gnsq_decoder(stream: bytes) -> Callable[[], int] | None:
    try:
        from gnsq import protocol
        from gnsq.message import Message
    except Exception:
        return None
    unpack_l = struct.Struct(">l").unpack_from

    def run() -> int:
        n = 0
        pos = 0
        end = len(stream)
        while pos < end:
            (size,) = unpack_l(stream, pos)
            data = stream[pos + 4:pos + 4 + size]
            pos += 4 + size
            frame, data = protocol.unpack_response(data)
            if frame == 2:
                Message(*protocol.unpack_message(data))
                n += 1
        return n
    return run


def ansq_decoder(parts: list[bytes]) -> Callable[[], int] | None:
    try:
        from ansq.tcp.protocol import Reader
    except Exception:
        return None

    def run() -> int:
        reader = Reader()
        n = 0
        for part in parts:
            reader.feed(part)
            while reader.get() is not None:
                n += 1
        return n
    return run


def asyncnsq_decoder(parts: list[bytes]) -> Callable[[], int] | None:
    try:
        from asyncnsq.tcp.protocol import Reader
    except Exception:
        return None

    def run() -> int:
        reader = Reader()
        n = 0
        for part in parts:
            reader.feed(part)
            while reader.gets():
                n += 1
        return n
    return run


# -- the baseline: the simplest pure-Python loop ---------------------------------------------

class PlainMessage:
    """One small object per message with the fields smartnsq's Message holds."""

    __slots__ = ("attempts", "body", "ext", "ext_version", "id", "queue_offset", "raw_size",
                 "timestamp", "youzan")

    def __init__(self, timestamp: int, attempts: int, id: bytes, body: bytes,
                 ext_version: int, ext: bytes | None, queue_offset: int | None,
                 raw_size: int | None, youzan: bool) -> None:
        self.timestamp = timestamp
        self.attempts = attempts
        self.id = id
        self.body = body
        self.ext_version = ext_version
        self.ext = ext
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.youzan = youzan


def baseline_decoder(layout: MessageLayout, parts: list[bytes]) -> Callable[[], int]:
    """The simplest loop a person would write over the same chunks (the decode goal's yardstick).

    One ``struct.unpack_from`` per frame header (a second one only for a detail block), the
    frame's leftover tail joined to the next chunk, one ``PlainMessage`` per message with the
    same fields as smartnsq's ``Message``. No validation beyond what it needs to find frames:
    that is the part smartnsq pays for and the baseline does not.
    """
    hdr = struct.Struct(">iiqH").unpack_from
    short = struct.Struct(">ii").unpack_from
    detail = struct.Struct(">QI").unpack_from
    youzan, has_ext, has_detail = layout.youzan, layout.ext, layout.detail

    def run() -> int:
        rest = b""
        messages: list[PlainMessage] = []
        n = 0
        for part in parts:
            buf = rest + part if rest else part
            end = len(buf)
            pos = 0
            messages = []
            append = messages.append
            while end - pos >= 8:
                if end - pos >= 18:
                    size, ftype, ts, attempts = hdr(buf, pos)
                else:
                    size, ftype = short(buf, pos)
                    ts = attempts = 0
                stop = pos + 4 + size
                if stop > end:
                    break
                if ftype == 2:
                    at = pos + 34
                    ext_version, ext, offset, raw = 0, None, None, None
                    if has_ext:
                        ext_version = buf[at]
                        at += 1
                        if ext_version:
                            length = (buf[at] << 8) | buf[at + 1]
                            ext = buf[at + 2:at + 2 + length]
                            at += 2 + length
                    if has_detail:
                        offset, raw = detail(buf, at)
                        at += 12
                    append(PlainMessage(ts, attempts, buf[pos + 18:pos + 34], buf[at:stop],
                                        ext_version, ext, offset, raw, youzan))
                pos = stop
            rest = buf[pos:]
            n += len(messages)
        return n
    return run


# -- encoders -------------------------------------------------------------------------------

def encoders(body: bytes) -> dict[str, dict[str, Callable[[], object]]]:
    batch = [body] * 100
    sid = b"0123456789abcdef"
    out: dict[str, dict[str, Callable[[], object]]] = {
        "smartnsq": {
            "PUB": lambda: commands.pub("bench", body),
            "MPUB x100": lambda: commands.mpub("bench", batch),
            "FIN": lambda: commands.fin(sid),
            "RDY": lambda: commands.rdy(100),
        },
    }
    try:
        from nsq import protocol as p

        out["pynsq"] = {"PUB": lambda: p.pub("bench", body),
                        "MPUB x100": lambda: p.mpub("bench", batch),
                        "FIN": lambda: p.finish(sid), "RDY": lambda: p.ready(100)}
    except Exception:
        pass
    try:
        from gnsq import protocol as g

        out["gnsq"] = {"PUB": lambda: g.publish("bench", body),
                       "MPUB x100": lambda: g.multipublish("bench", batch),
                       "FIN": lambda: g.finish(sid), "RDY": lambda: g.ready(100)}
    except Exception:
        pass
    try:
        from ansq.tcp.protocol import Reader as AReader

        a = AReader()
        out["ansq"] = {"PUB": lambda: a.encode_command("PUB", "bench", data=body),
                       "MPUB x100": lambda: a.encode_command("MPUB", "bench", data=batch),
                       "FIN": lambda: a.encode_command("FIN", sid),
                       "RDY": lambda: a.encode_command("RDY", 100)}
    except Exception:
        pass
    try:
        from asyncnsq.tcp.protocol import Reader as YReader

        y = YReader()
        out["asyncnsq"] = {"PUB": lambda: y.encode_command("PUB", "bench", data=body),
                           "MPUB x100": lambda: y.encode_command("MPUB", "bench", data=batch),
                           "FIN": lambda: y.encode_command("FIN", sid),
                           "RDY": lambda: y.encode_command("RDY", 100)}
    except Exception:
        pass
    return out


def encode_job(fn: Callable[[], object], loops: int) -> tuple[int, Callable[[], int]]:
    def run() -> int:
        for _ in range(loops):
            fn()
        return loops
    return loops, run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and repetitions")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--body", type=int, default=100, help="body size in bytes")
    parser.add_argument("--chunk", type=int, default=64 * 1024, help="feed size in bytes")
    args = parser.parse_args()
    count = args.messages or (20_000 if args.quick else 200_000)
    repeat = 3 if args.quick else 5
    loops = 20_000 if args.quick else 200_000

    print(f"decoding {count:,} message frames ({args.body}-byte bodies) fed in "
          f"{args.chunk // 1024} KiB chunks; best of {repeat}, interleaved\n")
    streams = {name: build_stream(layout, count, args.body) for name, layout in
               (("classic", CLASSIC_LAYOUT), ("youzan", YOUZAN_LAYOUT),
                ("youzan+ext+detail", EXT_DETAIL))}
    layouts = {"classic": CLASSIC_LAYOUT, "youzan": YOUZAN_LAYOUT,
               "youzan+ext+detail": EXT_DETAIL}
    classic = streams["classic"]
    classic_parts = chunks(classic, args.chunk)
    feed = f"{args.chunk // 1024} KiB chunks"
    candidates: list[tuple[str, str, Callable[[], int] | None, str]] = [
        ("smartnsq FrameReader", name, smartnsq_decoder(layouts[name],
                                                        chunks(stream, args.chunk)), feed)
        for name, stream in streams.items()]
    candidates.append(("smartnsq RunReader.feed_runs (columns)", "youzan+ext+detail",
                       smartnsq_run_decoder(EXT_DETAIL,
                                            chunks(streams["youzan+ext+detail"], args.chunk)),
                       feed))
    candidates += [
        ("pynsq unpack_response+decode_message", "classic", pynsq_decoder(classic),
         "whole stream, ideal framing"),
        ("gnsq unpack_response+unpack_message", "classic", gnsq_decoder(classic),
         "whole stream, ideal framing"),
        ("ansq Reader", "classic", ansq_decoder(classic_parts), feed),
        ("ansq Reader", "classic", ansq_decoder(chunks(classic, 4096)),
         "4 KiB chunks (its read size)"),
        ("asyncnsq Reader", "classic", asyncnsq_decoder(classic_parts), feed),
        ("asyncnsq Reader", "classic", asyncnsq_decoder(chunks(classic, 52)),
         "52-byte chunks (its read size)"),
    ]
    candidates += [
        ("baseline: simplest unpack_from loop", name, baseline_decoder(layouts[name],
                                                                      chunks(stream, args.chunk)),
         feed)
        for name, stream in streams.items()]
    runnable = [c for c in candidates if c[2] is not None]
    rates = dict(zip([id(c) for c in runnable],
                     interleaved_best([(count, c[2]) for c in runnable if c[2]], repeat),
                     strict=True))
    base = rates[id(candidates[0])]
    rows = []
    for c in candidates:
        rate = rates.get(id(c))
        rows.append((c[0], c[1], fmt_rate(rate), fmt_ratio(rate, base),
                     c[3] if rate is not None else "not importable"))
    print(table(["decoder", "layout", "msgs/s", "vs smartnsq classic", "feed"], rows))

    # the decode goal: smartnsq's rate as a share of the simplest loop's, per layout
    grows = []
    for name in streams:
        mine = next(rates[id(c)] for c in candidates if c[0].startswith("smartnsq")
                    and c[1] == name)
        plain = next(rates[id(c)] for c in candidates if c[0].startswith("baseline")
                     and c[1] == name)
        share = mine / plain
        grows.append([name, fmt_rate(mine), fmt_rate(plain), f"{share:.1%}",
                      "met" if share >= 0.8 else f"missed by {(0.8 - share) * 100:.1f} points"])
    print("\nsmartnsq FrameReader against the simplest pure-Python loop over the same chunks "
          "(goal: >= 80%)\n")
    print(table(["layout", "smartnsq msgs/s", "baseline msgs/s", "smartnsq / baseline",
                 "goal >= 80%"], grows))

    print(f"\nencoding commands; {loops:,} calls per figure ({loops // 50:,} for MPUB), best of "
          f"{repeat}, interleaved\n")
    encs = encoders(b"x" * args.body)
    ops = list(encs["smartnsq"])
    keys = [(lib, op) for lib, fns in encs.items() for op in fns]
    jobs = [encode_job(encs[lib][op], loops // (50 if op == "MPUB x100" else 1))
            for lib, op in keys]
    flat = dict(zip(keys, interleaved_best(jobs, repeat), strict=True))
    headers = ["library", *(f"{op} ops/s" for op in ops)]
    erows = []
    for lib in encs:
        cells = [lib]
        for op in ops:
            cell = fmt_rate(flat[(lib, op)])
            if lib != "smartnsq":
                cell += f" ({fmt_ratio(flat[(lib, op)], flat[('smartnsq', op)])})"
            cells.append(cell)
        erows.append(cells)
    print(table(headers, erows))
    print("\n(peer cells: ops/s, then the peer's rate as a multiple of smartnsq's)")
    print(f"\ncommand: {command_line()}")
    print(environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
