"""The row schema of ``spark.read(Stream).format("nsq")`` and how a message becomes a row.

Ids are Spark ``long`` (signed 64-bit). Internal ids and queue offsets stay far below 2**63;
trace ids are unsigned 64-bit on the wire, so one above 2**63 - 1 appears as its two's
complement (negative), exactly as Java clients hold it; ``trace_id & 0xFFFFFFFFFFFFFFFF``
gives the unsigned value back.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ..errors import ProtocolError
from ..protocol.body_compression import MARK, unpack
from ..protocol.frames import MessageFrame

__all__ = ["READ_SCHEMA", "READ_SCHEMA_DDL", "message_row", "original", "read_schema"]

READ_SCHEMA_DDL = (
    "topic STRING, partition INT, internal_id BIGINT, trace_id BIGINT, queue_offset BIGINT, "
    "raw_size INT, attempts INT, timestamp TIMESTAMP, body BINARY, "
    "headers MAP<STRING, STRING>, node STRING, key STRING"
)

READ_COLUMNS = ("topic", "partition", "internal_id", "trace_id", "queue_offset", "raw_size",
                "attempts", "timestamp", "body", "headers", "node", "key")

_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)
_SIGN = 1 << 63
_WRAP = 1 << 64


def read_schema() -> Any:
    """The schema as a ``pyspark.sql.types.StructType`` (imports pyspark)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType([
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("internal_id", LongType(), True),
        StructField("trace_id", LongType(), True),
        StructField("queue_offset", LongType(), True),
        StructField("raw_size", IntegerType(), True),
        StructField("attempts", IntegerType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("body", BinaryType(), True),
        StructField("headers", MapType(StringType(), StringType(), True), True),
        StructField("node", StringType(), True),
        StructField("key", StringType(), True),
    ])


READ_SCHEMA = READ_SCHEMA_DDL


def signed64(value: int) -> int:
    """An unsigned 64-bit value as Spark's signed ``long``."""
    return value - _WRAP if value >= _SIGN else value


def timestamp_of(nanoseconds: int) -> _dt.datetime:
    """A message timestamp (ns since the epoch) as an aware UTC datetime (µs precision)."""
    return _EPOCH + _dt.timedelta(microseconds=nanoseconds // 1000)


def original(topic: str, message: MessageFrame, limit: int) -> MessageFrame:
    """``message`` as its producer published it: a body compressed by the publishing client
    (youzan/go-nsq's ``nsq.client.compress`` mark) decoded, and the two marks gone from the
    headers; ``message`` itself when it carries no mark.

    The server stores such a body as it came, so without this a row would hold compressed
    bytes that every job downstream takes for the message. A mark that cannot be honoured
    (unknown codec, corrupt data, a size over ``limit``, a codec package missing) raises
    ``ProtocolError`` naming the message's place: a task that fails is visible and can be
    fixed and re-run, a wrong or missing row is neither.
    """
    ext = message.ext
    if message.ext_version != 4 or not ext or MARK not in ext:
        return message
    try:
        decoded = unpack(ext, message.body, limit)
    except ProtocolError as exc:
        offset = message.queue_offset
        where = (f"{topic}/{message.partition} at queue offset {offset}" if offset is not None
                 else f"{topic}/{message.partition} message {message.id.hex()}")
        raise ProtocolError(
            f"{where}: the body its producer compressed cannot be decoded ({exc}); fix: "
            "install the codec's package or raise maxDecompressedSize, as the reason says; "
            "or read from the next message (its queue_offset + raw_size)") from exc
    if decoded is None:
        return message
    body, stripped = decoded
    return MessageFrame(message.timestamp, message.attempts, message.id, body,
                        message.ext_version, stripped, message.queue_offset, message.raw_size,
                        message.youzan)


def message_row(topic: str, node: str, message: MessageFrame,
                key_header: str = "key", max_decompressed: int | None = None) -> tuple[Any, ...]:
    """One row of ``READ_SCHEMA`` (columns in ``READ_COLUMNS`` order).

    ``key`` is the ext header ``key_header`` (the sink's ``keyHeader`` stores the sharding key
    there): NSQ keeps no key of its own, and Kafka users look for a ``key`` column.
    ``max_decompressed``: decode a body its producer compressed (:func:`original`).
    """
    if max_decompressed is not None:
        message = original(topic, message, max_decompressed)
    trace = message.trace_id
    return (
        topic,
        message.partition,
        signed64(message.internal_id) if message.youzan else None,
        None if trace is None else signed64(trace),
        message.queue_offset,
        message.raw_size,
        message.attempts,
        timestamp_of(message.timestamp),
        message.body,
        message.headers if message.ext else {},
        node,
        message.headers.get(key_header) if message.ext else None,
    )


_arrow_schema: Any = None


def arrow_schema() -> Any:
    """``READ_SCHEMA`` as the Arrow schema Spark expects from a reader (exact types/nullity)."""
    global _arrow_schema
    if _arrow_schema is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        try:
            _arrow_schema = to_arrow_schema(read_schema(), timezone="UTC")
        except TypeError:  # pragma: no cover - pyspark without the timezone argument
            _arrow_schema = to_arrow_schema(read_schema())
    return _arrow_schema


def message_batch(topic: str, node: str, messages: list[MessageFrame],
                  key_header: str = "key", max_decompressed: int | None = None) -> Any:
    """Messages of one partition as one Arrow ``RecordBatch`` of ``READ_SCHEMA``.

    Readers hand Spark record batches rather than tuples: Spark would otherwise convert every
    value of every row in Python. ``max_decompressed``: decode the bodies their producers
    compressed (:func:`original`), at most that many bytes each; ``None`` leaves them as
    they are (the ack source's Consumer has decoded them already).
    """
    import pyarrow as pa

    schema = arrow_schema()
    n = len(messages)
    internal: list[int | None] = []
    traces: list[int | None] = []
    offsets: list[int | None] = []
    sizes: list[int | None] = []
    attempts: list[int] = []
    stamps: list[int] = []
    bodies: list[bytes] = []
    headers: list[list[tuple[str, str]]] = []
    keys: list[str | None] = []
    for m in messages:
        if max_decompressed is not None and m.ext and MARK in m.ext:  # rare: one search
            m = original(topic, m, max_decompressed)
        if m.youzan:
            internal.append(signed64(m.internal_id))
            traces.append(signed64(m.trace_id or 0))
        else:
            internal.append(None)
            traces.append(None)
        offsets.append(m.queue_offset)
        sizes.append(m.raw_size)
        attempts.append(m.attempts)
        stamps.append(m.timestamp // 1000)
        bodies.append(m.body)
        if m.ext:
            headers.append(list(m.headers.items()))
            keys.append(m.headers.get(key_header))
        else:
            headers.append([])
            keys.append(None)
    partition = messages[0].partition if messages else None
    columns = [
        pa.array([topic] * n, schema.field("topic").type),
        pa.array([partition] * n, schema.field("partition").type),
        pa.array(internal, schema.field("internal_id").type),
        pa.array(traces, schema.field("trace_id").type),
        pa.array(offsets, schema.field("queue_offset").type),
        pa.array(sizes, schema.field("raw_size").type),
        pa.array(attempts, schema.field("attempts").type),
        pa.array(stamps, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(bodies, schema.field("body").type),
        pa.array(headers, schema.field("headers").type),
        pa.array([node] * n, schema.field("node").type),
        pa.array(keys, schema.field("key").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
