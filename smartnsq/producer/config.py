"""``ProducerConfig``: how a Producer routes, retries and traces, one description per field.

Each field's metadata is its only description: the text, unit and range shown in the generated
reference (``smartnsq.config.describe``) and the :class:`~smartnsq.config.Rule` that
``__post_init__`` applies, whose text *is* the range shown. A range cannot be documented one
way and checked another. The rules are the ones every config uses (``smartnsq.config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from ..config import (
    ConnectionConfig,
    Rule,
    check_fields,
    doc,
    duck,
    flag,
    instance,
    integer,
    refuse_unknown,
    seconds,
)
from ..errors import InvalidArgument
from ..model.dialect import ChooserFactory, ClassicDialect, RouteChooser
from ..model.sharding import ShardingScheme, make_router
from ..model.sharding_schemes import DEFAULT_SCHEME, SCHEMES
from ..protocol import validate as v
from ..protocol.body_compression import BodyCodec

__all__ = ["BodyCompression", "ProducerConfig", "with_options"]


def spec(text: str, *, unit: str = "", rule: Rule, concept: str = "") -> dict[str, Any]:
    """A field's one description: its reference row, whose range is the rule checking it."""
    return doc(text, unit=unit, check=rule, concept=concept)


def _sharding(name: str, value: Any, config: Any) -> None:
    make_router(value)  # raises InvalidArgument("sharding", ...)


_SIZE = Rule("1..2**31-1", integer(1, 2**31 - 1).check)


@dataclass(frozen=True)
class BodyCompression:
    """Compress large bodies before publishing them, marked as youzan/go-nsq marks them
    (``TopicsForCompress``), so that go-nsq's consumers and smartnsq's read the original.

    Only single publishes to youzan ext topics are compressed (the mark travels in the ext
    header; a batch, a classic or a non-ext topic is sent as it is), and only bodies of
    ``min_size`` bytes or more; a body compression does not shrink goes as it is. Consumers
    that do not decode the marks (pynsq, go-nsq before v1.6.0-HA, a Java SDK) hand their
    handlers the compressed bytes: turn it on for a topic once its readers are known."""

    codec: BodyCodec = field(default="gzip", metadata=doc(
        "'gzip' (the standard library), 'snappy' (python-snappy) or 'lz4' (the lz4 extra), "
        "as go-nsq numbers them 1, 2, 3.", check=Rule(
            " or ".join(repr(c) for c in get_args(BodyCodec)),
            lambda name, value, obj: _codec(name, value))))
    min_size: int = field(default=20480, metadata=doc(
        "Smallest body compressed (go-nsq's MessageSizeForCompress).", unit="bytes",
        check=integer(1, 2**31 - 1)))

    def __post_init__(self) -> None:
        check_fields(self)


def _codec(name: str, value: Any) -> None:
    if value not in get_args(BodyCodec):
        raise InvalidArgument(name, "must be " + ", ".join(map(repr, get_args(BodyCodec))),
                              value)


def _compress(name: str, value: Any, config: Any) -> None:
    if value is None or isinstance(value, BodyCompression):
        return
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(c, BodyCompression) for k, c in value.items()):
        raise InvalidArgument(name, "must be a BodyCompression (every ext topic), a mapping "
                              "of topic to BodyCompression, or None", value)


@dataclass(frozen=True)
class ProducerConfig:
    """How a Producer routes, retries and traces (each field has a documented default)."""

    timeout: float = field(default=10.0, metadata=spec(
        "Default deadline of a whole publish call (start, lookup, connect and every retry "
        "included); past it the call raises Timeout.", unit="s", rule=seconds()))
    sharding: ShardingScheme = field(default=DEFAULT_SCHEME, metadata=spec(
        "How sharding keys map to partitions: 'murmur3' (the Go client), 'java' (the Java "
        "client) or a callable (key, partition_num) -> partition.",
        rule=Rule(", ".join(repr(name) for name in SCHEMES) + " or callable", _sharding)))
    max_msg_size: int = field(default=v.DEFAULT_MAX_MSG_SIZE, metadata=spec(
        "Largest message body sent (the server's max_msg_size); larger bodies are refused "
        "before sending.", unit="bytes", rule=_SIZE))
    max_body_size: int = field(default=v.DEFAULT_MAX_BODY_SIZE, metadata=spec(
        "Largest MPUB batch (the server's max_body_size).", unit="bytes", rule=_SIZE))
    retry_delay: float = field(default=0.05, metadata=spec(
        "First back-off between attempts of one publish; doubles per attempt, jittered.",
        unit="s", rule=seconds(), concept="attempt"))
    retry_delay_max: float = field(default=1.0, metadata=spec(
        "Longest back-off between attempts (a route change ends a back-off early).",
        unit="s", rule=seconds("retry_delay", low_open=False), concept="attempt"))
    reconnect_delay: float = field(default=0.05, metadata=spec(
        "First wait before dialling a node again after its connect failed; doubles per "
        "consecutive failure, jittered.", unit="s", rule=seconds(), concept="redial"))
    reconnect_delay_max: float = field(default=2.0, metadata=spec(
        "Longest wait before dialling a failed node again.", unit="s",
        rule=seconds("reconnect_delay", low_open=False), concept="redial"))
    drain_timeout: float = field(default=5.0, metadata=spec(
        "How long close() waits for publishes already sent to be acknowledged before it "
        "fails them (the server may have accepted them: a caller retrying a failed one "
        "could publish it twice). 0 fails them at once.", unit="s",
        rule=seconds(low_open=False, finite=False)))
    idle_timeout: float | None = field(default=300.0, metadata=spec(
        "Close a node's connection after this long unused; None keeps connections open.",
        unit="s", rule=seconds(optional=True)))
    sharded_receipts: bool = field(default=True, metadata=spec(
        "Send sharded and explicit-partition publishes to youzan nodes as PUB_TRACE / "
        "MPUB_TRACE (trace id 0 unless given) so their results carry the internal id and "
        "queue offset; False sends plain PUB / MPUB.", rule=flag()))
    linger: float = field(default=0.0, metadata=spec(
        "Batch concurrent plain publishes (no headers, trace id, delay or receipt) to one "
        "partition: each waits up to this long for others, and those gathered go as one "
        "MPUB, each call keeping its own result or error (Kafka's linger.ms). A publish "
        "whose timeout is under 20 lingers is sent at once. 0: off, every publish is sent "
        "on its own at once.", unit="s",
        rule=seconds(low_open=False)))
    trace: bool | None = field(default=None, metadata=spec(
        "Client-side trace log (logger smartnsq.trace): True traces every publish (sent "
        "traced, one line each), None only those given a trace id, False none; "
        "set_trace() changes it at run time, per topic too.", rule=flag(optional=True)))
    span_one_in: int = field(default=1, metadata=spec(
        "OpenTelemetry (tracer_provider given, or smartnsq.observability.otel.instrument()): "
        "a publish span for the first call, then for one call in N, chosen before the SDK is "
        "asked "
        "(its sampler decides among those); a call made while a recording span is current "
        "is always traced. 1: every call.", rule=integer(1)))
    compress: BodyCompression | Mapping[str, BodyCompression] | None = field(
        default=None, metadata=spec(
            "Compress large bodies as youzan/go-nsq does (ext topics, single publishes): a "
            "BodyCompression for every ext topic, or one per topic name; None: never.",
            rule=Rule("BodyCompression, {topic: BodyCompression} or None", _compress)))
    connection: ConnectionConfig = field(default_factory=ConnectionConfig, metadata=spec(
        "How connections to nsqd are opened (timeouts, TLS, compression, auth).",
        rule=instance(ConnectionConfig, "a ConnectionConfig", optional=False)))
    classic: ClassicDialect | None = field(default=None, metadata=spec(
        "What youzan-only features become on classic nsqd: a "
        "smartnsq.compat.ClassicPolicy (None: its defaults, i.e. sharding keys placed on "
        "nodes by rendezvous hash, trace ids logged but not sent, headers refused).",
        rule=duck("ClassicPolicy or None")))
    migration: RouteChooser | ChooserFactory | None = field(default=None, metadata=spec(
        "Where publishes to a topic found on both a youzan and a classic cluster go: a "
        "smartnsq.compat.MigrationPolicy (prefer youzan, prefer classic, or a percentage "
        "to youzan). None: youzan.", rule=duck("MigrationPolicy, MigrationChooser or None")))

    def __post_init__(self) -> None:
        check_fields(self)


def with_options(config: ProducerConfig, given: Mapping[str, Any],
                 constructor: Callable[..., Any] | None = None) -> ProducerConfig:
    """``config`` with a Producer's keyword options applied (``ConnectionConfig`` fields go to
    ``config.connection``), checked again; an unknown keyword is refused with the nearest
    option or parameter of ``constructor`` suggested."""
    if not given:
        return config
    producer_fields = ProducerConfig.__dataclass_fields__
    connection_fields = ConnectionConfig.__dataclass_fields__
    refuse_unknown("Producer", given, producer_fields.keys() | connection_fields.keys(),
                   constructor)
    options = dict(given)
    conn_opts = {k: options.pop(k) for k in list(options)
                 if k in connection_fields and k not in producer_fields}
    if conn_opts:
        options["connection"] = dataclasses.replace(config.connection, **conn_opts)
    return dataclasses.replace(config, **options)
