"""Dead-lettering: parking a message past ``max_attempts`` somewhere else, then moving on.

A message its handler keeps failing (or whose compressed body cannot be decoded) would
otherwise be given up on (FINed and gone) or, on an ordered subscription, block its partition
for ever. With ``dead_letter=`` it is parked first and FINed only once the park is confirmed:
a publish to the dead-letter topic acknowledged by its nsqd, or the user's hook returning. A
park that fails leaves the message requeued (at least once: never FINed unparked), and the
next delivery tries again.

youzan's Java SDK does the same past its requeue limit (a publish of the body to the topic's
tail, then FIN; its ordered consumers never do); here the destination is any topic, the copy
says where it came from in ext headers (``smartnsq.dl.*``, :func:`origin_headers`) and the
opt-in ``dead_letter_ordered`` extends it to ordered subscriptions.

The decisions (which headers, the last error's one bounded line, whether an ordered message
may be parked) are pure functions here; :class:`DeadLetters` is the small shell that owns the
producer, started on the first park and closed with the consumer.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ..errors import InvalidArgument
from ..message import Message
from ..observability.logs import summary
from ..protocol import validate as v

if TYPE_CHECKING:
    from ..producer.producer import Producer
    from .config import ConsumerConfig

__all__ = [
    "ATTEMPTS_HEADER",
    "CHANNEL_HEADER",
    "ERROR_HEADER",
    "HEADER_PREFIX",
    "ID_HEADER",
    "MAX_ERROR_LENGTH",
    "OFFSET_HEADER",
    "PARTITION_HEADER",
    "TOPIC_HEADER",
    "TRACE_HEADER",
    "DeadLetters",
    "LastErrors",
    "applies",
    "copy_headers",
    "error_line",
    "origin_headers",
]

log = logging.getLogger("smartnsq.consumer")

HEADER_PREFIX: Final = "smartnsq.dl."
"""Every origin header starts with it: the names cannot meet a user's header or youzan's own
(``##``-prefixed) ones, and a reader tells a dead-letter copy by it."""
TOPIC_HEADER: Final = "smartnsq.dl.topic"
CHANNEL_HEADER: Final = "smartnsq.dl.channel"
PARTITION_HEADER: Final = "smartnsq.dl.partition"
OFFSET_HEADER: Final = "smartnsq.dl.offset"
ATTEMPTS_HEADER: Final = "smartnsq.dl.attempts"
ERROR_HEADER: Final = "smartnsq.dl.error"
TRACE_HEADER: Final = "smartnsq.dl.trace_id"
ID_HEADER: Final = "smartnsq.dl.id"

MAX_ERROR_LENGTH: Final = 240
"""The last error's most characters: the whole ext header is 64 KiB at most and travels with
every delivery of the copy, so a traceback has no place there (the log has it)."""

UNKNOWN_ERROR: Final = "unknown (no failure of its handler seen by this consumer)"
"""The last error of a message that came over max_attempts without this consumer seeing its
handler fail (another consumer's failures, timeouts, a restart in between)."""

_TRACE_ID: Final = v.TRACE_ID_HEADER
_HEADER_NAME: Final = re.compile(r"^[!-~]+\Z")  # validate.check_headers's rule, per name
_PUBLISH_TIMEOUT: Final = 10.0


def applies(config: ConsumerConfig, ordered: bool) -> bool:
    """Whether a message past ``max_attempts`` is dead-lettered: ``dead_letter`` is set and,
    on an ordered subscription, ``dead_letter_ordered`` allows the skip (ordered
    consumption never skips by default)."""
    return config.dead_letter is not None and (not ordered or config.dead_letter_ordered)


def error_line(error: BaseException | str | None) -> str:
    """The last error as one line of at most :data:`MAX_ERROR_LENGTH` characters."""
    if error is None:
        return UNKNOWN_ERROR
    text = summary(error) if isinstance(error, BaseException) else str(error)
    text = " ".join(text.split())  # one line, whatever the exception's text held
    if len(text) > MAX_ERROR_LENGTH:
        text = text[:MAX_ERROR_LENGTH - 3] + "..."
    return text or UNKNOWN_ERROR


def copy_headers(headers: Mapping[str, Any]) -> dict[str, str]:
    """The original message's own ext headers as they can be published again: values as
    strings (a Go producer may have sent numbers), ``##trace_id`` left out (the copy is
    published with the trace id, which puts it back), names the server would refuse
    dropped."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        if name == _TRACE_ID or not isinstance(name, str) or _HEADER_NAME.match(name) is None \
                or name.startswith(HEADER_PREFIX):
            continue
        out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


def origin_headers(msg: Message, topic: str, channel: str, error: str) -> dict[str, str]:
    """The origin of a dead-letter copy, as ext headers: where it was read (topic, channel,
    partition, queue offset), how often it was delivered, the last error, its trace id and
    id. Partition, offset and trace id only where the message has them (a classic message
    has none; the offset only on SUB_ORDERED/SUB_ADVANCED subscriptions)."""
    out = {TOPIC_HEADER: topic, CHANNEL_HEADER: channel, ATTEMPTS_HEADER: str(msg.attempts),
           ERROR_HEADER: error}
    if msg.youzan:
        out[ID_HEADER] = str(msg.internal_id)
        if msg.partition is not None:
            out[PARTITION_HEADER] = str(msg.partition)
        if msg.trace_id:
            out[TRACE_HEADER] = str(msg.trace_id)
    else:
        out[ID_HEADER] = msg.id.decode("ascii", "replace")
    if msg.queue_offset is not None:
        out[OFFSET_HEADER] = str(msg.queue_offset)
    return out


class LastErrors:
    """The last handler error of each message this consumer saw fail, by message id, until
    the message is parked: what ``smartnsq.dl.error`` says. Bounded (the oldest entries go
    first), so a flood of failures costs a fixed amount of memory."""

    __slots__ = ("_errors", "_limit")

    def __init__(self, limit: int = 4096) -> None:
        self._errors: OrderedDict[bytes, str] = OrderedDict()
        self._limit = limit

    def note(self, message_id: bytes, error: BaseException | str) -> None:
        errors = self._errors
        errors[message_id] = error_line(error)
        errors.move_to_end(message_id)
        while len(errors) > self._limit:
            errors.popitem(last=False)

    def pop(self, message_id: bytes) -> str:
        return self._errors.pop(message_id, UNKNOWN_ERROR)

    def peek(self, message_id: bytes) -> str:
        return self._errors.get(message_id, UNKNOWN_ERROR)

    def __len__(self) -> int:
        return len(self._errors)


class DeadLetters:
    """Parks messages for one consumer: on the dead-letter topic through a Producer of its
    own (started by the first park, on the consumer's lookupds or nsqd and its connection
    settings: ``make_producer``), or through the user's hook."""

    def __init__(self, topic: str, channel: str, config: ConsumerConfig,
                 make_producer: Callable[[], Producer]) -> None:
        self.topic = topic
        self.channel = channel
        self.target = config.dead_letter
        self.errors = LastErrors()
        self.parked = 0
        self._make_producer = make_producer
        self._producer: Producer | None = None
        self._closed = False
        self._closing: asyncio.Task[None] | None = None  # abandon()'s, kept from the GC

    async def park(self, msg: Message, error: str) -> str | None:
        """Park ``msg``; ``None`` once it is safely parked, else why not (the message is then
        requeued by the caller, never FINed)."""
        target = self.target
        try:
            if isinstance(target, str):
                await self._publish(target, msg, error)
            elif target is not None:
                result = target(msg)
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:
            return summary(exc)
        self.parked += 1
        return None

    async def _publish(self, topic: str, msg: Message, error: str) -> None:
        if self._closed:
            raise InvalidArgument("dead_letter", "the consumer is closed", topic)
        producer = self._producer
        if producer is None:
            producer = self._producer = self._make_producer()
        routes = await producer.routes(topic, timeout=_PUBLISH_TIMEOUT)
        origin = origin_headers(msg, self.topic, self.channel, error)
        trace_id = msg.trace_id if msg.youzan and msg.trace_id else None
        partition = None
        if routes.ordered and routes.partition_num:
            # an ordered topic takes only pinned publishes: the origin's partition, folded
            partition = (msg.partition or 0) % routes.partition_num
        if routes.youzan and routes.ext:
            await producer.publish(topic, bytes(msg.body), partition=partition,
                                   trace_id=trace_id,
                                   headers={**copy_headers(msg.headers), **origin},
                                   timeout=_PUBLISH_TIMEOUT)
            return
        # no ext header on this topic: the body goes as it is and the origin only to the log
        await producer.publish(topic, bytes(msg.body), partition=partition,
                               trace_id=trace_id if routes.youzan else None,
                               timeout=_PUBLISH_TIMEOUT)
        log.warning("%s/%s: message %s parked on %r, which carries no ext headers: its origin "
                    "is only in this line: %s", self.topic, self.channel,
                    origin[ID_HEADER], topic,
                    " ".join(f"{k[len(HEADER_PREFIX):]}={val!r}" for k, val in origin.items()))

    async def close(self, timeout: float | None = None) -> None:
        """Close the producer, if a park started one (publishes on the wire get ``timeout``
        to be acknowledged)."""
        self._closed = True
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.close(timeout)
            except Exception:  # closing must not fail the consumer's close
                log.exception("%s/%s: closing the dead-letter producer failed", self.topic,
                              self.channel)

    def abandon(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
        """The consumer is aborting: close the producer without waiting for answers."""
        if self._producer is None:
            self._closed = True
            return None
        self._closing = loop.create_task(self.close(0))
        return self._closing
