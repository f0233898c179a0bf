"""The read path's Arrow record batches, built a column at a time from message runs.

``schema.message_batch`` converts message by message: two id properties, a ``signed64`` and
ten list appends a row, about 2.5 µs of a task's Python a message. The range reader receives
its messages as the columns of each received chunk (``protocol.frames.MessageRun``: no
object a message), so here each column is at most one pass over one list: the 16-byte ids
are joined once and read as two big-endian signed 64-bit columns (which is exactly
``signed64`` of the unsigned values; the standard library's ``array``, so no numpy), the
queue offsets, sizes and attempts go to Arrow as the lists they are, the constant columns
are repeated by Arrow, and the headers and keys are parsed only when a message of the batch
carries an ext header. Rows are the same values as ``message_batch``'s, type for type and
null for null (``tests/spark/test_columns.py`` compares the two on random messages); a run
of ids not 16 bytes each is handed to ``message_batch``.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

from ..protocol.body_compression import MARK
from ..protocol.frames import MessageFrame
from ..protocol.runs import MessageRun
from .schema import arrow_schema, message_batch, original

__all__ = ["run_batch"]

_ID_BYTES = 16
_SWAP = sys.byteorder == "little"  # ids are big-endian on the wire


def run_batch(topic: str, node: str, run: MessageRun, key_header: str = "key",
              max_decompressed: int | None = None) -> Any:
    """``message_batch(topic, node, run.frames(), key_header, max_decompressed)``, columnwise
    from the run's columns."""
    import pyarrow as pa

    n = len(run)
    if not n:
        return message_batch(topic, node, [], key_header, max_decompressed)
    ids = b"".join(run.ids)
    if len(ids) != _ID_BYTES * n:
        return message_batch(topic, node, run.frames(), key_header, max_decompressed)
    schema = arrow_schema()
    field = schema.field
    bodies = run.bodies
    if run.exts is not None and any(run.exts):
        bodies, headers, keys = _ext_columns(topic, run.frames(), key_header, max_decompressed,
                                             field("headers").type, field("key").type)
    else:
        headers = pa.MapArray.from_arrays(pa.array([0] * (n + 1), pa.int32()),
                                          pa.array([], pa.string()), pa.array([], pa.string()),
                                          type=field("headers").type)
        keys = pa.nulls(n, field("key").type)
    # read as signed: the two's complement of an unsigned id above 2**63 - 1 (signed64)
    pairs = array("q", ids)
    if _SWAP:
        pairs.byteswap()
    columns = [
        pa.repeat(pa.scalar(topic, field("topic").type), n),
        pa.repeat(pa.scalar(run.frame(0).partition, field("partition").type), n),
        _int64(pairs[0::2], n),
        _int64(pairs[1::2], n),
        pa.array(run.offsets, field("queue_offset").type),
        pa.array(run.raw_sizes, field("raw_size").type),
        pa.array(run.attempts, field("attempts").type),
        pa.array([t // 1000 for t in run.timestamps], pa.int64()).cast(field("timestamp").type),
        pa.array(bodies, field("body").type),
        headers,
        pa.repeat(pa.scalar(node, field("node").type), n),
        keys,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _int64(values: array[int], n: int) -> Any:
    """An Arrow ``int64`` column over the machine integers of ``values``, not copied."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(values)])


def _ext_columns(topic: str, messages: list[MessageFrame], key_header: str,
                 max_decompressed: int | None, headers_type: Any,
                 key_type: Any) -> tuple[list[bytes], Any, Any]:
    """The bodies (those their producers compressed decoded), headers and keys of a batch
    with ext headers: one message at a time, in order, as ``message_batch`` goes, so the
    first message that cannot be decoded or parsed is the one named in the error."""
    import pyarrow as pa

    out: list[bytes] = []
    headers: list[list[tuple[str, str]]] = []
    keys: list[str | None] = []
    for m in messages:
        if max_decompressed is not None and m.ext and MARK in m.ext:
            m = original(topic, m, max_decompressed)
        out.append(m.body)
        if m.ext:
            parsed = m.headers
            headers.append(list(parsed.items()))
            keys.append(parsed.get(key_header))
        else:
            headers.append([])
            keys.append(None)
    return out, pa.array(headers, headers_type), pa.array(keys, key_type)
