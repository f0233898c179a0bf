"""One publish call in progress, as one small slotted object.

Everything the attempts of one call share (what to send, the deadline) and what the last
attempt learned (where it went, how far it got, what failed) travels in a :class:`Request`
instead of a dozen positional arguments: the retry loop, the ``publish_nowait`` fast path's
answer callback and its slow-path task all read the same object.

The call's deadline is made here and nowhere else (``start + timeout``, on the loop clock);
how much of it one attempt may wait for its answer is :func:`retry.answer_deadline`'s to say.
A ``NowaitRequest`` hands its answer to an :class:`Answers` (the producer), named by protocol
so that this module does not import the producer (no import circle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, overload

from ..model.routes import Address, address_text
from ..model.sharding import ShardingKey
from .retry import ROUTE

if TYPE_CHECKING:
    import asyncio

    from .results import BatchResult, PublishResult

__all__ = ["Answers", "BatchRequest", "NowaitRequest", "Request"]


class Answers(Protocol):
    """What a ``publish_nowait`` call's first attempt is settled with (the producer's own
    ending of every attempt, and its retry decision)."""

    @overload
    def _settle(self, request: Request, answer: bytes) -> PublishResult | BatchResult: ...

    @overload
    def _settle(self, request: Request, answer: None) -> None: ...

    def _failed(self, request: NowaitRequest, error: BaseException) -> None: ...


class Request:
    """One publish, with its deadline on the loop clock (:class:`BatchRequest`: a batch).

    ``partition`` is where the call pins the message; ``target`` and ``address`` are where
    the last attempt went (``None`` until routing sets them: a failed lookup leaves them so;
    ``command`` and ``traced`` are set by encoding before anything reads them); ``attempt``
    numbers the attempt under way (1 for the first), ``stage`` says how far the last one got
    and ``error`` how it failed.
    """

    __slots__ = ("address", "attempt", "bodies", "body", "command", "deadline", "delay_ms",
                 "error", "ext", "partition", "sharding_key", "stage", "start", "target",
                 "timeout", "topic", "trace_id", "traced")

    # a single message has none of a batch's other fields (BatchRequest's slots override
    # these; ``bodies``, read by every attempt, is a slot of its own: a plain slot read)
    traces: list[int] | None = None
    exts: list[bytes] | None = None

    def __init__(self, topic: str, body: bytes, sharding_key: ShardingKey | None,
                 partition: int | None, trace_id: int | None, ext: bytes | None,
                 delay_ms: int | None, timeout: float, start: float) -> None:
        # (the fast path builds one per publish: only what is read before being set)
        self.topic = topic
        self.body = body
        self.sharding_key = sharding_key
        self.partition = partition
        self.trace_id = trace_id
        self.ext = ext
        self.delay_ms = delay_ms
        self.timeout = timeout
        self.start = start  # the loop time the call began (its latency is measured from it)
        self.deadline = start + timeout
        self.attempt = 1  # the first attempt begins with the call; retry.decide counts from it
        self.stage = ROUTE
        self.address: Address | None = None
        self.error: BaseException | None = None
        # read by the retry decision even when no attempt got as far as routing (a lookup
        # that failed): None until routing sets it
        self.target: int | None = None
        self.bodies: list[bytes] | None = None  # (a batch's: BatchRequest sets them)
        self.command: str
        self.traced: bool

    @property
    def pinned(self) -> bool:
        """The message belongs to one partition (a sharding key or an explicit partition)."""
        return self.sharding_key is not None or self.partition is not None

    @property
    def node(self) -> str:
        address = self.address
        return "" if address is None else address_text(address)


class BatchRequest(Request):
    """A batch (MPUB family): its bodies, per-message trace ids and encoded ext headers."""

    __slots__ = ("exts", "traces")

    def __init__(self, topic: str, bodies: list[bytes], traces: list[int] | None,
                 exts: list[bytes] | None, sharding_key: ShardingKey | None,
                 partition: int | None, timeout: float, start: float) -> None:
        super().__init__(topic, b"", sharding_key, partition, None, None, None, timeout, start)
        self.bodies = bodies
        self.traces = traces
        self.exts = exts


class NowaitRequest(Request):
    """A ``publish_nowait`` call: its own answer slot on the connection (``done``,
    ``set_result``, ``set_exception``), so the first attempt's answer completes the caller's
    future directly, with no second future and no done-callback per message."""

    __slots__ = ("answered", "owner", "result")

    # set by the producer right after construction (no second __init__ per publish)
    owner: Answers
    result: asyncio.Future[PublishResult]
    answered: bool

    # the connection settles the slot from inside its read, deadline check or close: these
    # never raise into it

    def done(self) -> bool:
        return self.answered

    def set_result(self, answer: bytes, /) -> None:
        self.answered = True
        if self.result.done():  # cancelled by the caller: the answer is discarded
            self.owner._settle(self, None)
            return
        try:
            self.result.set_result(self.owner._settle(self, answer))  # type: ignore[arg-type]
        except Exception as exc:  # an unreadable answer (off the wire already)
            self.owner._failed(self, exc)

    def set_exception(self, error: BaseException, /) -> None:
        self.answered = True
        self.owner._settle(self, None)
        if not self.result.done():
            self.owner._failed(self, error)
