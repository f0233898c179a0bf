"""``smartnsq topic ACTION TOPIC``: create, delete, expand, pause, unpause, tombstone.

``create`` is ``AsyncAdmin.create_topic``: on a youzan cluster it re-sends the create until
every partition has a leader and, with ``--channel``, until writers see every partition (a
real cluster takes seconds to minutes: ``--create-timeout``); on classic, the topic (and its
channels) on every nsqd. ``expand`` raises a youzan topic's partition count on the leader
lookupd; ``pause``/``unpause`` are classic nsqd's; ``tombstone`` hides one nsqd from the
topic's writers on every lookupd (``--restore`` undoes it).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .util import (
    CLIError,
    Progress,
    check_topic,
    lookupd_or_node,
    report,
    run_admin,
    split_addresses,
    targets_json,
    targets_text,
)

__all__ = ["register", "run_topic"]

_ACTIONS = ("create", "delete", "expand", "pause", "unpause", "tombstone")


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("topic", "create, delete, expand, pause or tombstone a topic",
                description="A topic's actions: create (until usable), delete, expand "
                            "(youzan, until usable), pause/unpause (classic), tombstone a node.")
    p.add_argument("action", choices=_ACTIONS, help="what to do")
    p.add_argument("topic", help="the topic")
    p.add_argument("--partitions", type=int, metavar="N",
                   help="create: partitions (default 1); expand: the new partition count")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="create: replicas of each partition (default 1)")
    p.add_argument("--ordered", action="store_true", help="create: an ordered topic")
    p.add_argument("--ext", action="store_true", help="create: an ext (headers) topic")
    p.add_argument("--multipart", action=argparse.BooleanOptionalAction, default=None,
                   help="create: let partitions x replicas exceed the nsqd count (default: "
                        "when they do)")
    p.add_argument("--disable-channel-auto-create", action="store_true",
                   help="create: channels only as registered on the lookupd")
    p.add_argument("--channel", action="append", default=[], metavar="NAME",
                   help="create: a channel to create on every partition (repeatable); the "
                        "command then returns once writers see every partition")
    p.add_argument("--no-wait", action="store_true",
                   help="create, expand: send the request once and return")
    p.add_argument("--create-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="create, expand: how long the topic (its new partitions) may take "
                        "to become usable (default 60)")
    p.add_argument("--node", metavar="HOST:HTTP_PORT", help="tombstone: the nsqd")
    p.add_argument("--restore", action="store_true", help="tombstone: undo it")
    p.add_argument("--nsqd-http", metavar="HOST:PORT",
                   help="pause/unpause: only this nsqd instead of every one holding the topic")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_topic)


async def run_topic(args: argparse.Namespace) -> int:
    topic = check_topic(args.topic)
    lookupd, address = lookupd_or_node(args, f"topic {args.action}",
                                       node_suffices=args.action in ("pause", "unpause"))
    if args.action == "create":
        return await _create(args, topic, lookupd)
    if args.action == "expand":
        return await _expand(args, topic, lookupd)
    if args.action == "delete":
        await run_admin(args, lookupd, "topic delete", lambda admin: admin.delete_topic(topic))
        return report(args, {"action": "delete", "topic": topic}, f"deleted {topic}")
    if args.action == "tombstone":
        if not args.node:
            raise CLIError("topic tombstone needs --node HOST:HTTP_PORT (the nsqd)")
        node = split_addresses(args.node, "--node")[0]
        told = await run_admin(args, lookupd, "topic tombstone",
                               lambda admin: admin.tombstone(topic, node,
                                                             restore=args.restore))
        verb = "restored" if args.restore else "tombstoned"
        return report(args, {"action": "tombstone", "topic": topic, "node": node,
                             "restore": args.restore, "lookupds": list(told)},
                      f"{verb} {node} for {topic} on lookupd {', '.join(told)}")
    method = "pause_topic" if args.action == "pause" else "unpause_topic"
    targets = await run_admin(args, lookupd, f"topic {args.action}",
                              lambda admin: getattr(admin, method)(topic, address=address))
    return report(args, {"action": args.action, "topic": topic,
                         "targets": targets_json(targets)},
                  f"{args.action}d {topic}: {targets_text(targets)}")


async def _expand(args: argparse.Namespace, topic: str, lookupd: list[str]) -> int:
    """The expansion, and unless ``--no-wait`` until writers see the new partitions, within
    ``--create-timeout`` (each request within ``--timeout``)."""
    from .util import admin_client, timeout_of

    partitions = args.partitions
    if partitions is None:
        raise CLIError("topic expand needs --partitions N (the new partition count)")
    async with admin_client(args, lookupd) as admin:
        admin.timeout = timeout_of(args)
        leader = await admin.expand_topic(topic, partitions, wait=not args.no_wait,
                                          timeout=args.create_timeout)
    then = ("the new partitions get leaders at its next cluster check" if args.no_wait
            else "writers see every new partition")
    return report(args, {"action": "expand", "topic": topic, "partitions": partitions,
                         "lookupd": leader, "waited": not args.no_wait},
                  f"expanded {topic} to {partitions} partitions (leader lookupd {leader}); "
                  f"{then}")


async def _create(args: argparse.Namespace, topic: str, lookupd: list[str]) -> int:
    """The create workflow within ``--create-timeout`` (each request within ``--timeout``),
    a progress line on a terminal."""
    from .util import admin_client, timeout_of

    progress = Progress(enabled=None if not args.quiet else False, stream=args.err)
    partitions = 1 if args.partitions is None else args.partitions
    async with admin_client(args, lookupd) as admin:
        admin.timeout = timeout_of(args)
        state: Any = await admin.create_topic(
            topic, partitions, args.replicas, ordered=args.ordered, ext=args.ext,
            multipart=args.multipart,
            disable_channel_auto_create=args.disable_channel_auto_create,
            channels=args.channel, wait=not args.no_wait, timeout=args.create_timeout,
            progress=lambda s: progress.update(s.describe()))
    progress.done()
    row = {"action": "create", "topic": topic, "partitions": state.partition_num,
           "replicas": args.replicas, "leaders": sorted(state.leaders),
           "writable": sorted(state.writable), "channels": args.channel,
           "done": state.done, "seconds": round(state.elapsed, 3)}
    text = (f"created {topic}" if state.done or not state.partition_num
            else f"sent the create of {topic}") + f" ({state.describe()})"
    return report(args, row, text)
