"""Which command bytes go to which node: the PUB family per the target's kind.

A youzan node takes PUB / MPUB with the partition, PUB_TRACE / MPUB_TRACE when a receipt is
wanted (a trace id, a pinned publish with ``sharded_receipts``, or the trace log on) and
PUB_EXT / MPUB_EXT with headers; a classic node takes PUB, MPUB and DPUB without partitions
(headers are for the classic dialect to refuse or drop). Every argument was validated once
when the call was made, so the unchecked encoders of ``smartnsq.protocol`` build the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from ..model.dialect import ClassicDialect
from ..model.routes import Address, address_text
from ..protocol import body_compression, commands
from ..protocol.validate import TRACE_ID_HEADER

if TYPE_CHECKING:
    from .config import BodyCompression
    from .request import Request

__all__ = ["batch_exts", "compress_body", "encode_batch", "encode_headers", "encode_one"]

# how one publish is sent (the name the connection attributes errors to)
PUB, PUB_TRACE, PUB_EXT, DPUB = "PUB", "PUB_TRACE", "PUB_EXT", "DPUB"
MPUB, MPUB_TRACE, MPUB_EXT = "MPUB", "MPUB_TRACE", "MPUB_EXT"

Encoded = tuple[bytes, str, bool]
"""(the command's bytes, its name, whether its answer is a traced receipt)"""


def encode_one(youzan: bool, node: Address, topic: str, target: int | None, body: bytes,
               trace_id: int | None, ext: bytes | None, delay_ms: int | None,
               receipt: bool, classic: ClassicDialect) -> Encoded:
    """One message for ``node`` (its address; named only in errors); ``receipt``: ask a
    youzan node for a traced answer."""
    if youzan:
        if delay_ms is not None:
            raise InvalidArgument("delay", f"{_text(node)} is a youzan nsqd, which has no deferred "
                                  "publish (DPUB)", delay_ms)
        if ext is not None:  # ##trace_id already merged in by encode_headers
            return (commands.pub_ext_unchecked(topic, body, ext, target), PUB_EXT,
                    trace_id is not None)
        if trace_id is not None or receipt:
            return (commands.pub_trace_unchecked(topic, body, trace_id or 0, target),
                    PUB_TRACE, True)
        return commands.pub_unchecked(topic, body, target), PUB, False
    if ext is not None:
        classic.classic_headers(topic, _text(node))  # raises or drops
    if delay_ms is not None:
        return commands.dpub_unchecked(topic, delay_ms, body), DPUB, False
    return commands.pub_unchecked(topic, body, None), PUB, False


def encode_batch(youzan: bool, node: Address, topic: str, target: int | None,
                 bodies: list[bytes], traces: list[int] | None, exts: list[bytes] | None,
                 receipt: bool, max_body: int, classic: ClassicDialect) -> Encoded:
    """A batch for a node (one command, one partition)."""
    if youzan:
        if exts is not None:
            return (commands.mpub_ext_unchecked(topic, zip(exts, bodies, strict=True),
                                                target, max_body), MPUB_EXT, False)
        if traces is not None or receipt:
            ids = traces if traces is not None else [0] * len(bodies)
            return (commands.mpub_trace_unchecked(topic, zip(ids, bodies, strict=True),
                                                  target, max_body), MPUB_TRACE, True)
        return commands.mpub_unchecked(topic, bodies, target, max_body), MPUB, False
    if exts is not None:
        classic.classic_headers(topic, _text(node))  # raises or drops
    return commands.mpub_unchecked(topic, bodies, None, max_body), MPUB, False


def _text(node: Address) -> str:
    return address_text(node)


def encode_headers(headers: Mapping[str, str], trace_id: int | None) -> bytes:
    """Validate and encode once (with ``##trace_id`` merged in): the bytes are both the
    size check (the ext length is 16 bits) and what goes on the wire."""
    if not isinstance(headers, Mapping):
        raise InvalidArgument("headers", "must be a mapping of str to str", headers)
    if trace_id is not None:
        given = headers.get(TRACE_ID_HEADER)
        if given is not None and given != str(trace_id):
            raise InvalidArgument("headers", f"'{TRACE_ID_HEADER}' disagrees with trace_id",
                                  given)
        headers = {**headers, TRACE_ID_HEADER: str(trace_id)}
    return commands.encode_headers(headers)


def batch_exts(headers: Mapping[str, str] | Sequence[Mapping[str, str] | None],
               traces: list[int] | None, count: int) -> list[bytes]:
    """Each message's encoded ext header: a mapping shared by the batch (or repeated in the
    list) is encoded once; per-message trace ids are spliced into those bytes."""
    if isinstance(headers, Mapping):
        mappings: list[Mapping[str, str] | None] = [headers] * count
    else:
        mappings = list(headers)
        if len(mappings) != count:
            raise InvalidArgument("headers", f"needs one mapping per message ({count})",
                                  f"<{len(mappings)} mappings>")
    encoded: dict[int, bytes] = {}
    exts: list[bytes] = []
    for i, mapping in enumerate(mappings):
        if mapping is None:
            ext = b"{}"
        else:
            cached = encoded.get(id(mapping))
            if cached is None:
                cached = encoded[id(mapping)] = encode_headers(mapping, None)
            ext = cached
        if traces is not None:
            if mapping is not None and TRACE_ID_HEADER in mapping:
                # the per-message id replaces the mapping's own: encode this one whole
                ext = commands.encode_headers({**mapping, TRACE_ID_HEADER: str(traces[i])})
            else:
                ext = commands.ext_with_trace(ext, traces[i])
        exts.append(ext)
    return exts


def compress_body(request: Request,
                  compress: BodyCompression | Mapping[str, BodyCompression]) -> None:
    """Compress the request's body in place, marked in its ext header as go-nsq marks it,
    when the settings cover its topic and size (``ProducerConfig.compress``); once per call:
    a body marked already (a retry, or the caller's own marks) is left alone. The request
    becomes a PUB_EXT (a trace id moves into ``##trace_id``)."""
    setting = compress.get(request.topic) if isinstance(compress, Mapping) else compress
    if setting is None or len(request.body) < setting.min_size:
        return
    ext = request.ext
    if ext is not None and body_compression.MARK in ext:
        return
    packed = body_compression.compress(setting.codec, request.body)
    if packed is None:
        return  # no smaller: sent as it is, unmarked
    body, marks = packed
    headers = json.loads(ext) if ext is not None else {}
    if request.trace_id is not None:
        headers[TRACE_ID_HEADER] = str(request.trace_id)
    try:
        merged = commands.encode_headers({**headers, **marks})
    except InvalidArgument:
        return  # no room left in the 16-bit ext header for the marks: sent as it is
    request.body = body
    request.ext = merged
