"""``smartnsq top [TOPIC]``: a live table of topics, partitions, leaders, depth, in-flight and
rates, refreshed in place; ``--json`` prints one reading and exits.

Leaders are named by their HTTP address (the node asked), as ``smartnsq lookup``'s
"leader http" column names them. Depth is in messages: a youzan topic row has none (its
node reports the partition's queue size in bytes there: ``queue_bytes`` in ``--json``).

Every refresh asks each nsqd for its ``/stats`` (through ``smartnsq.admin``; the nodes come
from lookupd's ``/nodes`` unless given with ``--nsqd-http``). A youzan node reports the
partitions it only replicates too: ``top`` shows each partition once, from its leader. Rates
are the change of the counters between two readings: ``pub/s`` the topic's (partition's)
message count, ``out/s`` what left the channel (its message count less what it still holds:
depth, in flight, deferred), so a channel nobody reads shows 0. ``--json`` takes two
readings ``--interval`` seconds apart (``--interval 0``: one reading, rates ``null``) and
prints one JSON object per row.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from .tables import format_table
from .util import CLIError, admin_client, check_topic, dumps, split_addresses

__all__ = ["register", "run_top"]

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: the table is redrawn in place

Key = tuple[str, int | None, str | None]  # topic, partition, channel (None: the topic row)


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("top", "live table of partitions, leaders, depth, in-flight and rates")
    p.add_argument("topic", nargs="?", help="only this topic")
    p.add_argument("--channel", help="only this channel")
    p.add_argument("--nsqd-http", action="append", metavar="HOST:PORT[,HOST:PORT]",
                   help="nsqd HTTP address(es) to ask (default: every node lookupd knows)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between refreshes (--json: between its two readings; 0: "
                        "one reading, no rates); default 2")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="stop after N refreshes (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true",
                   help="print one reading as JSON lines (one per row) and exit")
    p.set_defaults(handler=run_top)


async def _reading(admin: Any, nodes: list[str], topic: str | None,
                   channel: str | None) -> tuple[dict[Key, dict[str, Any]], list[str]]:
    """One reading of every node: rows by key (each partition from its leader), errors."""
    from ..errors import NSQError

    answers = await admin.cluster_stats(topic, channel, nsqd=nodes)
    rows: dict[Key, dict[str, Any]] = {}
    errors: list[str] = []
    for node, answer in answers.items():
        if isinstance(answer, NSQError):
            errors.append(str(answer))
            continue
        for entry in answer.topics:
            if entry.leader is False:
                continue  # a replica: its counters are not the ones consumers see
            base = {"topic": entry.name, "partition": entry.partition, "leader_http": node,
                    "ordered": entry.ordered, "ext": entry.ext}
            rows[(entry.name, entry.partition, None)] = {
                **base, "channel": None, "depth": entry.waiting,
                "queue_bytes": entry.queue_bytes,
                "in_flight": None, "deferred": None, "clients": None,
                "messages": entry.message_count}
            for chan in entry.channels:
                if channel and chan.name != channel:
                    continue
                rows[(entry.name, entry.partition, chan.name)] = {
                    **base, "channel": chan.name, "depth": chan.depth, "queue_bytes": None,
                    "in_flight": chan.in_flight, "deferred": chan.deferred,
                    "clients": chan.clients, "messages": chan.message_count}
    return rows, errors


def _rates(now: dict[Key, dict[str, Any]], before: dict[Key, dict[str, Any]] | None,
           seconds: float) -> None:
    """Add ``pub_rate`` (topic rows and their channels: the partition's) and ``out_rate``
    (channel rows: what left the channel, finished or dropped) per second over ``seconds``;
    ``None`` without an earlier reading."""
    for key, row in now.items():
        topic_key = (key[0], key[1], None)
        row["pub_rate"] = row["out_rate"] = None
        if before is None or seconds <= 0:
            continue
        old_topic = before.get(topic_key)
        new_topic = now.get(topic_key)
        if old_topic is not None and new_topic is not None:
            row["pub_rate"] = max(0, new_topic["messages"] - old_topic["messages"]) / seconds
        old = before.get(key)
        if key[2] is not None and old is not None:
            row["out_rate"] = max(0, _left(row) - _left(old)) / seconds


def _left(row: dict[str, Any]) -> int:
    """Messages that entered a channel and are no longer in it (the counter counts entries:
    an idle channel's grows with its depth)."""
    held = sum(row.get(k) or 0 for k in ("depth", "in_flight", "deferred"))
    return int(row["messages"]) - held


def _sorted(rows: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], -1 if k[1] is None else k[1],
                                                         k[2] or ""))]


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _table(rows: list[dict[str, Any]]) -> str:
    return format_table(
        ["topic", "partition", "leader http", "channel", "depth", "in-flight", "deferred",
         "clients", "pub/s", "out/s"],
        [[r["topic"], "-" if r["partition"] is None else r["partition"], r["leader_http"],
          r["channel"] or "-", _dash(r["depth"]), _dash(r["in_flight"]), _dash(r["deferred"]),
          _dash(r["clients"]), _rate(r["pub_rate"]), _rate(r["out_rate"])] for r in rows],
        right=(1, 4, 5, 6, 7, 8, 9))


def _dash(value: object) -> object:
    return "-" if value is None else value


async def run_top(args: argparse.Namespace) -> int:
    from ..errors import NSQError

    topic = check_topic(args.topic) if args.topic else None
    if args.interval < 0:
        raise CLIError("--interval must be >= 0")
    if not args.json and args.interval == 0:
        raise CLIError("--interval 0 is for --json (one reading)")
    nodes = split_addresses(args.nsqd_http, "nsqd HTTP")
    lookupd = split_addresses(args.lookupd, "lookupd")
    if not nodes and not lookupd:
        raise CLIError("top needs --lookupd HOST:PORT (or SMARTNSQ_LOOKUPD) or "
                       "--nsqd-http HOST:PORT")
    async with admin_client(args, lookupd) as admin:
        async def nodes_now() -> list[str]:
            if nodes:
                return nodes
            try:
                found = [n.http_address for n in await admin.nodes()]
            except NSQError as exc:
                raise CLIError(str(exc)) from None
            if not found:
                raise CLIError("lookupd knows no nsqd nodes")
            return found

        before: dict[Key, dict[str, Any]] | None = None
        taken = 0.0
        refreshes = 0
        while True:
            rows, errors = await _reading(admin, await nodes_now(), topic, args.channel)
            now = time.monotonic()
            if errors and not rows:
                raise CLIError(errors[0] if len(errors) == 1 else
                               f"{errors[0]} (and {len(errors) - 1} more nodes failed)")
            if topic and not rows:
                raise CLIError(f"topic {topic!r} not found on any node")
            _rates(rows, before, now - taken)
            if args.json:
                if before is None and args.interval > 0:
                    before, taken = rows, now
                    await asyncio.sleep(args.interval)
                    continue
                for row in _sorted(rows):
                    args.out.write(dumps(row) + "\n")
                for error in errors:
                    args.err.write(f"warning: {error}\n")
                return 0
            screen = _table(_sorted(rows))
            stamp = time.strftime("%H:%M:%S")
            header = (f"smartnsq top  {stamp}  every {args.interval:g}s"
                      + (f"  ({len(errors)} node(s) failed: {errors[0]})" if errors else ""))
            args.out.write(f"{_CLEAR}{header}\n\n{screen}\n")
            args.out.flush()
            refreshes += 1
            if args.count and refreshes >= args.count:
                return 0
            before, taken = rows, now
            await asyncio.sleep(args.interval)
