"""``smartnsq lookup TOPIC``: partitions, leaders, replicas and meta of a topic.

Leaders and meta come from nsqlookupd (every lookupd of the cluster, merged, through
``smartnsq.lookup.LookupManager``). Lookupd only knows leaders; the replicas are read from the
nodes themselves (nsqd ``/stats`` lists the partitions a node holds and whether it leads them),
best effort: a node that does not answer leaves its replicas out, and the command says so.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx

from .cli_util import CLIError, check_topic, dumps, format_table, http_get_json, split_addresses

__all__ = ["lookup_manager", "run_lookup"]


def lookup_manager(args: argparse.Namespace, lookupd: list[str]) -> Any:
    """A LookupManager tuned for one-shot commands: fail within about ``--timeout``."""
    from .lookup import LookupManager

    timeout = max(0.1, float(args.timeout))
    return LookupManager(lookupd, timeout=timeout, connect_timeout=min(2.0, timeout),
                         attempts=2, retry_delay=0.1, retry_delay_max=0.5)


def _node(node: Any) -> dict[str, Any] | None:
    if node is None:
        return None
    return {"address": f"{node.broadcast_address}:{node.tcp_port}",
            "http_address": node.http_address, "hostname": node.hostname,
            "version": node.version}


async def _replicas(nodes: list[str], topic: str, timeout: float
                    ) -> tuple[dict[int, list[str]], list[str]]:
    """partition -> HTTP addresses of the nodes holding it without leading it; failed nodes."""
    out: dict[int, list[str]] = {}
    failed: list[str] = []
    async with httpx.AsyncClient(timeout=timeout) as client:
        answers = await asyncio.gather(
            *(http_get_json(client, n, "/stats", {"format": "json", "topic": topic},
                            what="nsqd /stats") for n in nodes), return_exceptions=True)
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException) or not isinstance(answer, dict):
            failed.append(node)
            continue
        for stats in answer.get("topics") or []:
            if stats.get("topic_name") != topic or stats.get("is_leader") is not False:
                continue
            partition = stats.get("topic_partition")
            if partition not in (None, ""):
                out.setdefault(int(partition), []).append(node)
    return out, failed


async def run_lookup(args: argparse.Namespace) -> int:
    from .errors import LookupFailed, TopicNotFound

    topic = check_topic(args.topic)
    lookupd = split_addresses(args.lookupd, "lookupd")
    if not lookupd:
        raise CLIError("lookup needs --lookupd HOST:PORT (or SMARTNSQ_LOOKUPD)")
    async with lookup_manager(args, lookupd) as manager:
        try:
            view = await manager.view(topic, args.access, refresh=True)
        except TopicNotFound:
            raise CLIError(f"topic {topic!r} not found") from None
        except LookupFailed as exc:
            raise CLIError(f"lookup of {topic!r} failed: {exc}") from None
        lookupds = list(manager.lookupds)
    if not view.partitions and not view.producers:
        raise CLIError(f"topic {topic!r} not found (no partition and no node serves it)")
    replicas: dict[int, list[str]] = {}
    failed: list[str] = []
    if view.youzan and view.partitions:
        holders = sorted({n.http_address for n in view.producers}
                         | {p.leader.http_address for p in view.partitions.values()
                            if p.leader is not None})
        from .cli_stats import node_http_addresses

        try:
            async with httpx.AsyncClient(timeout=args.timeout) as client:
                holders = sorted(set(holders) | set(await node_http_addresses(client, lookupd)))
        except CLIError:
            pass  # the leaders are still worth asking
        replicas, failed = await _replicas(holders, topic, args.timeout)
    meta = view.meta
    partitions = []
    for pid in sorted(view.partitions):
        partition = view.partitions[pid]
        known = sorted({n.http_address for n in partition.replicas} | set(replicas.get(pid, [])))
        partitions.append({"partition": pid, "leader": _node(partition.leader),
                           "replicas": known})
    if args.json:
        args.out.write(dumps({
            "topic": topic, "access": view.access, "youzan": view.youzan,
            "meta": None if meta is None else {
                "partition_num": meta.partition_num, "replica": meta.replica,
                "ordered": meta.ordered, "extend_support": meta.extend_support,
                "multi_part": meta.multi_part,
                "disable_channel_auto_create": meta.disable_channel_auto_create},
            "partitions": partitions,
            "producers": [_node(n) for n in view.producers],
            "channels": list(view.channels),
            "lookupds": lookupds,
            "replicas_unknown_on": failed,
        }) + "\n")
        return 0
    out = args.out
    kind = "youzan" if view.youzan else "classic"
    out.write(f"topic {topic} ({kind}, access={view.access}) from lookupd "
              f"{', '.join(view.lookupds or lookupds)}\n")
    if meta is not None and meta.known:
        flags = [name for name, on in (("ordered", meta.ordered), ("ext", meta.extend_support),
                                       ("multi_part", meta.multi_part),
                                       ("channel auto-create off",
                                        meta.disable_channel_auto_create)) if on]
        out.write(f"meta: {meta.partition_num} partitions, replica {meta.replica}"
                  f"{', ' + ', '.join(flags) if flags else ''}\n")
    if view.channels:
        out.write(f"channels: {', '.join(view.channels)}\n")
    if partitions:
        rows = []
        for p in partitions:
            leader = p["leader"]
            rows.append([p["partition"], leader["address"] if leader else "(no leader)",
                         leader["http_address"] if leader else "",
                         leader["version"] if leader else "",
                         ", ".join(p["replicas"]) or "-"])
        missing = []
        if meta is not None and meta.partition_num:
            missing = [i for i in range(meta.partition_num) if i not in view.partitions]
        for pid in missing:
            rows.append([pid, "(no leader now)", "", "", ", ".join(replicas.get(pid, [])) or "-"])
        rows.sort(key=lambda r: int(r[0]))
        out.write(format_table(["partition", "leader", "leader http", "version",
                                "replicas (http)"], rows, right=(0,)) + "\n")
    else:
        out.write(format_table(["node", "http", "version"],
                               [[f"{n.broadcast_address}:{n.tcp_port}", n.http_address,
                                 n.version] for n in view.producers]) + "\n")
    if failed:
        args.err.write(f"warning: replicas unknown: no /stats answer from {', '.join(failed)}\n")
    return 0
