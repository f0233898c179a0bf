"""``smartnsq dead-letter replay TOPIC --channel CH``: put dead-lettered messages back.

A consumer with ``dead_letter="orders_dead"`` parks messages past ``max_attempts`` there,
each copy naming its origin in the ``smartnsq.dl.*`` ext headers. Once the cause is fixed,
this reads the dead-letter topic on a channel and publishes each message to its origin topic
(``smartnsq.dl.topic``, or ``--to``), with its own headers and trace id but without the origin
headers, and FINs it only after that publish was acknowledged: a message whose publish fails
is requeued on the dead-letter topic, never lost. It stops after ``-n`` messages, after
``--idle-exit`` seconds without one, or at the first failure.

A dead-letter topic without ext headers (classic, or a youzan topic created without
``ext``) holds no origin: give ``--to TOPIC``. A message with no origin and no ``--to`` is
left on the dead-letter topic (requeued) and makes the command fail.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from .util import (
    CLIError,
    Pump,
    check_topic,
    cluster_addresses,
    deadline_of,
    dumps,
    lookup_failure,
    lookup_manager,
    topic_missing,
)

__all__ = ["register", "run_dead_letter"]

_IDLE_EXIT = 3.0
"""Seconds without a message after which a run without ``-n`` ends: a dead-letter topic is
drained, not followed."""


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("dead-letter", "re-publish dead-lettered messages to their origin topic",
                description="Read a dead-letter topic (Consumer(dead_letter=...)) on a "
                            "channel and publish each message to the topic named in its "
                            "smartnsq.dl.topic header (or --to), FINing it only once that "
                            "publish is acknowledged.")
    p.add_argument("action", choices=("replay",), help="replay: re-publish to the origin")
    p.add_argument("topic", help="the dead-letter topic")
    p.add_argument("--channel", required=True,
                   help="the channel of the dead-letter topic to read (its messages are "
                        "FINed once re-published)")
    p.add_argument("--to", metavar="TOPIC",
                   help="publish here instead of each message's origin (needed for a "
                        "dead-letter topic without ext headers)")
    p.add_argument("-n", "--count", type=int, metavar="N",
                   help="stop after N messages (default: until none comes for a while)")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help=f"stop after this long without a message (default {_IDLE_EXIT:g})")
    p.add_argument("--partition", type=int, action="append", metavar="P",
                   help="only this partition of the dead-letter topic (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per message, then one for the totals")
    p.set_defaults(handler=run_dead_letter)


def destination(message: Any, to: str | None) -> tuple[str | None, int | None,
                                                        dict[str, str], int | None]:
    """Where a dead-lettered message goes back, from its headers: ``(topic or None,
    partition or None, the headers to publish, trace id or None)``. The origin headers are
    not published again: the message goes back as it was first published."""
    from ..consumer.deadletter import HEADER_PREFIX, PARTITION_HEADER, TOPIC_HEADER, TRACE_HEADER
    from ..protocol import validate

    headers = message.headers
    topic = to or headers.get(TOPIC_HEADER)
    partition_text = headers.get(PARTITION_HEADER)
    partition = validate.ascii_int(partition_text) if partition_text else None
    trace_text = headers.get(TRACE_HEADER)
    trace_id = message.trace_id if message.youzan and message.trace_id else None
    if trace_id is None and trace_text:
        trace_id = validate.ascii_int(trace_text) or None
    own = {name: value for name, value in headers.items()
           if not name.startswith(HEADER_PREFIX) and name != validate.TRACE_ID_HEADER}
    return topic, partition, own, trace_id


def _line(row: dict[str, Any]) -> str:
    """One re-published message for people: the origin's id when the copy names it."""
    what = (f"message {row['origin_id']} (dead-letter id {row['id']})" if row["origin_id"]
            else f"message {row['id']}")
    where = f" (partition {row['partition']})" if row["partition"] is not None else ""
    return f"re-published {what} to {row['to']}{where}"


def _label(message: Any) -> str:
    return str(message.internal_id) if message.youzan else message.id.decode("ascii", "replace")


async def _republish(producer: Any, message: Any, to: str | None,
                     deadline: Any) -> dict[str, Any]:
    """Publish one dead-lettered message to its origin; the row describing it."""
    from ..protocol import validate

    topic, partition, headers, trace_id = destination(message, to)
    from ..consumer.deadletter import ID_HEADER

    row: dict[str, Any] = {"id": _label(message), "from_partition": message.partition,
                           "origin_id": message.headers.get(ID_HEADER), "to": topic,
                           "partition": None, "attempts": message.attempts}
    if topic is None:
        raise CLIError(f"message {row['id']} names no origin topic (no smartnsq.dl.topic "
                       f"header): give --to TOPIC")
    try:
        validate.check_topic(topic)
    except ValueError as exc:
        raise CLIError(f"message {row['id']}: bad origin topic {topic!r}: {exc}") from None
    routes = await producer.routes(topic, timeout=deadline.left())
    if partition is not None and not (routes.partition_num and partition < routes.partition_num):
        partition = None  # the origin has fewer partitions now: let the routing choose
    if partition is None and routes.ordered and routes.partition_num:
        partition = 0  # an ordered topic takes pinned publishes only
    result = await producer.publish(
        topic, bytes(message.body), partition=partition, trace_id=trace_id,
        headers=headers if headers and routes.ext else None, timeout=deadline.left())
    row["partition"] = result.partition if result.partition is not None else partition
    return row


async def run_dead_letter(args: argparse.Namespace) -> int:
    from ..consumer.core import Consumer
    from ..errors import LookupFailed, NSQError, TopicNotFound
    from ..producer.producer import Producer
    from ..protocol import validate

    topic = check_topic(args.topic)
    if args.to is not None:
        check_topic(args.to)
    try:
        validate.check_channel(args.channel)
    except ValueError as exc:
        raise CLIError(f"bad --channel {args.channel!r}: {exc}") from None
    if args.count is not None and args.count < 1:
        raise CLIError("-n must be at least 1")
    idle_exit = _IDLE_EXIT if args.idle_exit is None else args.idle_exit
    if idle_exit <= 0:
        raise CLIError("--idle-exit must be more than 0 seconds")
    lookupd, nsqd = cluster_addresses(args)
    deadline = deadline_of(args)
    options: dict[str, Any] = {}
    manager = None
    if lookupd:
        manager = lookup_manager(args, lookupd)
        try:
            view = await manager.view(topic, "r", refresh=True, timeout=deadline.left())
        except TopicNotFound:
            await manager.close()
            raise topic_missing(topic) from None
        except LookupFailed as exc:
            await manager.close()
            raise lookup_failure(exc, topic, lookupd, deadline.seconds) from None
        if not view.partitions and not view.producers and not (view.meta and view.meta.known):
            await manager.close()
            raise topic_missing(topic)
        options["lookup"] = manager
    else:
        options["nsqd"] = nsqd
    timeout = deadline.seconds
    producer = Producer(lookupd=lookupd or None, nsqd=nsqd or None, timeout=timeout,
                        connect_timeout=min(timeout, 5.0))
    # decompress=False: a body parked because it could not be decoded goes back as stored,
    # with its marks, for the origin's consumers to decode once they can
    consumer = Consumer(topic, args.channel, handler=None, max_in_flight=1, decompress=False,
                        partitions=args.partition, drain_timeout=min(1.0, timeout),
                        connect_timeout=timeout, request_timeout=timeout, **options)
    done: list[dict[str, Any]] = []
    out = args.out
    try:
        async with consumer, Pump(consumer) as pump:
            last = time.monotonic()
            while args.count is None or len(done) < args.count:
                wait = max(0.0, min(0.5, last + idle_exit - time.monotonic()))
                try:
                    message = await pump.next(wait)
                except asyncio.TimeoutError:
                    if pump.ended() or time.monotonic() - last >= idle_exit:
                        break
                    continue
                if message is None:
                    break
                try:
                    row = await _republish(producer, message, args.to, deadline)
                except (NSQError, OSError, asyncio.TimeoutError) as exc:
                    raise CLIError(f"re-publishing message {_label(message)} failed "
                                   f"({exc}); it stays on {topic}") from None
                message.fin()  # (the publish was acknowledged)
                pump.settled(message)
                done.append(row)
                last = time.monotonic()
                out.write((dumps(row) if args.json else _line(row)) + "\n")
                out.flush()
    finally:
        await producer.close()
        if manager is not None:
            await manager.close()
    targets = sorted({row["to"] for row in done})
    if args.json:
        out.write(dumps({"republished": len(done), "from": topic, "channel": args.channel,
                         "to": targets}) + "\n")
    else:
        out.write(f"re-published {len(done)} message{'' if len(done) == 1 else 's'} from "
                  f"{topic} (channel {args.channel})"
                  + (f" to {', '.join(targets)}" if targets else "") + "\n")
    return 0
