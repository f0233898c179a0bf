"""``ProducerConfig``: how a Producer routes, retries and traces, one description per field.

Each field's metadata is its only description: the text, unit and range shown in the generated
reference (``smartnsq.config.describe``) and the :class:`Rule` that ``__post_init__`` applies,
whose text *is* the range shown. A range cannot be documented one way and checked another.

(The rules have the shape of the consumer config's rules; when both configs live side by side
the two sets are one.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import ConnectionConfig, doc
from ..dialect import ChooserFactory, ClassicDialect, RouteChooser
from ..errors import InvalidArgument
from ..protocol import validate as v
from ..sharding import ShardingScheme, make_router

__all__ = ["ProducerConfig", "Rule", "check_fields", "spec", "with_options"]


@dataclass(frozen=True)
class Rule:
    """What a field accepts: ``text`` for the reference, ``check(name, value, config)`` raising
    ``InvalidArgument`` naming the field (``config`` for bounds that are other fields)."""

    text: str
    check: Callable[[str, Any, Any], None]


def spec(text: str, *, unit: str = "", rule: Rule | None = None) -> dict[str, Any]:
    """A field's one description: its reference row (the range is the rule's text) and the
    rule checking it."""
    return {**doc(text, unit=unit, range=rule.text if rule is not None else ""), "check": rule}


def check_fields(config: Any) -> None:
    """Apply every field's rule (from ``__post_init__``)."""
    for f in dataclasses.fields(config):
        rule = f.metadata.get("check")
        if rule is not None:
            rule.check(f.name, getattr(config, f.name), config)


def seconds(low: float | str = 0, *, strict: bool = True, optional: bool = False,
            finite: bool = True) -> Rule:
    """A number of seconds above ``low`` (a number, or another field's name)."""
    text = f"{'>' if strict else '>='} {low if isinstance(low, str) else f'{low:g}'}"
    shown = text + (" or None" if optional else "")

    def check(name: str, value: Any, config: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or math.isnan(value) or (finite and math.isinf(value)):
            raise InvalidArgument(name, f"must be a {'finite ' if finite else ''}number of "
                                  "seconds", value)
        floor = float(getattr(config, low)) if isinstance(low, str) else low
        if value < floor or (strict and value == floor):
            raise InvalidArgument(name, f"must be {text} s", value)

    return Rule(shown, check)


def integer(low: int, high: int, shown: str = "") -> Rule:
    text = shown or f"{low}..{high}"

    def check(name: str, value: Any, config: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidArgument(name, f"must be an int in {text}", value)

    return Rule(text, check)


def flag(*, optional: bool = False) -> Rule:
    allowed: tuple[Any, ...] = (True, False, None) if optional else (True, False)
    text = "True, False or None" if optional else "True or False"

    def check(name: str, value: Any, config: Any) -> None:
        if not any(value is a for a in allowed):
            raise InvalidArgument(name, f"must be {text}", value)

    return Rule(text, check)


def instance(kind: Any, text: str, *, optional: bool = True) -> Rule:
    def check(name: str, value: Any, config: Any) -> None:
        if not (value is None and optional) and not isinstance(value, kind):
            raise InvalidArgument(name, f"must be {text}", value)

    return Rule(text, check)


def _sharding(name: str, value: Any, config: Any) -> None:
    make_router(value)  # raises InvalidArgument("sharding", ...)


def _anything(name: str, value: Any, config: Any) -> None:
    """Hooks objects are duck-typed (the dialect's Protocols): any object may answer them."""


_SIZE = integer(1, 2**31 - 1, "1..2**31-1")


@dataclass(frozen=True)
class ProducerConfig:
    """How a Producer routes, retries and traces (each field has a documented default)."""

    timeout: float = field(default=10.0, metadata=spec(
        "Default deadline of a whole publish call (start, lookup, connect and every retry "
        "included); past it the call raises Timeout.", unit="s", rule=seconds()))
    sharding: ShardingScheme = field(default="murmur3", metadata=spec(
        "How sharding keys map to partitions: 'murmur3' (the Go client), 'java' (the Java "
        "client) or a callable (key, partition_num) -> partition.",
        rule=Rule("'murmur3', 'java' or callable", _sharding)))
    max_msg_size: int = field(default=v.DEFAULT_MAX_MSG_SIZE, metadata=spec(
        "Largest message body sent (the server's max_msg_size); larger bodies are refused "
        "before sending.", unit="bytes", rule=_SIZE))
    max_body_size: int = field(default=v.DEFAULT_MAX_BODY_SIZE, metadata=spec(
        "Largest MPUB batch (the server's max_body_size).", unit="bytes", rule=_SIZE))
    retry_delay: float = field(default=0.05, metadata=spec(
        "First back-off between attempts of one publish; doubles per attempt, jittered.",
        unit="s", rule=seconds()))
    retry_delay_max: float = field(default=1.0, metadata=spec(
        "Longest back-off between attempts (a route change ends a back-off early).",
        unit="s", rule=seconds("retry_delay", strict=False)))
    reconnect_delay: float = field(default=0.05, metadata=spec(
        "First wait before dialling a node again after its connect failed; doubles per "
        "consecutive failure, jittered.", unit="s", rule=seconds()))
    reconnect_delay_max: float = field(default=2.0, metadata=spec(
        "Longest wait before dialling a failed node again.", unit="s",
        rule=seconds("reconnect_delay", strict=False)))
    drain_timeout: float = field(default=5.0, metadata=spec(
        "How long close() waits for publishes already sent to be acknowledged before it "
        "fails them (the server may have accepted them: a caller retrying a failed one "
        "could publish it twice). 0 fails them at once.", unit="s",
        rule=seconds(strict=False, finite=False)))
    idle_timeout: float | None = field(default=300.0, metadata=spec(
        "Close a node's connection after this long unused; None keeps connections open.",
        unit="s", rule=seconds(optional=True)))
    sharded_receipts: bool = field(default=True, metadata=spec(
        "Send sharded and explicit-partition publishes to youzan nodes as PUB_TRACE / "
        "MPUB_TRACE (trace id 0 unless given) so their results carry the internal id and "
        "queue offset; False sends plain PUB / MPUB.", rule=flag()))
    trace: bool | None = field(default=None, metadata=spec(
        "Client-side trace log (logger smartnsq.trace): True traces every publish (sent "
        "traced, one line each), None only those given a trace id, False none; "
        "set_trace() changes it at run time, per topic too.", rule=flag(optional=True)))
    connection: ConnectionConfig = field(default_factory=ConnectionConfig, metadata=spec(
        "How connections to nsqd are opened (timeouts, TLS, compression, auth).",
        rule=instance(ConnectionConfig, "a ConnectionConfig", optional=False)))
    classic: ClassicDialect | None = field(default=None, metadata=spec(
        "What youzan-only features become on classic nsqd: a "
        "smartnsq.compat.ClassicPolicy (None: its defaults, i.e. sharding keys placed on "
        "nodes by rendezvous hash, trace ids logged but not sent, headers refused).",
        rule=Rule("ClassicPolicy or None", _anything)))
    migration: RouteChooser | ChooserFactory | None = field(default=None, metadata=spec(
        "Where publishes to a topic found on both a youzan and a classic cluster go: a "
        "smartnsq.compat.MigrationPolicy (prefer youzan, prefer classic, or a percentage "
        "to youzan). None: youzan.", rule=Rule("MigrationPolicy, MigrationChooser or None",
                                               _anything)))

    def __post_init__(self) -> None:
        check_fields(self)


def with_options(config: ProducerConfig, options: dict[str, Any]) -> ProducerConfig:
    """``config`` with a Producer's keyword options applied (``ConnectionConfig`` fields go to
    ``config.connection``), checked again."""
    if not options:
        return config
    producer_fields = ProducerConfig.__dataclass_fields__
    conn_opts = {k: options.pop(k) for k in list(options)
                 if k in ConnectionConfig.__dataclass_fields__ and k not in producer_fields}
    if conn_opts:
        options["connection"] = dataclasses.replace(config.connection, **conn_opts)
    unknown = set(options) - set(producer_fields)
    if unknown:
        raise InvalidArgument("Producer option", "unknown option", sorted(unknown))
    return dataclasses.replace(config, **options)
