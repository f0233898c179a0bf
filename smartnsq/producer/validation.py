"""The arguments of a publish call, checked once before anything is sent.

Every escape raises :class:`~smartnsq.errors.InvalidArgument` naming the argument: a server
would close the connection on most bad input, failing every other publish in flight on it,
and an ``OverflowError`` or ``UnicodeEncodeError`` from deep inside says nothing about which
argument was wrong. What only the topic's routes can tell is checked in ``routing``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidArgument
from ..model.sharding import ShardingKey, check_key
from ..protocol import validate as v
from ..protocol.numbers import check_number
from .encoding import batch_exts, encode_headers

__all__ = ["MAX_DELAY_MS", "Checks", "batch_items", "delay_ms", "timeout_seconds"]

MAX_DELAY_MS = 3_600_000 * 24 * 365  # far beyond any server's max_req_timeout

_MAX_VALID_TOPICS = 10_000  # names remembered as valid (bounded: topics may be unbounded)
_FLAT = frozenset((bytes, bytearray))  # batch bodies sent as they are


def timeout_seconds(timeout: object, default: float) -> float:
    """A call's ``timeout``: a positive, finite number of seconds (``None``: ``default``).

    Infinity is refused: the deadline bounds every retry, and without one a call against a
    partition that never comes back would retry for ever.
    """
    if timeout is None:
        return default
    return check_number("timeout", timeout, low_open=True)


def batch_items(bodies: object) -> list[Any]:
    """A batch's ``bodies`` as a list: any iterable of bodies, but not one body (bytes, str)
    nor ``None``, which would otherwise fail deep inside with a ``TypeError``."""
    if isinstance(bodies, bytes | bytearray | memoryview | str) \
            or not isinstance(bodies, Iterable):
        raise InvalidArgument("bodies", "must be an iterable of message bodies (a list of "
                              "bytes)", bodies)
    return list(bodies)


def delay_ms(delay: object) -> int:
    """A DPUB ``delay`` in seconds as the wire's milliseconds."""
    ms = round(check_number("delay", delay, 0) * 1000)
    if ms > MAX_DELAY_MS:
        raise InvalidArgument("delay", "too long", delay)
    return ms


def _batch_body(body: object, max_msg: int, i: int) -> bytes:
    """A batch's body as sent: a ``bytearray`` or ``memoryview`` is kept as a flat byte view,
    not copied (the batch's one command copies it once, when it is encoded), so it must not
    change until the call returns; anything else as ``check_body`` makes it."""
    if isinstance(body, bytearray | memoryview):
        view = memoryview(body)
        if view.c_contiguous:
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")  # (lengths on the wire are in bytes)
            if 0 < len(view) <= max_msg:
                return view  # type: ignore[return-value]  # (a bytes-like the encoder joins)
    return v.check_body(body, max_msg, f"bodies[{i}]")  # type: ignore[arg-type]


def _bodies(items: list[Any], max_msg: int) -> int:
    """Each body of a batch checked (a memoryview flattened in place, anything else made
    bytes): the batch's size on the wire."""
    total = 4
    for i, body in enumerate(items):
        view: Any = body
        kind: type = view.__class__
        if kind is bytes or kind is bytearray:  # (a bytearray is kept: no copy)
            if not 0 < len(body) <= max_msg:
                v.check_body(body, max_msg, f"bodies[{i}]")  # raises, naming it
        elif kind is not memoryview or view.itemsize != 1 or view.ndim != 1 \
                or not view.c_contiguous or not 0 < len(view) <= max_msg:
            items[i] = body = _batch_body(body, max_msg, i)
        total += 4 + len(body)
    return total


class Checks:
    """A producer's argument checks, with its limits (and the topic names already seen)."""

    __slots__ = ("key_check", "max_body", "max_msg", "valid_topics")

    def __init__(self, max_msg: int, max_body: int, key_check: bool) -> None:
        self.max_msg = max_msg
        self.max_body = max_body
        # built-in schemes know their key types; a user function judges its own keys
        self.key_check = key_check
        self.valid_topics: set[str] = set()

    def topic(self, topic: str) -> None:
        if topic not in self.valid_topics:
            v.check_topic(topic)
            if len(self.valid_topics) < _MAX_VALID_TOPICS:
                self.valid_topics.add(topic)

    def target(self, sharding_key: ShardingKey | None, partition: int | None) -> None:
        if partition is not None:
            v.check_partition(partition)
            if sharding_key is not None:
                raise InvalidArgument("partition", "give sharding_key or partition, not both",
                                      partition)
        elif sharding_key is not None and self.key_check:
            check_key(sharding_key)

    def one(self, topic: str, body: bytes, sharding_key: ShardingKey | None,
            partition: int | None, trace_id: int | None,
            headers: Mapping[str, str] | None, delay: float | None,
            ) -> tuple[bytes, bytes | None, int | None]:
        """One publish's arguments: the body as sent, the encoded ext header (or None) and
        the delay in ms (or None)."""
        if topic not in self.valid_topics:
            self.topic(topic)
        if body.__class__ is not bytes or not 0 < len(body) <= self.max_msg:
            body = v.check_body(body, self.max_msg)
        if trace_id is not None:
            v.check_trace_id(trace_id)
        ext = None if headers is None else encode_headers(headers, trace_id)
        delay = None if delay is None else delay_ms(delay)
        if partition is not None:
            self.target(sharding_key, partition)
        elif sharding_key is not None:
            # check_key's common keys, inline (once a publish); test_producer_keys holds the
            # two to the same answers
            kind = sharding_key.__class__
            if not (kind is bytes or kind is int
                    or (kind is str and sharding_key.isascii())):  # type: ignore[union-attr]
                self.target(sharding_key, partition)
        return body, ext, delay

    def batch(self, topic: str, bodies: Iterable[bytes], sharding_key: ShardingKey | None,
              partition: int | None, trace_id: int | Sequence[int] | None,
              headers: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None,
              ) -> tuple[list[bytes], list[int] | None, list[bytes] | None]:
        """A batch's arguments: the bodies, per-message trace ids and encoded ext headers."""
        self.topic(topic)
        items = batch_items(bodies)
        if not items:
            raise InvalidArgument("bodies", "a batch needs at least one message", items)
        max_msg = self.max_msg
        total = 0
        if set(map(type, items)) <= _FLAT:
            # the common batch, all bytes (or bytearrays, kept: no copy), checked by C
            # iterators: no Python-level step per message
            sizes = list(map(len, items))
            if min(sizes) > 0 and max(sizes) <= max_msg:
                total = 4 + 4 * len(sizes) + sum(sizes)
        if not total:
            total = _bodies(items, max_msg)  # one by one: raises naming the bad one
        traces: list[int] | None = None
        if trace_id is not None:
            if isinstance(trace_id, int):
                traces = [v.check_trace_id(trace_id)] * len(items)
            else:
                traces = [v.check_trace_id(t) for t in trace_id]
                if len(traces) != len(items):
                    raise InvalidArgument("trace_id", f"needs one id per message ({len(items)})",
                                          f"<{len(traces)} ids>")
        exts = None if headers is None else batch_exts(headers, traces, len(items))
        if traces is not None:
            total += 8 * len(items)
        if total > self.max_body:
            raise InvalidArgument("bodies", f"batch size {total} exceeds max_body_size "
                                  f"{self.max_body}", f"<{len(items)} messages>")
        self.target(sharding_key, partition)
        return items, traces, exts
