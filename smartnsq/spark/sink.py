"""``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``: batched, partition-routed.

Each Spark task publishes its rows through one ``smartnsq.sync.Producer`` cached per Python
worker process (Spark reuses its Python workers, so connections and routes survive from task
to task and batch to batch). Rows are grouped by (topic, NSQ partition) and sent as MPUB
batches of up to ``batchSize`` messages with ``publish_many``:

* with ``shardingKeyColumn`` the partition is ``router(key, partition_num)`` with the
  producer's own router (murmur3 or java), so rows land exactly where
  ``Producer.publish(..., sharding_key=key)`` would put them; rows of one key keep their
  order (one batch in flight per partition, sent in row order);
* with ``partitionColumn`` the row names its partition;
* otherwise each batch goes to the next partition round-robin (``publish_many`` without a
  partition), as the Producer does.

Batches of different partitions are in flight together (up to ``maxInFlight``). A task
returns only once every batch was acknowledged; any failure (the server's error after the
producer's retries, a timeout) fails the task with that error, and Spark retries it.

Columns named as in Spark's Kafka sink (``topic``, ``key``, ``value``, ``partition``,
``headers``) are taken without an option when no option names that part of the row
(``resolve_columns``), so a DataFrame shaped for Kafka publishes as it is; nulls in them mean
what they mean to Kafka (no key, no partition).

Delivery is at least once: a retried task publishes its rows again. With
``idempotencyKey=true`` each message carries an ext header (``idempotencyHeader``, default
``spark_idempotency_key``) of ``<query id>:<batch id>:<spark partition>:<row number>``, the same
on every attempt of the task, which consumers can use to drop duplicates (ext topics only).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

try:  # Arrow writers skip Spark's per-row Row objects: several times faster
    from pyspark.sql.datasource import DataSourceArrowWriter
except ImportError:  # pragma: no cover - older pyspark
    DataSourceArrowWriter = None  # type: ignore[assignment,misc]
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - pyspark 4.0
    DataSourceStreamArrowWriter = None  # type: ignore[assignment,misc]

from .. import sync
from ..errors import InvalidArgument
from ..model.partitions import partition_for
from ..model.routes import TopicRoutes
from ..model.sharding import make_router
from ..producer.results import BatchResult
from ..protocol import commands
from .options import SinkOptions

__all__ = [
    "NSQCommitMessage",
    "NSQStreamWriter",
    "NSQWriter",
    "cached_producer",
    "make_stream_writer",
    "make_writer",
    "resolve_columns",
]

log = logging.getLogger("smartnsq.spark")

# MPUB framing per message beyond its body: the 4-byte length (+8 traced, + ext header)
_MSG_OVERHEAD = 4
_TRACE_OVERHEAD = 8

_producers: dict[tuple[object, ...], sync.Producer] = {}
_producers_pid = os.getpid()
_producers_lock = threading.Lock()


def cached_producer(options: SinkOptions) -> sync.Producer:
    """The worker process's producer for these options (created on first use)."""
    global _producers_pid
    key = options.producer_key()
    with _producers_lock:
        if _producers_pid != os.getpid():  # a forked worker: the parent's are unusable
            _producers.clear()
            _producers_pid = os.getpid()
        producer = _producers.get(key)
        if producer is not None and not producer.closed:
            return producer
        cluster = options.cluster
        kwargs: dict[str, Any] = {"timeout": options.timeout, "sharding": options.sharding,
                                  **cluster.connection.kwargs()}
        if cluster.nsqd:
            producer = sync.Producer(nsqd=list(cluster.nsqd), **kwargs)
        else:
            producer = sync.Producer(lookupd=list(cluster.lookupd), **kwargs)
        _producers[key] = producer
        return producer


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task published: rows, MPUB batches and rows per (topic, partition)."""

    rows: int = 0
    batches: int = 0
    partitions: dict[str, int] = field(default_factory=dict)
    spark_partition: int = -1


def _task_ids() -> tuple[int, str | None, str | None]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return -1, None, None
    return (ctx.partitionId(), ctx.getLocalProperty("sql.streaming.queryId"),
            ctx.getLocalProperty("streaming.sql.batchId"))


class _Batch:
    __slots__ = ("bodies", "headers", "size", "traces")

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.traces: list[int] = []
        self.headers: list[Mapping[str, str] | None] = []
        self.size = 4


class _Publisher:
    """Groups one task's rows per (topic, partition) and keeps their batches in flight."""

    def __init__(self, producer: sync.Producer, options: SinkOptions, schema: Any,
                 idempotency_prefix: str | None) -> None:
        self._producer = producer
        self._options = options
        self._loop_thread = producer.loop_thread
        self._async = producer.async_producer
        self._router = make_router(producer.config.sharding)
        self._max_body = producer.config.max_body_size
        self._prefix = idempotency_prefix
        names = list(schema.fieldNames())

        def index(column: str | None, option: str) -> int | None:
            if column is None:
                return None
            if column not in names:
                raise InvalidArgument(option, f"no column {column!r} in the DataFrame "
                                      f"(columns: {', '.join(names)})", column)
            return names.index(column)

        self._body = index(options.body_column, "bodyColumn")
        self._topic_col = index(options.topic_column, "topicColumn")
        self._key = index(options.sharding_key_column, "shardingKeyColumn")
        self._part = index(options.partition_column, "partitionColumn")
        self._trace = index(options.trace_id_column, "traceIdColumn")
        self._headers_col = index(options.headers_column, "headersColumn")
        self._key_header = options.key_header
        self._with_headers = (self._headers_col is not None or idempotency_prefix is not None
                              or self._key_header is not None)
        # Kafka's columns taken by name: a null key or partition is "none", as in Kafka, and
        # rows without headers need no ext header (the topic may not be an ext topic)
        self._loose_key = "key" in options.picked
        self._loose_part = "partition" in options.picked
        self._bare_headers = options.picked >= {"headers"} and idempotency_prefix is None \
            and self._key_header is None
        self._routes: dict[str, TopicRoutes] = {}
        self._open: dict[tuple[str, int | None], _Batch] = {}
        # one future per (topic, partition) in flight, oldest first
        self._inflight: dict[tuple[str, int | None], concurrent.futures.Future[BatchResult]] = {}
        self.rows = 0
        self.batches = 0
        self.counts: dict[str, int] = {}

    def _routes_of(self, topic: str) -> TopicRoutes:
        """The Producer's routes of ``topic``, asked once per task: every row of one key in
        this task then goes to one partition, even if the partition count changes meanwhile
        (the leaders are the Producer's business, not this memo's)."""
        routes = self._routes.get(topic)
        if routes is None:
            routes = self._routes[topic] = self._producer.routes(topic)
        return routes

    def add(self, row: Any) -> None:
        topic = self._options.topic if self._topic_col is None else row[self._topic_col]
        if not topic:
            raise InvalidArgument("topicColumn", "a row has no topic", topic)
        body = row[self._body]
        if body is None:
            raise InvalidArgument("bodyColumn", f"row {self.rows} has a null body", None)
        if isinstance(body, str):
            body = body.encode()
        elif not isinstance(body, bytes):
            body = bytes(body)
        target: int | None = None
        key: Any = None
        pinned = row[self._part] if self._part is not None else None
        if self._key is not None and (pinned is None or not self._loose_part):
            key = row[self._key]
            if key is None and not self._loose_key:  # a picked key's null: no key, as Kafka
                raise InvalidArgument("shardingKeyColumn", f"row {self.rows} has a null "
                                      "sharding key", None)
            if isinstance(key, bytearray):
                key = bytes(key)
        routes = self._routes_of(topic) if key is not None else None
        if routes is not None and routes.partition_num <= 0 and self._loose_key:
            routes = None  # a picked key on a topic without partitions has nothing to route
        if routes is not None:
            if routes.partition_num <= 0:
                # rows are batched per partition, so a key needs one (refused here, the
                # column named, rather than by partition_for below)
                raise InvalidArgument("shardingKeyColumn", f"topic {topic!r} has no partition "
                                      "count in lookup (classic or standalone nodes); "
                                      "sharding needs one", key)
            # the Producer's own choice (smartnsq.model.partitions), so rows land where
            # publish(sharding_key=key) would put them
            target = partition_for(routes, self._router, sharding_key=key)
        if target is None and self._part is not None and key is None:
            if pinned is None and not self._loose_part:
                raise InvalidArgument("partitionColumn", f"row {self.rows} has a null "
                                      "partition", None)
            target = None if pinned is None else int(pinned)
        size = _MSG_OVERHEAD + len(body)
        trace_id = None
        if self._trace is not None:
            trace_id = row[self._trace]
            if trace_id is not None:
                trace_id = int(trace_id) & 0xFFFFFFFFFFFFFFFF  # a negative long is unsigned
            size += _TRACE_OVERHEAD
        headers: dict[str, str] | None = None
        if self._with_headers:
            headers = {} if self._headers_col is None else _header_map(row[self._headers_col])
            if self._prefix is not None:
                headers[self._options.idempotency_header] = f"{self._prefix}:{self.rows}"
            if self._key_header is not None and key is not None:
                headers[self._key_header] = key.hex() if isinstance(key, bytes) else str(key)
            size += 2 + len(commands.encode_headers(headers))
        slot = (topic, target)
        batch = self._open.get(slot)
        if batch is not None and (len(batch.bodies) >= self._options.batch_size
                                  or batch.size + size > self._max_body):
            self._flush(slot)
            batch = None
        if batch is None:
            batch = self._open[slot] = _Batch()
        batch.bodies.append(body)
        batch.size += size
        if self._trace is not None:
            batch.traces.append(trace_id or 0)
        if self._with_headers:
            batch.headers.append(headers)
        self.rows += 1

    def _flush(self, slot: tuple[str, int | None]) -> None:
        batch = self._open.pop(slot, None)
        if batch is None or not batch.bodies:
            return
        previous = self._inflight.pop(slot, None)
        if previous is not None:
            self._settle(previous)  # keep order: one batch in flight per partition
        while len(self._inflight) >= self._options.max_in_flight:
            oldest = next(iter(self._inflight))
            self._settle(self._inflight.pop(oldest))
        topic, partition = slot
        with_headers = self._with_headers and not (self._bare_headers
                                                   and not any(batch.headers))
        coro = self._async.publish_many(
            topic, batch.bodies, partition=partition,
            trace_id=batch.traces if self._trace is not None else None,
            headers=batch.headers if with_headers else None,
            timeout=self._options.timeout)
        self._inflight[slot] = self._loop_thread.submit(coro)
        self.batches += 1

    def _settle(self, future: concurrent.futures.Future[BatchResult]) -> None:
        result = future.result(self._options.timeout + 10)
        name = f"{result.topic}/{'-' if result.partition is None else result.partition}"
        self.counts[name] = self.counts.get(name, 0) + result.count

    def finish(self) -> None:
        """Send what is buffered and wait until every batch is acknowledged."""
        try:
            for slot in list(self._open):
                self._flush(slot)
            while self._inflight:
                oldest = next(iter(self._inflight))
                self._settle(self._inflight.pop(oldest))
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Give up: drop what is buffered, cancel what is in flight (the task is failing)."""
        self._open.clear()
        for future in self._inflight.values():
            future.cancel()
        self._inflight.clear()


def _header_map(raw: Any) -> dict[str, str]:
    """A row's headers: a ``map<string,string>`` (pairs or a dict), or Kafka's
    ``array<struct<key:string,value:binary>>`` (values decoded as UTF-8: ext headers are
    text)."""
    if not raw:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    out: dict[str, str] = {}
    for item in raw:
        if isinstance(item, Mapping) or hasattr(item, "asDict"):
            entry = item.asDict() if hasattr(item, "asDict") else item
            name, value = entry["key"], entry["value"]
        else:
            name, value = item
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode()
        out[str(name)] = "" if value is None else str(value)
    return out


def _write(options: SinkOptions, schema: Any, rows: Iterator[Any],
           idempotency_id: str | None) -> NSQCommitMessage:
    partition_id, query_id, batch_id = _task_ids()
    prefix = None
    if options.idempotency:
        prefix = (f"{options.idempotency_id or query_id or idempotency_id}:"
                  f"{batch_id if batch_id is not None else 0}:{partition_id}")
    publisher = _Publisher(cached_producer(options), options, schema, prefix)
    try:
        for row in rows:
            publisher.add(row)
        publisher.finish()
    except BaseException:
        publisher.cancel()  # the task fails: Spark re-runs it (at least once)
        raise
    return NSQCommitMessage(publisher.rows, publisher.batches, publisher.counts, partition_id)


def _arrow_rows(batches: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
    """Rows of Arrow record batches as tuples (columns converted once per batch, in C)."""
    for batch in batches:
        yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


def _summary(messages: list[NSQCommitMessage | None]) -> tuple[int, int]:
    rows = sum(m.rows for m in messages if isinstance(m, NSQCommitMessage))
    batches = sum(m.batches for m in messages if isinstance(m, NSQCommitMessage))
    return rows, batches


class NSQWriter(DataSourceWriter):
    """Batch writes; see the module docstring."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self._options = options
        self._schema = schema
        # made on the driver, so every task attempt of this write shares it
        self._write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return _write(self._options, self._schema, iterator, self._write_id)

    def commit(self, messages: list[NSQCommitMessage | None]) -> None:  # type: ignore[override]
        rows, batches = _summary(messages)
        log.info("nsq write %s committed: %d rows in %d batches", self._write_id, rows, batches)

    def abort(self, messages: list[NSQCommitMessage | None]) -> None:  # type: ignore[override]
        rows, _ = _summary(messages)
        log.warning("nsq write %s aborted after publishing %d rows (already published rows "
                    "stay published: at-least-once)", self._write_id, rows)


class NSQStreamWriter(DataSourceStreamWriter):
    """Micro-batch writes; see the module docstring."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self._options = options
        self._schema = schema
        self._write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return _write(self._options, self._schema, iterator, self._write_id)

    def commit(self, messages: list[NSQCommitMessage | None],  # type: ignore[override]
               batchId: int) -> None:
        rows, batches = _summary(messages)
        log.info("nsq stream batch %d committed: %d rows in %d MPUB batches", batchId, rows,
                 batches)

    def abort(self, messages: list[NSQCommitMessage | None],  # type: ignore[override]
              batchId: int) -> None:
        rows, _ = _summary(messages)
        log.warning("nsq stream batch %d aborted after publishing %d rows (they stay "
                    "published; the batch is re-run: at-least-once)", batchId, rows)


if DataSourceArrowWriter is not None:
    class NSQArrowWriter(NSQWriter, DataSourceArrowWriter):
        """``NSQWriter`` fed Arrow record batches instead of Rows."""

        def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
            return _write(self._options, self._schema, _arrow_rows(iterator), self._write_id)

if DataSourceStreamArrowWriter is not None:
    class NSQStreamArrowWriter(NSQStreamWriter, DataSourceStreamArrowWriter):
        """``NSQStreamWriter`` fed Arrow record batches instead of Rows."""

        def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
            return _write(self._options, self._schema, _arrow_rows(iterator), self._write_id)


_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")
# what each column option accepts: Spark type names, and how to say it in an error
_COLUMN_TYPES: dict[str, tuple[tuple[str, ...], str]] = {
    "bodyColumn": (("BinaryType", "StringType"), "binary or string (cast it, e.g. "
                   "to_json(struct(...)) or cast(... AS STRING))"),
    "topicColumn": (("StringType",), "string"),
    "shardingKeyColumn": (("StringType", "BinaryType", *_INTEGRAL),
                          "string, binary or an integer type"),
    "partitionColumn": (_INTEGRAL, "an integer type"),
    "traceIdColumn": (_INTEGRAL, "an integer type (bigint)"),
    "headersColumn": (("MapType", "ArrayType"), "map<string,string> (or Kafka's "
                      "array<struct<key:string,value:binary>>)"),
}


def resolve_columns(options: SinkOptions, schema: Any) -> SinkOptions:
    """The options with Kafka's column names filled in where no option names that part.

    Spark's Kafka sink finds its columns by name (``value``, ``key``, ``topic``,
    ``partition``, ``headers``); a user coming from it has a DataFrame shaped that way. An
    option always wins; ``body`` stays the body column when both ``body`` and ``value`` are
    there. As in Kafka, the ``topic`` option wins over a ``topic`` column."""
    names = set(schema.fieldNames())
    picked: set[str] = set()

    def pick(name: str) -> str | None:
        if name in names:
            picked.add(name)
            return name
        return None

    body = options.body_column
    if body == "body" and "body" not in names and "value" in names:
        body = "value"
        picked.add("value")
    if body not in names:
        raise InvalidArgument("bodyColumn", f"no column {body!r} (or Kafka's 'value') in the "
                              f"DataFrame (columns: {', '.join(schema.fieldNames())})", body)
    topic_column = options.topic_column
    if options.topic is None and topic_column is None:
        topic_column = pick("topic")
        if topic_column is None:
            raise InvalidArgument("topic", "give the option topic or topicColumn, or a column "
                                  "named topic (as Kafka's sink takes it)", None)
    key, part = options.sharding_key_column, options.partition_column
    if key is None and part is None:  # an option for one of them: the other is not picked
        key, part = pick("key"), pick("partition")
    headers = options.headers_column or pick("headers")
    if not picked:
        return options
    return replace(options, body_column=body, topic_column=topic_column,
                   sharding_key_column=key, partition_column=part, headers_column=headers,
                   picked=frozenset(picked))


def check_columns(options: SinkOptions, schema: Any) -> None:
    """Refuse, on the driver, a column option naming a missing column or one of a type the
    sink cannot publish: an int body would otherwise become NUL bytes, a struct a TypeError
    in every task."""
    fields = {f.name: f.dataType for f in schema.fields}
    given = {"bodyColumn": options.body_column, "topicColumn": options.topic_column,
             "shardingKeyColumn": options.sharding_key_column,
             "partitionColumn": options.partition_column,
             "traceIdColumn": options.trace_id_column,
             "headersColumn": options.headers_column}
    for option, column in given.items():
        if column is None:
            continue
        if column not in fields:
            raise InvalidArgument(option, f"no column {column!r} in the DataFrame (columns: "
                                  f"{', '.join(fields)})", column)
        kind = fields[column]
        allowed, wording = _COLUMN_TYPES[option]
        ok = type(kind).__name__ in allowed
        if ok and option == "headersColumn":
            ok = _header_type(kind)
        if not ok:
            raise InvalidArgument(option, f"column {column!r} is {kind.simpleString()}; it "
                                  f"must be {wording}", column)


def _header_type(kind: Any) -> bool:
    """``map<string,string>``, or Kafka's ``array<struct<key:string,value:binary|string>>``."""
    if type(kind).__name__ == "MapType":
        return (type(kind.keyType).__name__ == "StringType"
                and type(kind.valueType).__name__ == "StringType")
    element = kind.elementType
    if type(element).__name__ != "StructType":
        return False
    fields = {f.name: type(f.dataType).__name__ for f in element.fields}
    return (fields.get("key") == "StringType"
            and fields.get("value") in ("BinaryType", "StringType") and len(fields) == 2)


def make_writer(options: SinkOptions, schema: Any) -> DataSourceWriter:
    """The fastest batch writer this pyspark offers."""
    options = resolve_columns(options, schema)
    check_columns(options, schema)
    if DataSourceArrowWriter is not None:
        return NSQArrowWriter(options, schema)
    return NSQWriter(options, schema)  # pragma: no cover


def make_stream_writer(options: SinkOptions, schema: Any) -> DataSourceStreamWriter:
    """The fastest streaming writer this pyspark offers."""
    options = resolve_columns(options, schema)
    check_columns(options, schema)
    if DataSourceStreamArrowWriter is not None:
        return NSQStreamArrowWriter(options, schema)
    return NSQStreamWriter(options, schema)  # pragma: no cover
