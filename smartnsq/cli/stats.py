"""``smartnsq stats [TOPIC]``: per partition and channel depth, in-flight and clients.

The nodes are asked directly (nsqd ``/stats``, through ``smartnsq.admin``), found through
lookupd's ``/nodes`` unless given with ``--nsqd-http``. Youzan nodes also report the
partitions they only replicate; those rows are hidden unless ``--replicas`` (their counters
are not the ones consumers see).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from .tables import format_table
from .util import CLIError, admin_client, check_topic, deadline_of, dumps, split_addresses, warn

__all__ = ["register", "run_stats"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("stats", "per partition depth and in-flight counts from the nsqd nodes")
    p.add_argument("topic", nargs="?", help="only this topic")
    p.add_argument("--channel", help="only this channel")
    p.add_argument("--nsqd-http", action="append", metavar="HOST:PORT[,HOST:PORT]",
                   help="nsqd HTTP address(es) to ask (default: every node lookupd knows)")
    p.add_argument("--replicas", action="store_true",
                   help="also show partitions on nodes that do not lead them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_stats)


def _rows(address: str, stats: Any, channel_filter: str | None,
          replicas: bool) -> list[dict[str, Any]]:
    rows = []
    for topic in stats.topics:
        if topic.leader is False and not replicas:
            continue
        base = {"topic": topic.name, "partition": topic.partition, "node": address,
                "leader": topic.leader, "messages": topic.message_count}
        channels = [c for c in topic.channels if not channel_filter or c.name == channel_filter]
        if not channels and not channel_filter:
            rows.append({**base, "channel": None, "depth": topic.waiting,
                         "queue_bytes": topic.queue_bytes, "in_flight": None,
                         "deferred": None, "requeued": None, "timed_out": None,
                         "clients": None, "paused": None})
        for channel in channels:
            rows.append({**base, "channel": channel.name, "depth": channel.depth,
                         "queue_bytes": None,
                         "in_flight": channel.in_flight, "deferred": channel.deferred,
                         "requeued": channel.requeued, "timed_out": channel.timed_out,
                         "clients": channel.clients, "paused": channel.paused})
    return rows


async def run_stats(args: argparse.Namespace) -> int:
    from ..errors import NSQError

    topic = check_topic(args.topic) if args.topic else None
    nodes = split_addresses(args.nsqd_http, "nsqd HTTP")
    lookupd = split_addresses(args.lookupd, "lookupd")
    if not nodes and not lookupd:
        raise CLIError("stats needs --lookupd HOST:PORT (or SMARTNSQ_LOOKUPD) or "
                       "--nsqd-http HOST:PORT")
    deadline = deadline_of(args)
    async with admin_client(args, lookupd, deadline) as admin:
        if not nodes:
            try:
                nodes = [n.http_address for n in await asyncio.wait_for(
                    admin.nodes(), deadline.left() + 0.2)]
            except asyncio.TimeoutError:
                raise CLIError(f"nsqlookupd /nodes: no answer from {', '.join(lookupd)} "
                               f"within {deadline.seconds:g} s (hint: --lookupd takes "
                               f"nsqlookupd's HTTP address, port 4161 by default)") from None
            except NSQError as exc:
                raise CLIError(str(exc)) from None
            if not nodes:
                raise CLIError("lookupd knows no nsqd nodes")
        admin.timeout = deadline.left()  # the nodes are asked at once, in what is left
        try:
            answers = await asyncio.wait_for(
                admin.cluster_stats(topic, args.channel, nsqd=nodes), deadline.left() + 0.2)
        except asyncio.TimeoutError:
            raise CLIError(f"nsqd /stats: no answer from {', '.join(nodes)} within "
                           f"{deadline.seconds:g} s") from None
    rows: list[dict[str, Any]] = []
    errors = []
    for node, answer in answers.items():
        if isinstance(answer, NSQError):
            errors.append(str(answer))
            continue
        rows.extend(_rows(node, answer, args.channel, args.replicas))
    if errors and not rows:
        raise CLIError(errors[0] if len(errors) == 1 else
                       f"{errors[0]} (and {len(errors) - 1} more nodes failed)")
    if topic and not rows:
        raise CLIError(f"topic {topic!r} not found on any node"
                       + (f" with channel {args.channel!r}" if args.channel else ""))
    rows.sort(key=lambda r: (r["topic"] or "", -1 if r["partition"] is None else r["partition"],
                             r["channel"] or "", r["node"]))
    if args.json:
        for row in rows:
            args.out.write(dumps(row) + "\n")
    else:
        table = [[r["topic"], "-" if r["partition"] is None else r["partition"],
                  r["node"] + ("" if r["leader"] in (True, None) else " (replica)"),
                  r["channel"] or "-", _dash(r["depth"]), _dash(r["in_flight"]),
                  _dash(r["deferred"]), _dash(r["clients"]), r["messages"]] for r in rows]
        args.out.write(format_table(
            ["topic", "partition", "node", "channel", "depth", "in-flight", "deferred",
             "clients", "messages"], table, right=(1, 4, 5, 6, 7, 8)) + "\n")
    for error in errors:
        warn(args, error)
    return 0


def _dash(value: object) -> object:
    return "-" if value is None else value
