"""``ConsumerConfig``: every Consumer option, its default, its documentation and its check.

One description per field (:func:`smartnsq.config.doc` with a :class:`~smartnsq.config.Rule`):
the same record validates the value at construction and writes the row of the generated
configuration reference, so the two cannot disagree. ``Consumer(topic, channel, ...,
max_in_flight=10)`` builds one of these from its keywords (:func:`build_config`); options that
name a :class:`~smartnsq.ConnectionConfig` field go to ``connection``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

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
from ..message import Message
from ..model.backoff import BackoffPolicy, RequeuePolicy
from ..model.dialect import ClassicDialect
from ..protocol import validate as v
from ..protocol.commands import StartPosition

__all__ = ["ConsumerConfig", "DeadLetterHook", "GiveUpHook", "Handler", "OrderErrorHook",
           "build_config"]

Handler = Callable[[Message], Union[Awaitable[Any], Any]]  # noqa: UP007 - runtime alias
GiveUpHook = Callable[[Message], Union[Awaitable[Any], Any]]  # noqa: UP007
OrderErrorHook = Callable[[Message, str], None]
DeadLetterHook = Callable[[Message], Union[Awaitable[Any], Any]]  # noqa: UP007


def _partitions_check(name: str, value: Any, obj: Any) -> None:
    if value is None:
        return
    if not value:
        raise InvalidArgument(name, "must name at least one partition", value)
    for p in value:
        v.check_partition(p)


def _tag_check(name: str, value: Any, obj: Any) -> None:
    if value is not None:
        v.check_tag(value)


def _ext_filter_check(name: str, value: Any, obj: Any) -> None:
    """The filter goes to the server as JSON in IDENTIFY: what cannot be encoded would make
    every connect fail, so it is refused here."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise InvalidArgument(name, "must be a JSON object (a dict)", value)
    try:
        json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(name, f"must be JSON-encodable ({exc})", value) from None


def _callable_check(name: str, value: Any, obj: Any) -> None:
    if value is not None and not callable(value):
        raise InvalidArgument(name, "must be callable", value)


def _dead_letter_check(name: str, value: Any, obj: Any) -> None:
    """A topic name or a hook, and only with a ``max_attempts`` to be past: without one no
    message would ever be dead-lettered, which is surely not what was meant."""
    if value is None:
        return
    if isinstance(value, str):
        try:
            v.check_topic(value)
        except InvalidArgument as exc:
            raise InvalidArgument(name, f"not a topic name ({exc})", value) from None
    elif not callable(value):
        raise InvalidArgument(name, "must be a topic name or a callable", value)
    if not obj.max_attempts:
        raise InvalidArgument(name, "needs max_attempts (messages are dead-lettered once "
                              "delivered more often than that)", value)


def _dead_letter_ordered_check(name: str, value: Any, obj: Any) -> None:
    flag().check(name, value, obj)
    if value and obj.dead_letter is None:
        raise InvalidArgument(name, "needs dead_letter (where the skipped message goes)",
                              value)


def _start_check(name: str, value: Any, obj: Any) -> None:
    instance(StartPosition, "a StartPosition or None").check(name, value, obj)
    if value is not None and obj.ordered:
        raise InvalidArgument(name, "ordered subscriptions cannot start elsewhere (the "
                              "server refuses SUB_ADVANCED on ordered topics)", value)


def _mapping_check(name: str, value: Any, obj: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidArgument(name, "must be a mapping of LookupConfig fields", value)


_PARTITIONS = Rule("non-empty set of partition numbers or None", _partitions_check)
_TAG = Rule("str of at most 100 bytes of [a-zA-Z0-9_-], or None", _tag_check)
_EXT_FILTER = Rule("JSON-encodable dict or None", _ext_filter_check)
_CALLABLE = Rule("callable or None", _callable_check)
_START = Rule("StartPosition or None", _start_check)
_DEAD_LETTER = Rule("topic name, callable or None (needs max_attempts)", _dead_letter_check)
_DEAD_LETTER_ORDERED = Rule("bool (needs dead_letter)", _dead_letter_ordered_check)
_MAPPING = Rule("mapping", _mapping_check)


@dataclass(frozen=True)
class ConsumerConfig:
    """How a Consumer subscribes, handles, paces and closes (each field documented)."""

    max_in_flight: int = field(default=100, metadata=doc(
        "Messages delivered and not yet answered, over all connections (spread as RDY); 0 "
        "pauses.", check=integer(0)))
    concurrency: int | None = field(default=None, metadata=doc(
        "Messages handled at once; None: max_in_flight for coroutine handlers, 1 for plain "
        "functions (they run on the event loop).", check=integer(1, optional=True)))
    ordered: bool | None = field(default=None, metadata=doc(
        "True subscribes with SUB_ORDERED; None follows the topic's meta (ordered topics "
        "must).", check=flag(optional=True)))
    start: StartPosition | None = field(default=None, metadata=doc(
        "Subscribe with SUB_ADVANCED from this position (first subscription of each "
        "partition only; not with ordered=True).", check=_START))
    partitions: frozenset[int] | None = field(default=None, metadata=doc(
        "Read only these partitions; None: all (lookupd) or each node's default (nsqd=).",
        check=_PARTITIONS))
    desired_tag: str | None = field(default=None, metadata=doc(
        "Ext topics: receive only messages tagged with this ##client_dispatch_tag.",
        check=_TAG))
    ext_filter: Mapping[str, Any] | None = field(default=None, metadata=doc(
        "Ext topics: youzan's server-side filter, sent as JSON in IDENTIFY.",
        check=_EXT_FILTER))
    extend_support: bool | None = field(default=None, metadata=doc(
        "Force IDENTIFY extend_support; None follows the topic's meta (or the server's "
        "refusal).", check=flag(optional=True)))
    max_attempts: int = field(default=5, metadata=doc(
        "Give up on a message delivered more often than this (on_give_up, dead_letter; by "
        "default logged and FINed, as pynsq's max_tries and go-nsq's MaxAttempts, 5 too); "
        "ordered subscriptions never skip by default. 0: retry for ever. The handler's "
        "traceback is logged once per message: with its last allowed attempt (ERROR), or "
        "with 0 its first; the other attempts are one line each.", check=integer(0)))
    on_give_up: GiveUpHook | None = field(default=None, metadata=doc(
        "fn(message) (or async) called instead of the handler past max_attempts; None logs "
        "and finishes it.", check=_CALLABLE))
    dead_letter: str | DeadLetterHook | None = field(default=None, metadata=doc(
        "Past max_attempts, park the message and move on instead of giving up: a topic name "
        "(published there by a producer of the consumer's own, its origin in smartnsq.dl.* "
        "ext headers) or fn(message) (or async) that returns once it is parked. FINed only "
        "after that; a failed park requeues it. Replaces on_give_up where it applies.",
        check=_DEAD_LETTER))
    dead_letter_ordered: bool = field(default=False, metadata=doc(
        "Let dead_letter park a message of an ordered subscription, so that its partition "
        "moves on; False: ordered messages are never skipped.",
        check=_DEAD_LETTER_ORDERED))
    on_order_error: OrderErrorHook | None = field(default=None, metadata=doc(
        "fn(message, text) for an order regression on a SUB_ORDERED/SUB_ADVANCED "
        "subscription.", check=_CALLABLE))
    decompress: bool = field(default=True, metadata=doc(
        "Decode bodies the publishing client compressed (youzan/go-nsq's "
        "nsq.client.compress mark) before the handler; False hands them over as stored.",
        check=flag()))
    max_decompressed_size: int = field(default=64 << 20, metadata=doc(
        "Most bytes a compressed body may decode to; a larger one is undecodable "
        "(requeued, or the give-up hook's).", unit="bytes", check=integer(1)))
    auto_finish: bool = field(default=True, metadata=doc(
        "FIN when the handler returns, REQ when it raises; False leaves every answer to the "
        "handler.", check=flag()))
    requeue_policy: RequeuePolicy = field(default_factory=RequeuePolicy, metadata=doc(
        "REQ delay from the attempt count (on ordered subscriptions the consumer holds the "
        "partition for it, since the server ignores a delayed REQ there).",
        check=instance(RequeuePolicy, "a RequeuePolicy", optional=False)))
    backoff_policy: BackoffPolicy = field(default_factory=BackoffPolicy, metadata=doc(
        "Slowing down after handler failures (per partition on ordered subscriptions); "
        "BackoffPolicy(enabled=False) disables it.",
        check=instance(BackoffPolicy, "a BackoffPolicy", optional=False)))
    trace: bool | None = field(default=None, metadata=doc(
        "Consume trace lines on smartnsq.trace: None for messages with a trace id, True for "
        "all, False for none.", check=flag(optional=True)))
    span_one_in: int = field(default=1, metadata=doc(
        "OpenTelemetry (tracer_provider given, or smartnsq.observability.otel.instrument()): "
        "a process span for the first message, then for one in N, chosen before the SDK is "
        "asked (its sampler decides among those); a message whose ext headers carry a W3C "
        "traceparent "
        "follows its sampled flag instead. 1: every message.", check=integer(1)))
    drain_timeout: float = field(default=30.0, metadata=doc(
        "close()'s default timeout: the whole close (the drain for running handlers, CLS, "
        "the connections' close) ends within it; what is left is aborted.",
        unit="s", check=seconds()))
    reconnect_delay: float = field(default=1.0, metadata=doc(
        "First wait before resubscribing after a failure; doubles per consecutive failure, "
        "jittered.", unit="s", check=seconds(), concept="redial"))
    reconnect_delay_max: float = field(default=60.0, metadata=doc(
        "Longest wait before resubscribing.", unit="s",
        check=seconds("reconnect_delay", low_open=False), concept="redial"))
    discovery_timeout: float | None = field(default=None, metadata=doc(
        "Fail fast (lookupd= only): when no lookup answer about the topic came within this "
        "many seconds of start() (every lookupd unreachable or silent, or the topic not "
        "found), the consumer closes and join() and iteration raise LookupFailed (or "
        "TopicNotFound) caused by the last failure. Once a first answer came, later lookupd "
        "outages never end the consumer. None (default): keep retrying for ever.",
        unit="s", check=seconds(optional=True)))
    low_rdy_idle_timeout: float = field(default=10.0, metadata=doc(
        "With fewer max_in_flight than connections: how long a connection may hold RDY "
        "without a message before it moves on; a busy one gives way after half of it.",
        unit="s", check=seconds()))
    rdy_tick_interval: float = field(default=2.0, metadata=doc(
        "Period of the flow control's time-driven work (RDY rotation, back-off probes).",
        unit="s", check=seconds()))
    lookup_options: Mapping[str, Any] = field(default_factory=dict, metadata=doc(
        "LookupConfig fields for the consumer's own lookup manager (poll_interval=...).",
        check=_MAPPING))
    classic: ClassicDialect | None = field(default=None, metadata=doc(
        "What ordered/start become on classic nodes: a smartnsq.compat.ClassicPolicy "
        "(None: its defaults, which refuse them).", check=duck("ClassicPolicy or None")))
    connection: ConnectionConfig = field(default_factory=ConnectionConfig, metadata=doc(
        "How connections to nsqd are opened (timeouts, TLS, compression, auth); its fields "
        "may also be given as Consumer keywords.",
        check=instance(ConnectionConfig, "a ConnectionConfig", optional=False)))

    def __post_init__(self) -> None:
        if self.partitions is not None and not isinstance(self.partitions, frozenset):
            if isinstance(self.partitions, (str, bytes)) \
                    or not isinstance(self.partitions, Iterable):
                raise InvalidArgument("partitions", "must be an iterable of partition "
                                      "numbers", self.partitions)
            object.__setattr__(self, "partitions", frozenset(self.partitions))
        if self.ext_filter is not None and isinstance(self.ext_filter, Mapping):
            object.__setattr__(self, "ext_filter", dict(self.ext_filter))
        check_fields(self)

    @property
    def reconnect_max(self) -> float:
        """The longest resubscribe wait (``reconnect_delay_max``, never below the first)."""
        return float(self.reconnect_delay_max)


_CONSUMER_FIELDS = frozenset(f.name for f in dataclasses.fields(ConsumerConfig))
_CONNECTION_FIELDS = frozenset(f.name for f in dataclasses.fields(ConnectionConfig))


def build_config(config: ConsumerConfig | ConnectionConfig | None,
                 options: Mapping[str, Any],
                 constructor: Callable[..., Any] | None = None) -> ConsumerConfig:
    """The Consumer's configuration from its ``config=`` and keywords: a ConsumerConfig as is
    (keywords override its fields), a ConnectionConfig as its ``connection``; keywords naming
    ConnectionConfig fields go to the connection. An unknown keyword is refused with the
    nearest option or parameter of ``constructor`` suggested."""
    refuse_unknown("Consumer", options, _CONSUMER_FIELDS | _CONNECTION_FIELDS, constructor)
    if config is None:
        base = ConsumerConfig()
    elif isinstance(config, ConsumerConfig):
        base = config
    elif isinstance(config, ConnectionConfig):
        base = ConsumerConfig(connection=config)
    else:
        raise InvalidArgument("config", "must be a ConsumerConfig or a ConnectionConfig",
                              config)
    own = {k: v for k, v in options.items() if k in _CONSUMER_FIELDS}
    conn = {k: v for k, v in options.items() if k not in _CONSUMER_FIELDS}
    if conn:
        own["connection"] = dataclasses.replace(own.get("connection", base.connection), **conn)
    for name in ("backoff_policy", "requeue_policy", "lookup_options"):
        if own.get(name, 1) is None:  # None for these keywords means "the default"
            del own[name]
    return dataclasses.replace(base, **own) if own else base


