"""``smartnsq stats [TOPIC]``: per partition and channel depth, in-flight and clients.

The nodes are asked directly (nsqd HTTP ``/stats?format=json``), found through lookupd's
``/nodes`` unless given with ``--nsqd-http``. Youzan nodes also report the partitions they
only replicate; those rows are hidden unless ``--replicas`` (their counters are not the ones
consumers see).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx

from .cli_util import CLIError, check_topic, dumps, format_table, http_get_json, split_addresses
from .errors import ProtocolError
from .protocol.lookup import parse_node

__all__ = ["node_http_addresses", "run_stats"]


async def node_http_addresses(client: httpx.AsyncClient, lookupd: list[str]) -> list[str]:
    """Every nsqd HTTP address the first answering lookupd knows (``/nodes``)."""
    failures = []
    for address in lookupd:
        try:
            data = await http_get_json(client, address, "/nodes", what="nsqlookupd /nodes")
        except CLIError as exc:
            failures.append(str(exc))
            continue
        producers = data.get("producers") if isinstance(data, dict) else None
        out = []
        for peer in producers or []:
            try:
                out.append(parse_node(peer).http_address)  # the same reading as /lookup's
            except ProtocolError:
                continue  # a peer without an address or ports cannot be asked for /stats
        return sorted(set(out))
    raise CLIError("; ".join(failures) if failures else "no lookupd given")


def _rows(address: str, stats: dict[str, Any], channel_filter: str | None,
          replicas: bool) -> list[dict[str, Any]]:
    rows = []
    for topic in stats.get("topics") or []:
        partition = topic.get("topic_partition")
        leader = topic.get("is_leader")
        if leader is False and not replicas:
            continue
        base = {
            "topic": topic.get("topic_name"),
            "partition": None if partition in (None, "") else int(partition),
            "node": address,
            "leader": leader,
            "messages": topic.get("message_count"),
        }
        channels = [c for c in topic.get("channels") or []
                    if not channel_filter or c.get("channel_name") == channel_filter]
        if not channels and not channel_filter:
            rows.append({**base, "channel": None, "depth": topic.get("depth"),
                         "in_flight": None, "deferred": None, "requeued": None,
                         "timed_out": None, "clients": None, "paused": None})
        for channel in channels:
            clients = channel.get("client_num")
            if clients is None:
                clients = channel.get("client_count")
            if clients is None:
                clients = len(channel.get("clients") or [])
            rows.append({**base, "channel": channel.get("channel_name"),
                         "depth": channel.get("depth"),
                         "in_flight": channel.get("in_flight_count"),
                         "deferred": channel.get("deferred_count"),
                         "requeued": channel.get("requeue_count"),
                         "timed_out": channel.get("timeout_count"),
                         "clients": clients, "paused": channel.get("paused")})
    return rows


async def run_stats(args: argparse.Namespace) -> int:
    topic = check_topic(args.topic) if args.topic else None
    nodes = split_addresses(args.nsqd_http, "nsqd HTTP")
    lookupd = split_addresses(args.lookupd, "lookupd")
    if not nodes and not lookupd:
        raise CLIError("stats needs --lookupd HOST:PORT (or SMARTNSQ_LOOKUPD) or "
                       "--nsqd-http HOST:PORT")
    params = {"format": "json"}
    if topic:
        params["topic"] = topic
    if args.channel:
        params["channel"] = args.channel
    async with httpx.AsyncClient(timeout=args.timeout) as client:
        if not nodes:
            nodes = await node_http_addresses(client, lookupd)
            if not nodes:
                raise CLIError("lookupd knows no nsqd nodes")
        answers = await asyncio.gather(
            *(http_get_json(client, node, "/stats", params, what="nsqd /stats")
              for node in nodes), return_exceptions=True)
    rows: list[dict[str, Any]] = []
    errors = []
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, CLIError):
                raise answer
            errors.append(str(answer))
            continue
        rows.extend(_rows(node, answer if isinstance(answer, dict) else {}, args.channel,
                          args.replicas))
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
                  r["channel"] or "-", r["depth"], _dash(r["in_flight"]), _dash(r["deferred"]),
                  _dash(r["clients"]), r["messages"]] for r in rows]
        args.out.write(format_table(
            ["topic", "partition", "node", "channel", "depth", "in-flight", "deferred",
             "clients", "messages"], table, right=(1, 4, 5, 6, 7, 8)) + "\n")
    for error in errors:
        args.err.write(f"warning: {error}\n")
    return 0


def _dash(value: object) -> object:
    return "-" if value is None else value
