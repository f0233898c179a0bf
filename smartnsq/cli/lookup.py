"""``smartnsq lookup TOPIC``: partitions, leaders, replicas and meta of a topic.

Leaders and meta come from nsqlookupd (every lookupd of the cluster, merged, through
``smartnsq.discovery.lookup.LookupManager``). Lookupd only knows leaders; the replicas are read from
the nodes themselves (nsqd ``/stats`` lists the partitions a node holds and whether it leads them),
best effort: a node that does not answer leaves its replicas out, and the command says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from .tables import format_table
from .util import (
    CLIError,
    Deadline,
    admin_client,
    check_topic,
    deadline_of,
    dumps,
    lookup_failure,
    lookup_manager,
    split_addresses,
    topic_missing,
    warn,
)

__all__ = ["register", "run_lookup"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("lookup", "show a topic's partitions, leaders, replicas and meta")
    p.add_argument("topic", help="the topic to look up")
    p.add_argument("--access", choices=("r", "w"), default="r",
                   help="look up for reading (default, every partition with a leader) or "
                        "writing (only writable partitions)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_lookup)


def _node(node: Any) -> dict[str, Any] | None:
    if node is None:
        return None
    return {"address": f"{node.broadcast_address}:{node.tcp_port}",
            "http_address": node.http_address, "hostname": node.hostname,
            "version": node.version}


async def _replicas(args: argparse.Namespace, lookupd: list[str], holders: set[str],
                    topic: str, deadline: Deadline) -> tuple[dict[int, list[str]], list[str]]:
    """partition -> HTTP addresses of the nodes holding it without leading it (every node
    lookupd knows, and the leaders, asked for their ``/stats``); the nodes that failed.
    Within what is left of the command's deadline: a node still silent then is a failure."""
    from ..errors import NSQError

    async with admin_client(args, lookupd, deadline) as admin:
        # without the list, the leaders are still asked
        with contextlib.suppress(NSQError, asyncio.TimeoutError):
            admin.timeout = deadline.left() / 2
            nodes = await asyncio.wait_for(admin.nodes(), deadline.left() / 2)
            holders |= {n.http_address for n in nodes}
        admin.timeout = deadline.left()
        try:
            answers = await asyncio.wait_for(
                admin.cluster_stats(topic, nsqd=sorted(holders)), deadline.left() + 0.2)
        except asyncio.TimeoutError:
            return {}, sorted(holders)
    out: dict[int, list[str]] = {}
    failed: list[str] = []
    for node, answer in answers.items():
        if isinstance(answer, NSQError):
            failed.append(node)
            continue
        for stats in answer.partitions(topic, leader=False):
            if stats.partition is not None:
                out.setdefault(stats.partition, []).append(node)
    return out, failed


async def run_lookup(args: argparse.Namespace) -> int:
    from ..errors import LookupFailed, TopicNotFound

    topic = check_topic(args.topic)
    lookupd = split_addresses(args.lookupd, "lookupd")
    if not lookupd:
        raise CLIError("lookup needs --lookupd HOST:PORT (or SMARTNSQ_LOOKUPD)")
    deadline = deadline_of(args)
    manager = lookup_manager(args, lookupd)
    try:  # not `async with`: its start (discovery) must count against the deadline too
        view = await manager.view(topic, args.access, refresh=True, timeout=deadline.left())
        lookupds = list(manager.lookupds)
    except TopicNotFound:
        raise topic_missing(topic) from None
    except LookupFailed as exc:
        raise lookup_failure(exc, topic, lookupd, deadline.seconds) from None
    finally:
        await manager.close()
    if not view.partitions and not view.producers and not (view.meta and view.meta.known):
        raise topic_missing(topic)  # (a youzan topic whose leaders are all down has its meta)
    replicas: dict[int, list[str]] = {}
    failed: list[str] = []
    if view.youzan and view.partitions:
        holders = ({n.http_address for n in view.producers}
                   | {p.leader.http_address for p in view.partitions.values()
                      if p.leader is not None})
        replicas, failed = await _replicas(args, lookupd, holders, topic, deadline)
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
    if partitions or (view.youzan and meta is not None and meta.known):
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
        warn(args, f"replicas unknown: no /stats answer from {', '.join(failed)}")
    return 0
