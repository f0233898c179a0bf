"""The row schema of ``spark.read(Stream).format("nsq")`` and how a message becomes a row.

Ids are Spark ``long`` (signed 64-bit). Internal ids and queue offsets stay far below 2**63;
trace ids are unsigned 64-bit on the wire, so one above 2**63 - 1 appears as its two's
complement (negative), exactly as Java clients hold it; ``trace_id & 0xFFFFFFFFFFFFFFFF``
gives the unsigned value back.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ..protocol.frames import Message

__all__ = ["READ_SCHEMA", "READ_SCHEMA_DDL", "message_row", "read_schema"]

READ_SCHEMA_DDL = (
    "topic STRING, partition INT, internal_id BIGINT, trace_id BIGINT, queue_offset BIGINT, "
    "raw_size INT, attempts INT, timestamp TIMESTAMP, body BINARY, "
    "headers MAP<STRING, STRING>, node STRING"
)

READ_COLUMNS = ("topic", "partition", "internal_id", "trace_id", "queue_offset", "raw_size",
                "attempts", "timestamp", "body", "headers", "node")

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
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), True),
        StructField("internal_id", LongType(), True),
        StructField("trace_id", LongType(), True),
        StructField("queue_offset", LongType(), True),
        StructField("raw_size", IntegerType(), True),
        StructField("attempts", IntegerType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("body", BinaryType(), False),
        StructField("headers", MapType(StringType(), StringType(), True), True),
        StructField("node", StringType(), True),
    ])


READ_SCHEMA = READ_SCHEMA_DDL


def signed64(value: int) -> int:
    """An unsigned 64-bit value as Spark's signed ``long``."""
    return value - _WRAP if value >= _SIGN else value


def timestamp_of(nanoseconds: int) -> _dt.datetime:
    """A message timestamp (ns since the epoch) as an aware UTC datetime (µs precision)."""
    return _EPOCH + _dt.timedelta(microseconds=nanoseconds // 1000)


def message_row(topic: str, node: str, message: Message) -> tuple[Any, ...]:
    """One row of ``READ_SCHEMA`` (columns in ``READ_COLUMNS`` order)."""
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
    )
