"""What an acknowledged publish tells: ``PublishResult`` and ``BatchResult``, and the one
place they are made (:class:`Results`).

Slotted records rather than frozen dataclasses: one is handed out per acknowledged publish, on
the hot path, and a frozen dataclass's ``__init__`` costs several times more. The commonest
answer, a plain ``OK`` to a first attempt, tells nothing but where the message went, so
:class:`Results` hands out one shared record per (topic, partition, node) for it instead of
building one per publish; records are read-only by convention, which makes sharing safe.

This module reads a publish in progress through the :class:`Sent` protocol only, so it imports
nothing of the producer's (``request`` imports it, not the other way round: no import circle).
"""

from __future__ import annotations

from typing import Protocol

from ..model.routes import address_text
from ..observability import trace as tracing
from ..protocol.frames import partition_of
from ..protocol.responses import PublishReceipt, publish_response_fields

__all__ = ["BatchResult", "PublishResult", "Results", "Sent"]

Address = tuple[str, int]

#: plain results kept (one per topic, partition and node: bounded, since topics may be many)
_MAX_PLAIN = 4096


class _Record:
    """Slotted, read-only-by-convention result record (cheaper than a frozen dataclass)."""

    __slots__: tuple[str, ...] = ()
    FIELDS: tuple[str, ...] = ()  # in their constructor order

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Record)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"


class PublishResult(_Record):
    """What one acknowledged publish tells.

    ``partition`` is where it was written (``None``: no partition was named, as on classic
    nodes, and no receipt told). ``node`` is ``"host:port"`` of the nsqd that acknowledged it.
    The receipt fields (``internal_id``, ``trace_id``, ``queue_offset``, ``raw_size``) come
    from youzan's traced answer and are ``None`` after a plain ``OK``: traced publishes always
    have them, sharded and explicit-partition ones by default (``sharded_receipts``).
    ``attempts`` counts the sends (more than 1 after a retry). Results are read-only: the
    record of a plain ``OK`` is shared by every publish that went to the same partition and
    node on its first attempt.
    """

    FIELDS = ("topic", "partition", "node", "internal_id", "trace_id", "queue_offset",
              "raw_size", "attempts")
    __slots__ = ("attempts", "internal_id", "node", "partition", "queue_offset", "raw_size",
                 "topic", "trace_id")

    def __init__(self, topic: str, partition: int | None, node: str,
                 internal_id: int | None = None, trace_id: int | None = None,
                 queue_offset: int | None = None, raw_size: int | None = None,
                 attempts: int = 1) -> None:
        self.topic = topic
        self.partition = partition
        self.node = node
        self.internal_id = internal_id
        self.trace_id = trace_id
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.attempts = attempts

    @property
    def receipt(self) -> PublishReceipt | None:
        """The server's receipt, when it sent one."""
        if self.internal_id is None:
            return None
        return PublishReceipt(self.internal_id, self.trace_id or 0, self.queue_offset or 0,
                              self.raw_size or 0)


class BatchResult(_Record):
    """What an acknowledged batch (MPUB family) tells.

    With a receipt (MPUB_TRACE), ``internal_id`` and ``queue_offset`` are the first message's
    and ``raw_size`` covers the whole batch; the other ids follow consecutively.
    """

    FIELDS = ("topic", "partition", "node", "count", "internal_id", "queue_offset",
              "raw_size", "attempts")
    __slots__ = ("attempts", "count", "internal_id", "node", "partition", "queue_offset",
                 "raw_size", "topic")

    def __init__(self, topic: str, partition: int | None, node: str, count: int,
                 internal_id: int | None = None, queue_offset: int | None = None,
                 raw_size: int | None = None, attempts: int = 1) -> None:
        self.topic = topic
        self.partition = partition
        self.node = node
        self.count = count
        self.internal_id = internal_id
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.attempts = attempts


class Sent(Protocol):
    """What a result is made from: the acknowledged publish (``request.Request`` is one)."""

    topic: str
    target: int | None
    address: Address | None
    attempt: int
    traced: bool
    trace_id: int | None
    bodies: list[bytes] | None
    traces: list[int] | None


class Results:
    """Makes every result of one producer (its only constructor of ``PublishResult`` and
    ``BatchResult``): the shared plain records, the node names, the receipts, the trace lines.
    """

    __slots__ = ("_names", "_plain")

    def __init__(self) -> None:
        self._names: dict[Address, str] = {}  # "host:port" of each address, built once
        self._plain: dict[tuple[str, int | None, Address], PublishResult] = {}

    def node(self, address: Address) -> str:
        """``"host:port"`` (``"unix:PATH"``) of a node, built once per address."""
        name = self._names.get(address)
        if name is None:
            if len(self._names) >= _MAX_PLAIN:
                self._names.clear()
            name = self._names[address] = address_text(address)
        return name

    def of(self, request: Sent, answer: bytes, mode: bool | None) -> PublishResult | BatchResult:
        """The result of an acknowledged request; logs its trace line when ``mode`` (the
        topic's trace setting) asks for one."""
        address = request.address
        assert address is not None  # (an acknowledged request went somewhere)
        if not request.traced and request.bodies is None and request.trace_id is None \
                and mode is not True and request.attempt == 1:
            # a plain OK to a first attempt, nothing to log: the common case, one shared record
            key = (request.topic, request.target, address)
            result = self._plain.get(key)
            if result is None:
                if len(self._plain) >= _MAX_PLAIN:
                    self._plain.clear()
                result = self._plain[key] = PublishResult(
                    request.topic, request.target, self.node(address), None, None, None, None,
                    1)
            return result
        return _result(request, self.node(address), answer, mode)


def _result(request: Sent, node: str, answer: bytes,
            mode: bool | None) -> PublishResult | BatchResult:
    topic = request.topic
    partition = request.target
    trace_id = request.trace_id
    if not request.traced and request.bodies is None and trace_id is None and mode is not True:
        # plain OK after a retry: its own record (``attempts`` differs)
        return PublishResult(topic, partition, node, None, None, None, None, request.attempt)
    fields = publish_response_fields(answer) if request.traced or answer != b"OK" else None
    if fields is None:
        internal_id = queue_offset = raw_size = None
    else:
        internal_id, trace_id, queue_offset, raw_size = fields
        if partition is None:
            partition = partition_of(internal_id)
    if request.bodies is not None:
        count = len(request.bodies)
        if mode or (mode is None and request.traces is not None):
            _trace_line("MPUB", topic, partition, node, fields, None, count)
        return BatchResult(topic, partition, node, count, internal_id, queue_offset,
                           raw_size, request.attempt)
    if mode or (mode is None and request.trace_id is not None):
        _trace_line("PUB", topic, partition, node, fields, request.trace_id, 1)
    return PublishResult(topic, partition, node, internal_id, trace_id, queue_offset,
                         raw_size, request.attempt)


def _trace_line(kind: str, topic: str, partition: int | None, node: str,
                fields: tuple[int, int, int, int] | None, trace_id: int | None,
                count: int) -> None:
    if not tracing.enabled():
        return
    if fields is None:
        tracing.line(kind, "no receipt", topic=topic, partition=partition, node=node,
                     trace_id=trace_id, count=count)
        return
    internal_id, traced_id, queue_offset, raw_size = fields
    tracing.line(kind, topic=topic, partition=partition, node=node, internal_id=internal_id,
                 trace_id=traced_id if trace_id is None else trace_id,
                 queue_offset=queue_offset, raw_size=raw_size, count=count)
