"""``smartnsq channel ACTION TOPIC CHANNEL``: the channel's weekly actions.

``create``, ``delete``, ``pause``, ``unpause``, ``empty``, ``setoffset POSITION`` on both
kinds; ``skip``, ``unskip``, ``empty-delayed``, ``requeue-delayed`` on youzan only (classic
nsqd has no such route and answers 404). Each goes through ``smartnsq.admin`` to every
partition's leader (youzan) or every nsqd holding the topic (classic), or to one partition
(``--partition``) or one node (``--nsqd-http``); the line (or ``--json`` object) says where
it went, so an operator sees which partitions were touched.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .util import (
    CLIError,
    check_topic,
    lookupd_or_node,
    parse_start,
    report,
    run_admin,
    targets_json,
    targets_text,
)

__all__ = ["ACTIONS", "register", "run_channel"]

ACTIONS: dict[str, tuple[str, str]] = {
    # action -> (AsyncAdmin method, what the line says it did)
    "create": ("create_channel", "created"),
    "delete": ("delete_channel", "deleted"),
    "pause": ("pause_channel", "paused"),
    "unpause": ("unpause_channel", "unpaused"),
    "empty": ("empty_channel", "emptied"),
    "skip": ("skip_channel", "skipping"),
    "unskip": ("unskip_channel", "no longer skipping"),
    "empty-delayed": ("empty_delayed", "emptied the delayed queue of"),
    "requeue-delayed": ("requeue_delayed", "requeued the delayed messages of"),
    "setoffset": ("set_offset", "moved"),
}


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("channel", "create, delete, pause, empty, skip or position a channel",
                description="A channel's actions, on every partition's leader (youzan) or "
                            "every nsqd holding the topic (classic). skip, unskip, "
                            "empty-delayed and requeue-delayed are youzan's.")
    p.add_argument("action", choices=list(ACTIONS), help="what to do")
    p.add_argument("topic", help="the topic")
    p.add_argument("channel", help="the channel")
    p.add_argument("position", nargs="?",
                   help="setoffset only: earliest, latest, timestamp:UNIX_SECONDS, "
                        "timestamp:ISO_DATE, offset:QUEUE_OFFSET or count:MESSAGES")
    p.add_argument("--partition", type=int, metavar="P", help="only this partition")
    p.add_argument("--nsqd-http", metavar="HOST:PORT",
                   help="only this nsqd (its HTTP address) instead of asking lookupd")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_channel)


async def run_channel(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgument
    from ..protocol import validate
    from ..protocol.commands import StartPosition

    topic = check_topic(args.topic)
    try:
        validate.check_channel(args.channel)
    except InvalidArgument as exc:
        raise CLIError(f"bad channel name {args.channel!r}: {exc.rule}") from None
    method, done = ACTIONS[args.action]
    extra: list[Any] = []
    if args.action == "setoffset":
        if args.position is None:
            raise CLIError("channel setoffset needs a POSITION (earliest, latest, "
                           "timestamp:..., offset:... or count:...)")
        position = parse_start(args.position, "POSITION")
        extra.append(StartPosition.end() if position is None else position)
    elif args.position is not None:
        raise CLIError(f"channel {args.action} takes no POSITION (got {args.position!r})")
    lookupd, address = lookupd_or_node(args, f"channel {args.action}")

    async def call(admin: Any) -> Any:
        return await getattr(admin, method)(topic, args.channel, *extra,
                                            partition=args.partition,
                                            address=address)

    targets = await run_admin(args, lookupd, f"channel {args.action}", call)
    where = targets_text(targets)
    what = f" to {args.position}" if args.action == "setoffset" else ""
    return report(args, {"action": args.action, "topic": topic, "channel": args.channel,
                         "position": args.position, "targets": targets_json(targets)},
                  f"{done} channel {args.channel} of {topic}{what}: {where}")
