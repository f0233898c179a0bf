"""``smartnsq pub TOPIC [FILE...]``: publish lines, partition-aware, in MPUB batches.

Lines are read in chunks; each chunk is fully parsed and checked before any of it is sent, so
a malformed line stops the command with its file and line number and nothing of its chunk is
published. Per-key order is kept: a key always maps to one partition, each partition's
batches go out one after the other (the next only after the previous one's ``OK``), and
partitions are written concurrently.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ..model.sharding_schemes import DEFAULT_SCHEME, SCHEMES
from .tables import format_table
from .util import (
    CLIError,
    Progress,
    bar,
    check_topic,
    cluster_addresses,
    deadline_of,
    dumps,
    timeout_of,
    topic_missing,
)

if TYPE_CHECKING:
    from ..errors import InvalidArgument

__all__ = ["register", "run_pub"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("pub", "publish lines from stdin or files",
                description="Publish each non-empty line as one message (MPUB batches).")
    p.add_argument("topic", help="the topic to publish to (it must exist)")
    p.add_argument("files", nargs="*", metavar="FILE", default=[],
                   help="files to read ('-' or none: stdin)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--sharding-key", metavar="KEY",
                     help="one sharding key for every message")
    key.add_argument("--key-field", metavar="FIELD",
                     help="lines are JSON objects; shard each by this field (a.b for nested)")
    key.add_argument("--partition", type=int, help="write every message to this partition")
    # (sharding_schemes imports nothing: building the parser loads no client code)
    p.add_argument("--sharding", choices=SCHEMES, default=DEFAULT_SCHEME,
                   help="hash of sharding keys: murmur3 (Go client, default) or java")
    p.add_argument("--trace-id", type=int, metavar="ID",
                   help="publish traced with this uint64 trace id")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="ext JSON header (repeatable; ext topics only)")
    p.add_argument("--batch", type=int, default=200,
                   help="messages per MPUB (default 200; 1 sends PUB)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr for files (default: when a terminal)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object (for scripts)")
    p.set_defaults(handler=run_pub)

_CHUNK_BATCHES = 8  # batches per partition read ahead before sending


@dataclass
class _PartitionTotals:
    messages: int = 0
    batches: int = 0
    node: str = ""
    first_internal_id: int | None = None
    first_offset: int | None = None


@dataclass
class _Source:
    name: str
    stream: IO[bytes] | IO[str]
    size: int | None = None


@dataclass
class _Totals:
    messages: int = 0
    batches: int = 0
    bytes_read: int = 0
    partitions: dict[int | None, _PartitionTotals] = field(default_factory=dict)


def _parse_headers(values: list[str]) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CLIError(f"bad --header {item!r}: expected NAME=VALUE")
        headers[name] = value
    return headers or None


def _sources(args: argparse.Namespace) -> list[_Source]:
    names = args.files or ["-"]
    out = []
    for name in names:
        if name == "-":
            stream = getattr(args.stdin, "buffer", args.stdin)
            out.append(_Source("stdin", stream))
            continue
        try:
            out.append(_Source(name, open(name, "rb"), os.path.getsize(name)))  # noqa: SIM115
        except OSError as exc:
            raise CLIError(f"cannot read {name}: {exc.strerror or exc}") from None
    return out


def _lines(source: _Source) -> Iterator[tuple[int, bytes, int]]:
    """(line number, body, bytes consumed) for each non-empty line of a source."""
    stream: Any = source.stream
    for number, raw in enumerate(stream, start=1):
        data: bytes = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        body = data.rstrip(b"\r\n")
        if body.strip():
            yield number, body, len(data)
        else:
            yield number, b"", len(data)


def _key_of(body: bytes, path: list[str], where: str) -> str | int:
    try:
        value: Any = json.loads(body)
    except ValueError as exc:
        raise CLIError(f"{where}: not a JSON line ({exc.args[0].split(':')[0]})") from None
    for part in path:
        if not isinstance(value, dict):
            raise CLIError(f"{where}: not a JSON object, cannot read field "
                           f"{'.'.join(path)!r}")
        if part not in value:
            raise CLIError(f"{where}: field {'.'.join(path)!r} is missing")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise CLIError(f"{where}: field {'.'.join(path)!r} must be a string or an integer "
                       f"to shard by, not {type(value).__name__}")
    return value


def _batches(bodies: list[bytes], count: int, limit: int, overhead: int) -> list[list[bytes]]:
    """``bodies`` in order, cut into MPUBs of at most ``count`` messages and ``limit`` bytes.

    By count alone, a few large lines (8 of 900 KiB) make a batch the server's max body size
    refuses; a line too big for any batch was refused before (``max_msg_size``), so each
    batch holds at least one message.
    """
    out: list[list[bytes]] = []
    part: list[bytes] = []
    size = 0
    for body in bodies:
        cost = len(body) + overhead
        if part and (len(part) >= count or size + cost > limit):
            out.append(part)
            part, size = [], 0
        part.append(body)
        size += cost
    if part:
        out.append(part)
    return out


def _flag_error(exc: InvalidArgument, partition: int | None) -> str:
    """A refusal of :func:`smartnsq.model.partitions.partition_for` in the words of the flags."""
    if exc.field == "partition" and partition is not None:
        return f"--partition {partition}: {exc.rule}"
    if exc.field == "partition":  # an ordered topic, nothing pinned
        return f"{exc.rule} (give --sharding-key, --key-field or --partition)"
    return f"--sharding-key: {exc.rule}"


async def run_pub(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgument, LookupFailed, NSQError, Timeout, TopicNotFound
    from ..model.partitions import partition_for
    from ..model.sharding import make_router
    from ..producer.producer import Producer
    from ..protocol.commands import encode_headers

    topic = check_topic(args.topic)
    lookupd, nsqd = cluster_addresses(args)
    timeout = timeout_of(args)
    headers = _parse_headers(args.header)
    if args.batch < 1:
        raise CLIError("--batch must be at least 1")
    if args.partition is not None and not 0 <= args.partition <= 1023:
        raise CLIError("--partition must be in 0..1023")
    if args.trace_id is not None and not 0 <= args.trace_id < 1 << 64:
        raise CLIError("--trace-id must be a uint64 (0..2**64-1)")
    key_path = args.key_field.split(".") if args.key_field else None
    if key_path is not None and not all(key_path):
        raise CLIError(f"bad --key-field {args.key_field!r}")
    sources = _sources(args)
    total_size = sum(s.size or 0 for s in sources) if all(s.size for s in sources) else None
    progress = Progress(False if args.quiet else args.progress if args.progress is not None
                        else (None if total_size else False), stream=args.err)
    router = make_router(args.sharding)
    totals = _Totals()
    started = time.monotonic()
    deadline = deadline_of(args)
    lookup_options = {"timeout": timeout, "connect_timeout": min(2.0, timeout),
                      "attempts": 2} if lookupd else None
    producer = Producer(lookupd=lookupd or None, nsqd=nsqd or None, timeout=timeout,
                        sharding=args.sharding, connect_timeout=min(timeout, 5.0),
                        lookup_options=lookup_options)
    try:
        # not `async with producer`: its start (lookupd discovery) would come before, and
        # outside, the deadline of the first lookup; routes() starts it within its timeout
        async with contextlib.AsyncExitStack() as stack:
            # a failed command does not wait for answers it will not report
            async def close(failure: type[BaseException] | None, *_: Any) -> bool:
                await producer.close(0.1 if failure is not None else min(2.0, timeout))
                return False

            stack.push_async_exit(close)
            try:
                routes = await producer.routes(topic, timeout=deadline.left())
            except TopicNotFound:
                raise topic_missing(topic) from None
            except (LookupFailed, Timeout, asyncio.TimeoutError) as exc:
                if isinstance(exc, Timeout | asyncio.TimeoutError):
                    where = (f"lookupd {', '.join(lookupd)}" if lookupd
                             else f"nsqd {', '.join(nsqd)}")
                    hint = ("--lookupd takes nsqlookupd's HTTP address, port 4161 by default"
                            if lookupd else
                            "--nsqd takes nsqd's TCP address, port 4150 by default")
                    raise CLIError(f"cannot look up topic {topic!r}: no answer from {where} "
                                   f"within {timeout:g} s (hint: {hint})") from None
                raise CLIError(f"cannot look up topic {topic!r}: {exc}") from None
            partition_num = routes.partition_num
            if headers and routes.youzan is not False and not routes.ext:
                raise CLIError(f"--header needs an ext topic, and {topic!r} is not one "
                               f"(create a topic with ext enabled, or publish without "
                               f"headers)")
            if key_path is None:
                # the Producer's rules (smartnsq.model.partitions), before any line is read: a
                # partition in range, an ordered topic pinned (--key-field: each line's key)
                try:
                    partition_for(routes, router, partition=args.partition,
                                  sharding_key=args.sharding_key)
                except InvalidArgument as exc:
                    raise CLIError(_flag_error(exc, args.partition)) from None
            lanes = max(1, partition_num or len(routes.nodes))
            chunk_size = args.batch * _CHUNK_BATCHES * lanes

            # what each message adds to an MPUB body besides its bytes: its size, a trace id,
            # the ext JSON (headers and the trace id key)
            ext = len(encode_headers(headers)) + 2 + 64 if headers else 0
            overhead = 4 + (8 if args.trace_id is not None else 0) + ext
            limit = producer.config.max_body_size - 4  # the message count

            def batches(bodies: list[bytes]) -> list[list[bytes]]:
                return _batches(bodies, args.batch, limit, overhead)

            async def send_group(target: int | None, bodies: list[bytes]) -> None:
                for part in batches(bodies):
                    kwargs: dict[str, Any] = {"trace_id": args.trace_id, "headers": headers}
                    if target is not None:
                        kwargs["partition"] = target
                    elif args.sharding_key is not None:
                        kwargs["sharding_key"] = args.sharding_key
                    if len(part) == 1:
                        result: Any = await producer.publish(topic, part[0], **kwargs)
                    else:
                        result = await producer.publish_many(topic, part, **kwargs)
                    row = totals.partitions.setdefault(result.partition, _PartitionTotals())
                    row.messages += len(part)
                    row.batches += 1
                    row.node = result.node
                    if row.first_internal_id is None and result.internal_id is not None:
                        row.first_internal_id = result.internal_id
                        row.first_offset = result.queue_offset
                    totals.messages += len(part)
                    totals.batches += 1

            async def flush(chunk: list[tuple[int | None, bytes]]) -> None:
                groups: dict[int | None, list[bytes]] = {}
                for target, body in chunk:
                    groups.setdefault(target, []).append(body)
                jobs = []
                for target, bodies in groups.items():
                    if target is None and args.sharding_key is None and lanes > 1:
                        # unsharded: no order to keep, so batches go out over several lanes
                        # at once and the producer spreads them over the partitions
                        split = batches(bodies)
                        for lane in range(lanes):
                            mine = [b for part in split[lane::lanes] for b in part]
                            if mine:
                                jobs.append(send_group(None, mine))
                    else:
                        jobs.append(send_group(target, bodies))
                await asyncio.gather(*jobs)

            chunk: list[tuple[int | None, bytes]] = []
            for source in sources:
                for number, body, consumed in _lines(source):
                    totals.bytes_read += consumed
                    if not body:
                        continue
                    target: int | None = args.partition
                    if key_path is not None:
                        key = _key_of(body, key_path, f"{source.name}:{number}")
                        try:  # None on classic nodes: no partitions to keep a key's order
                            target = partition_for(routes, router, sharding_key=key)
                        except InvalidArgument as exc:
                            raise CLIError(f"{source.name}:{number}: {exc}") from None
                    if len(body) > producer.config.max_msg_size:
                        raise CLIError(f"{source.name}:{number}: line of {len(body)} bytes is "
                                       f"larger than max_msg_size "
                                       f"{producer.config.max_msg_size}")
                    chunk.append((target, body))
                    if len(chunk) >= chunk_size:
                        await flush(chunk)
                        chunk = []
                        _show(progress, totals, total_size, started)
            if chunk:
                await flush(chunk)
    except CLIError as exc:
        progress.done()
        if totals.messages:
            raise CLIError(f"{exc} ({totals.messages} messages were published before)") \
                from None
        raise
    except NSQError as exc:
        progress.done()
        from .util import one_line

        done = f" ({totals.messages} messages were published before)" if totals.messages else ""
        raise CLIError(f"publishing to {topic!r} failed: {one_line(exc)}{done}") from None
    finally:
        for source in sources:
            if source.size is not None:
                source.stream.close()
    _show(progress, totals, total_size, started, force=True)
    progress.done()
    _summary(args, topic, totals, time.monotonic() - started)
    return 0


def _show(progress: Progress, totals: _Totals, total_size: int | None, started: float,
          *, force: bool = False) -> None:
    if not progress.enabled:
        return
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = totals.messages / elapsed
    if total_size:
        fraction = totals.bytes_read / total_size
        progress.update(f"{bar(fraction)} {fraction:4.0%}  {totals.messages} messages  "
                        f"{rate:,.0f} msg/s", force=force)
    else:
        progress.update(f"{totals.messages} messages  {rate:,.0f} msg/s", force=force)


def _summary(args: argparse.Namespace, topic: str, totals: _Totals, elapsed: float) -> None:
    out = args.out
    rate = totals.messages / elapsed if elapsed > 0 else 0.0
    if args.json:
        out.write(dumps({
            "topic": topic, "messages": totals.messages, "commands": totals.batches,
            "seconds": round(elapsed, 3),
            "partitions": [{"partition": p, "node": row.node, "messages": row.messages,
                            "commands": row.batches, "first_id": row.first_internal_id,
                            "first_offset": row.first_offset}
                           for p, row in sorted(totals.partitions.items(),
                                                key=lambda item: -1 if item[0] is None
                                                else item[0])]}) + "\n")
        return
    out.write(f"published {_plural(totals.messages, 'message')} to {topic} in "
              f"{_plural(totals.batches, 'command')}, {elapsed:.2f} s ({rate:,.0f} msg/s)\n")
    if not totals.messages:
        return
    rows = []
    for partition in sorted(totals.partitions, key=lambda p: -1 if p is None else p):
        row = totals.partitions[partition]
        rows.append(["-" if partition is None else partition, row.node, row.messages,
                     row.batches, "" if row.first_internal_id is None else row.first_internal_id,
                     "" if row.first_offset is None else row.first_offset])
    out.write(format_table(["partition", "node", "messages", "commands", "first id",
                            "first offset"], rows, right=(0, 2, 3, 4, 5)) + "\n")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
