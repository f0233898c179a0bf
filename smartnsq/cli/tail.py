"""``smartnsq tail TOPIC``: print a topic's messages as they arrive.

By default it reads a fresh ephemeral channel (``tail_<random>#ephemeral``): the server drops
it when the command exits, and the channels other consumers read are not touched. A new
channel starts at the end of each partition, so only new messages show unless ``--from``
says where to start (SUB_ADVANCED). Ordered topics are read with SUB_ORDERED, one message in
flight per partition, so the output of each partition is in publish order.

Each message is printed, then finished (FIN): with ``--channel`` the named channel's messages
are consumed for real, like any consumer's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import random
import string
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..model.partitions import NEVER_WRITTEN
from .util import (
    CLIError,
    Deadline,
    Pump,
    admin_client,
    check_topic,
    cluster_addresses,
    deadline_of,
    dumps,
    lookup_failure,
    lookup_manager,
    parse_start,
    topic_missing,
)

if TYPE_CHECKING:
    from ..consumer.core import Consumer

__all__ = ["register", "run_tail"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("tail", "print messages of a topic as they arrive",
                description="Consume a topic on an ephemeral channel (nothing is left behind) "
                            "and print each message.")
    p.add_argument("topic", help="the topic to read")
    p.add_argument("--channel", help="consume this channel instead of a new ephemeral one "
                                     "(its messages are then finished!)")
    p.add_argument("--ordered", action="store_true",
                   help="ordered consumption (SUB_ORDERED; the default on ordered topics)")
    p.add_argument("--from", dest="start", metavar="WHERE",
                   help="where a new channel starts: earliest, latest, "
                        "timestamp:UNIX_SECONDS (or an ISO date), offset:QUEUE_OFFSET, "
                        "count:MESSAGES (default: latest)")
    p.add_argument("--partition", type=int, action="append", metavar="P",
                   help="only this partition (repeatable)")
    p.add_argument("-n", "--count", type=int, metavar="N", help="exit after N messages")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="exit after this long without a message")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per message (partition, ids, offset, headers, body)")
    p.add_argument("--show", choices=("body", "meta"), default="body",
                   help="plain output: the body only (default) or metadata and body")
    p.set_defaults(handler=run_tail)


def _ephemeral_channel() -> str:
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=8))
    return f"tail_{suffix}#ephemeral"


def _row(message: Any) -> dict[str, Any]:
    body = message.body
    row: dict[str, Any] = {
        "topic": message.topic,
        "partition": message.partition,
        "node": message.node,
        "id": binascii.hexlify(message.id).decode(),
        "internal_id": message.internal_id if message.youzan else None,
        "trace_id": message.trace_id,
        "queue_offset": message.queue_offset,
        "raw_size": message.raw_size,
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "headers": message.headers,
    }
    try:
        row["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        row["body_base64"] = base64.b64encode(body).decode()
    return row


def _meta_line(message: Any) -> str:
    when = datetime.fromtimestamp(message.timestamp / 1e9, timezone.utc)
    parts = [when.strftime("%H:%M:%S.%f")[:-3]]
    if message.partition is not None:
        parts.append(f"p{message.partition}")
    if message.queue_offset is not None:
        parts.append(f"offset {message.queue_offset}")
    if message.youzan:
        parts.append(f"id {message.internal_id}")
        if message.trace_id:
            parts.append(f"trace {message.trace_id}")
    else:
        parts.append(f"id {message.id.decode('ascii', 'replace')}")
    if message.attempts > 1:
        parts.append(f"attempts {message.attempts}")
    headers = message.headers
    if headers:
        parts.append(dumps(headers))
    body: str = message.body.decode("utf-8", "replace")
    return " ".join(parts) + " | " + body


async def run_tail(args: argparse.Namespace) -> int:
    from ..consumer.core import Consumer
    from ..errors import LookupFailed, TopicNotFound

    topic = check_topic(args.topic)
    lookupd, nsqd = cluster_addresses(args)
    start = parse_start(args.start)
    if args.count is not None and args.count < 1:
        raise CLIError("-n must be at least 1")
    channel = args.channel or _ephemeral_channel()
    from ..protocol import validate

    try:
        validate.check_channel(channel)
    except ValueError as exc:
        raise CLIError(f"bad --channel {channel!r}: {exc}") from None
    options: dict[str, Any] = {}
    deadline = deadline_of(args)  # for the lookup and the first subscription
    if lookupd:
        # one lookup first: an unknown topic or a dead lookupd is an error now, not a silent
        # consumer retrying for ever
        manager = lookup_manager(args, lookupd)
        try:
            view = await manager.view(topic, "r", refresh=True, timeout=deadline.left())
        except TopicNotFound:
            await manager.close()
            raise topic_missing(topic) from None
        except LookupFailed as exc:
            await manager.close()
            raise lookup_failure(exc, topic, lookupd, deadline.seconds) from None
        meta = view.meta
        if not view.partitions and not view.producers and not (meta and meta.known):
            await manager.close()
            raise topic_missing(topic)  # (a youzan topic whose leaders are down has its meta)
        if args.partition:
            known = set(view.partitions) | set(range(meta.partition_num if meta else 0))
            if known and not set(args.partition) <= known:
                await manager.close()
                raise CLIError(f"--partition {sorted(set(args.partition) - known)}: topic "
                               f"{topic!r} has partitions {sorted(known)}")
        options["lookup"] = manager
        if start is not None and not view.youzan:
            await manager.close()
            raise CLIError("--from needs youzan nsqd: classic NSQ channels cannot start "
                           "elsewhere than where they are")
        ordered = args.ordered or bool(view.meta and view.meta.ordered)
        if start is not None and ordered:
            # the server refuses SUB_ADVANCED on ordered subscriptions: position the channel
            # over HTTP on each partition's leader first, then SUB_ORDERED reads from there
            try:
                await _position_channel(view, channel, start, args, deadline)
            except CLIError:
                await manager.close()
                raise
            start = None
    else:
        options["nsqd"] = nsqd
        manager = None
        if start is not None and args.ordered:
            raise CLIError("--from with --ordered needs --lookupd (the channel is positioned "
                           "on each partition's leader over HTTP)")
    consumer = Consumer(topic, channel, handler=None,
                        max_in_flight=max(1, min(args.count or 200, 200)),
                        ordered=True if args.ordered else None, start=start,
                        partitions=args.partition, drain_timeout=min(1.0, args.timeout),
                        connect_timeout=deadline.seconds, request_timeout=deadline.seconds,
                        **options)
    out = args.out
    seen = 0
    try:
        async with consumer, Pump(consumer) as pump:
            started = time.monotonic()
            last_message = started
            while args.count is None or seen < args.count:
                wait = 0.5 if seen else min(0.5, deadline.left())
                if args.idle_exit is not None:
                    wait = min(wait, max(0.0, last_message + args.idle_exit
                                         - time.monotonic()))
                try:
                    message = await pump.next(wait)
                except asyncio.TimeoutError:
                    if pump.ended():  # (raises the error that stopped the consumer)
                        break
                    now = time.monotonic()
                    if args.idle_exit is not None and now - last_message >= args.idle_exit:
                        if seen == 0:
                            _check_subscribed(consumer, topic, None, bool(nsqd))
                        break
                    if seen == 0 and deadline.passed:
                        _check_subscribed(consumer, topic, deadline.seconds, bool(nsqd))
                    continue
                if message is None:
                    break
                last_message = time.monotonic()
                if args.json:
                    out.write(dumps(_row(message)) + "\n")
                elif args.show == "meta":
                    out.write(_meta_line(message) + "\n")
                else:
                    out.write(message.body.decode("utf-8", "replace") + "\n")
                out.flush()
                message.fin()
                pump.settled(message)
                seen += 1
    finally:
        if manager is not None:
            await manager.close()
    return 0


async def _position_channel(view: Any, channel: str, start: Any,
                            args: argparse.Namespace, deadline: Deadline) -> None:
    """Create ``channel`` on each partition's leader and move it to ``start`` (nsqd
    ``/channel/create`` then ``/channel/setoffset``, through ``smartnsq.admin``)."""
    from ..errors import AdminError, NSQError

    wanted = set(args.partition or view.partitions)
    async with admin_client(args, deadline=deadline) as admin:
        for pid in sorted(wanted):
            admin.timeout = deadline.left()
            partition = view.partitions.get(pid)
            if partition is None or partition.leader is None:
                raise CLIError(f"partition {pid} of {view.topic!r} has no leader now")
            address = partition.leader.http_address
            try:
                await admin.create_channel(view.topic, channel, partition=pid, address=address)
                await admin.set_offset(view.topic, channel, start, partition=pid,
                                       address=address)
            except AdminError as exc:
                if (exc.status, exc.message) != (500, NEVER_WRITTEN):
                    raise CLIError(f"positioning the channel on partition {pid}: "
                                   f"{exc}") from None
                # nothing was ever written there: the new channel is already at the
                # partition's only position (its start is its end)
            except NSQError as exc:
                raise CLIError(f"positioning the channel on partition {pid}: {exc}") from None


def _check_subscribed(consumer: Consumer, topic: str, timeout: float | None,
                      direct: bool = False) -> None:
    """Fail with the servers' reason when no subscription has worked for a while.

    ``timeout`` given: the command's deadline has passed, so a subscription still on its
    way (a node that accepted the connection and said nothing) is a failure too.
    """
    subs = consumer.stats().subscriptions
    if any(s.connected for s in subs):
        return
    errors = [s.last_error for s in subs if s.last_error]
    hint = " (hint: --nsqd takes nsqd's TCP address, port 4150 by default)" if direct else ""
    if errors:
        raise CLIError(f"cannot subscribe to {topic!r}: {errors[0]}"
                       + (hint if timeout is not None else ""))
    if timeout is not None:
        where = ", ".join(sorted(s.node if s.partition is None else f"{s.node}/{s.partition}"
                                 for s in subs)) or "any node"
        raise CLIError(f"cannot subscribe to {topic!r}: no answer from {where} within "
                       f"{timeout:g} s{hint}")
