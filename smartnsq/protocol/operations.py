"""The operator's actions over HTTP: their requests and answers, checked (sans-I/O).

The weekly work on a cluster (pause a channel, empty or skip it, read one stored message,
expand a topic, drop what waits in a channel's delayed queue, take a node out of a topic's
writers) is a set of plain HTTP calls, each with its own arguments and, for
``/message/get``, its own answer. What they send is built here, validated before anything
is sent, so :mod:`smartnsq.admin` only chooses where to send it; what they answer is read
here, once, for every caller.

The real servers are the authority (youzan 0.3.7-HA.1.13.0 and classic 1.3.0, asked
directly; docs/admin.md has the table):

* youzan nsqd answers ``/message/get`` by internal id (``search_mode=id``: the partition
  is the id's, ``id >> 50``), by queue offset (``virtual_offset``) or by message count
  (``count``, 1-based; 0 reads the first); those last two need ``partition``. There is no
  search by trace id. A position past the end is ``500 INTERNAL_ERROR``.
* ``/channel/skip`` moves the channel to the end of its queue and keeps it there while
  skipped: what is published meanwhile is dropped for that channel; ``/channel/unskip``
  lets new messages through again.
* nsqlookupd's ``/topic/partition/expand`` (youzan, leader lookupd) raises a topic's
  ``partition_num``; ``/topic/tombstone`` (both kinds) hides one nsqd from a topic's
  writers (``access=w`` lookups) while consumers still read what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AdminError, InvalidArgument, ProtocolError
from . import validate
from .admin import MAX_PARTITION_NUM
from .lookup import unwrap
from .numbers import check_int, is_int

__all__ = [
    "CHANNEL_ACTIONS",
    "StoredMessage",
    "expand_params",
    "finish_params",
    "message_get_params",
    "parse_message",
    "partition_of_id",
    "tombstone_params",
    "topic_params",
]

CHANNEL_ACTIONS: Mapping[str, tuple[str, bool]] = {
    # action -> (nsqd path, whether classic nsqd has it)
    "pause": ("/channel/pause", True),
    "unpause": ("/channel/unpause", True),
    "empty": ("/channel/empty", True),
    "skip": ("/channel/skip", False),
    "unskip": ("/channel/unskip", False),
    "empty_delayed": ("/channel/emptydelayed", False),
    "requeue_delayed": ("/channel/requeuedelayed", False),
}
"""The channel actions an nsqd takes with nothing but ``topic``, ``channel`` (and youzan's
``partition``): one table, so the clients, the CLI and the dev cluster name the same set."""

_ID_PARTITION_SHIFT = 50


def partition_of_id(message_id: int) -> int:
    """The partition a youzan internal message id belongs to: its top bits
    (``(id >> 50) & 0x3FF``), as nsqd reads it for ``/message/get?search_mode=id``."""
    value = check_int("message_id", message_id, 0, validate.MAX_UINT64)
    return (value >> _ID_PARTITION_SHIFT) & validate.MAX_PARTITION


def topic_params(topic: str) -> dict[str, str]:
    """The query of classic nsqd's ``/topic/{pause,unpause}``."""
    return {"topic": validate.check_topic(topic)}


def expand_params(topic: str, partition_num: int) -> dict[str, str]:
    """The query of a youzan lookupd's ``POST /topic/partition/expand``."""
    validate.check_topic(topic)
    check_int("partition_num", partition_num, 1, MAX_PARTITION_NUM)
    return {"topic": topic, "partition_num": str(partition_num)}


def tombstone_params(topic: str, node: str, *, restore: bool = False) -> dict[str, str]:
    """The query of nsqlookupd's ``POST /topic/tombstone``: ``node`` is the nsqd's
    ``broadcast_address:http_port`` (what the lookupd compares), ``restore`` undoes it."""
    validate.check_topic(topic)
    if not isinstance(node, str) or node.count(":") < 1 or not node.rsplit(":", 1)[1].isdigit():
        raise InvalidArgument("node", "must be the nsqd's 'host:http_port'", node)
    params = {"topic": topic, "node": node}
    if restore:
        params["restore"] = "true"
    return params


def finish_params(topic: str, channel: str, message_id: int,
                  partition: int | None = None) -> dict[str, str]:
    """The query of youzan nsqd's ``POST /message/finish``: the channel's copy of one
    message, finished as if a consumer had (a message stuck in the delayed queue)."""
    validate.check_topic(topic)
    validate.check_channel(channel)
    check_int("message_id", message_id, 0, (1 << 63) - 1)  # nsqd parses an int64
    params = {"topic": topic, "channel": channel, "msgid": str(message_id)}
    if partition is not None:
        params["partition"] = str(validate.check_partition(partition))
    return params


def message_get_params(topic: str, *, message_id: int | None = None,
                       queue_offset: int | None = None, count: int | None = None,
                       partition: int | None = None, ext: bool = False,
                       delayed_channel: str | None = None) -> dict[str, str]:
    """The query of youzan nsqd's ``GET /message/get``: exactly one of ``message_id``,
    ``queue_offset`` or ``count``; the last two need ``partition`` (an id names its own).

    ``delayed_channel`` reads the copy waiting in that channel's delayed queue (by id only,
    as the server allows); ``ext`` asks for the message's ext header."""
    validate.check_topic(topic)
    given = [(name, value) for name, value in (("message_id", message_id),
                                               ("queue_offset", queue_offset),
                                               ("count", count)) if value is not None]
    if len(given) != 1:
        raise InvalidArgument("message", "give exactly one of message_id, queue_offset, "
                                         "count", [n for n, _ in given])
    name, value = given[0]
    check_int(name, value, 0, (1 << 63) - 1)
    mode = {"message_id": "id", "queue_offset": "virtual_offset", "count": "count"}[name]
    params = {"topic": topic, "search_mode": mode, "search_pos": str(value)}
    if mode == "id":
        partition = partition_of_id(value) if partition is None else partition
    elif partition is None:
        raise InvalidArgument("partition", f"a search by {name} needs the partition", None)
    params["partition"] = str(validate.check_partition(partition))
    if ext:
        params["needext"] = "true"
    if delayed_channel is not None:
        if mode != "id":
            raise InvalidArgument("delayed_channel", "the delayed queue is searched by "
                                                     "message_id only", delayed_channel)
        params["delayed_queue"] = "true"
        params["channel"] = validate.check_channel(delayed_channel)
    return params


@dataclass(frozen=True)
class StoredMessage:
    """One message as nsqd's ``/message/get`` reads it from a partition's queue.

    ``body`` is text: the server sends ``string(body)`` in JSON, so a body that is not
    UTF-8 arrives with replacement characters. ``queue_offset`` is where it starts in the
    partition's queue (what ``StartPosition.queue_offset`` takes), ``count`` its 1-based
    position (``StartPosition.message_count``). ``orig_id`` is set for a copy read from a
    channel's delayed queue (the id it had in the topic).
    """

    id: int
    trace_id: int
    body: str
    timestamp: int
    attempts: int
    queue_offset: int | None
    count: int | None
    ext: str = ""
    orig_id: int | None = None
    partition: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "trace_id": self.trace_id, "partition": self.partition,
                "queue_offset": self.queue_offset, "count": self.count,
                "timestamp": self.timestamp, "attempts": self.attempts, "ext": self.ext,
                "orig_id": self.orig_id, "body": self.body}


def _int_field(data: Mapping[str, Any], key: str, required: bool = True) -> int | None:
    value = data.get(key)
    if is_int(value):
        return value
    if required or value is not None:
        raise ProtocolError(f"nsqd /message/get {key} is not a number: {value!r:.40}")
    return None


def parse_message(status: int, body: bytes | str, *, address: str = "",
                  partition: int | None = None) -> StoredMessage:
    """A ``/message/get`` answer; :class:`AdminError` for a refusal (its message says why:
    ``INTERNAL_ERROR`` past the end, ``commit log end of file`` on an empty partition...)."""
    status, data, message = unwrap(status, body)
    if status != 200:
        raise AdminError(status, message or f"HTTP {status}", what="nsqd /message/get",
                         address=address)
    if not isinstance(data, Mapping):
        raise ProtocolError(f"nsqd /message/get answer is not an object: {data!r:.80}")
    text = data.get("body")
    if not isinstance(text, str):
        raise ProtocolError(f"nsqd /message/get body is not text: {text!r:.40}")
    ext = data.get("ext")
    orig = _int_field(data, "orig_id", required=False)
    return StoredMessage(
        id=_int_field(data, "id") or 0, trace_id=_int_field(data, "trace_id") or 0,
        body=text, timestamp=_int_field(data, "timestamp") or 0,
        attempts=_int_field(data, "attempts") or 0,
        queue_offset=_int_field(data, "offset", required=False),
        count=_int_field(data, "queue_cnt_index", required=False),
        ext=ext if isinstance(ext, str) else "", orig_id=orig or None, partition=partition)
