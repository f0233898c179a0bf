"""``smartnsq message get|finish TOPIC``: one stored message, and a forced finish.

``get`` reads one message of a youzan topic from its partition's leader (nsqd's
``/message/get``) by internal id (``--id``: the id names its partition), queue offset
(``--offset``) or 1-based count (``--count``), the last two with ``--partition``. The server
has no search by trace id: the id and offset of a traced message are in its publish receipt
(``smartnsq pub --trace-id``) and in ``smartnsq tail --show meta``. ``finish`` finishes a
channel's copy of one message as a consumer would (one stuck in flight or delayed).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .util import CLIError, check_topic, dumps, lookupd_or_node, run_admin

__all__ = ["register", "run_message"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("message", "read one stored message, or finish one (youzan)",
                description="get: one stored message of a youzan topic by --id, --offset or "
                            "--count (the last two with --partition). finish: finish "
                            "CHANNEL's copy of message --id.")
    p.add_argument("action", choices=("get", "finish"), help="what to do")
    p.add_argument("topic", help="the topic")
    p.add_argument("channel", nargs="?", help="finish: the channel")
    p.add_argument("--id", type=int, dest="message_id", metavar="ID",
                   help="the internal message id (as tail --json's internal_id)")
    p.add_argument("--offset", type=int, metavar="N", help="get: the queue offset")
    p.add_argument("--count", type=int, metavar="N",
                   help="get: the N-th message of the partition (1 is the first)")
    p.add_argument("--partition", type=int, metavar="P",
                   help="the partition (needed with --offset and --count)")
    p.add_argument("--delayed-channel", metavar="NAME",
                   help="get: the copy in this channel's delayed queue (by --id)")
    p.add_argument("--ext", action="store_true", help="get: with the ext header")
    p.add_argument("--nsqd-http", metavar="HOST:PORT",
                   help="ask this nsqd instead of the partition's leader")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_message)


async def run_message(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgument

    topic = check_topic(args.topic)
    lookupd, address = lookupd_or_node(args, f"message {args.action}")
    try:
        if args.action == "finish":
            return await _finish(args, topic, lookupd, address)
        return await _get(args, topic, lookupd, address)
    except InvalidArgument as exc:
        raise CLIError(_usage(exc)) from None


def _usage(exc: Any) -> str:
    names = {"message": "--id, --offset or --count", "message_id": "--id",
             "queue_offset": "--offset", "count": "--count", "partition": "--partition",
             "delayed_channel": "--delayed-channel"}
    return f"{names.get(exc.field, exc.field)}: {exc.rule}"


async def _get(args: argparse.Namespace, topic: str, lookupd: list[str],
               address: str | None) -> int:
    if args.channel is not None:
        raise CLIError(f"message get takes no CHANNEL (got {args.channel!r}; for a delayed "
                       f"copy: --delayed-channel)")
    message = await run_admin(args, lookupd, "message get", lambda admin: admin.get_message(
        topic, message_id=args.message_id, queue_offset=args.offset, count=args.count,
        partition=args.partition, ext=args.ext, delayed_channel=args.delayed_channel,
        address=address))
    if args.json:
        args.out.write(dumps({"topic": topic, **message.as_dict()}) + "\n")
        return 0
    when = datetime.fromtimestamp(message.timestamp / 1e9, timezone.utc)
    meta = (f"{topic} p{message.partition} id {message.id} offset {message.queue_offset} "
            f"count {message.count} trace {message.trace_id} attempts {message.attempts} "
            f"at {when.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}")
    if message.ext:
        meta += f" ext {message.ext}"
    args.out.write(f"{meta}\n{message.body}\n")
    return 0


async def _finish(args: argparse.Namespace, topic: str, lookupd: list[str],
                  address: str | None) -> int:
    if args.channel is None or args.message_id is None:
        raise CLIError("message finish needs CHANNEL and --id ID")
    if args.offset is not None or args.count is not None:
        raise CLIError("message finish takes --id only")
    partition, node = await run_admin(
        args, lookupd, "message finish", lambda admin: admin.finish_message(
            topic, args.channel, args.message_id, partition=args.partition, address=address))
    row = {"action": "finish", "topic": topic, "channel": args.channel,
           "id": args.message_id, "partition": partition, "node": node}
    if args.json:
        args.out.write(dumps(row) + "\n")
    else:
        args.out.write(f"finished message {args.message_id} of {topic} on channel "
                       f"{args.channel}: p{partition} on {node}\n")
    return 0
