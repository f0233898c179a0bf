"""OpenTelemetry spans: a PRODUCER span per publish call, a CONSUMER span per handled message.

Off, and free, unless asked for, in one of two ways:

* per client: ``Producer(..., tracer_provider=provider)``, ``Consumer(..., tracer_provider=
  provider)`` (the blocking facades pass it on);
* for every client created afterwards: ``smartnsq.observability.otel.instrument()`` (the global
tracer
  provider, or the one given; it turns on the metrics of ``smartnsq.observability.otel_metrics``
  too, ``metrics=False`` not); ``uninstrument()`` stops both for clients created later.

A client without it never imports opentelemetry and runs none of this: the producer's
publish calls and the consumer's handler are only wrapped when tracing is on.

**Publish spans** (``publish {topic}``, kind PRODUCER) cover a call from its start to the
acknowledgement, retries included (``publish_many``: one span for the batch). **Process
spans** (``process {topic}``, kind CONSUMER) cover the handler, and say what the message got:
``messaging.nsq.outcome`` is ``fin``, ``req``, ``none`` (auto-response off and no answer
yet) or ``give_up`` (``max_attempts`` exceeded: a span around the give-up hook instead of
the handler). Attributes follow OpenTelemetry's messaging semantic conventions
(``messaging.system`` ``nsq``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.message.id``,
``messaging.consumer.group.name``...) plus ``messaging.nsq.*`` for youzan's trace id, queue
offset, internal id and attempts; ``docs/observability.md`` lists them.

**Propagation.** On ext topics the producer puts the W3C trace context (``traceparent``,
``tracestate``: whatever the global propagator writes) into the message's ext JSON headers,
and the consumer's span is a child of the publish span. Elsewhere nothing extra travels, but
a message published with a youzan ``trace_id`` links both spans to one remote span context
derived from that id (:func:`youzan_link_context`), so a trace backend can join them.

With ``async for`` (no handler) wrap the body yourself: ``with
smartnsq.observability.otel.process_span( message, tracer_provider): ...``. The blocking Consumer
runs handlers in threads: the span covers the handler's run but is not the thread's current span.

Needs the ``otel`` extra (opentelemetry-api; an SDK or another implementation to export).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from .. import __version__
from ..protocol.numbers import is_int, is_real
from . import otel_metrics
from .counters import reason_of

__all__ = [
    "consumer_tracing",
    "enabled",
    "instrument",
    "process_span",
    "producer_tracing",
    "uninstrument",
    "youzan_link_context",
]

log = logging.getLogger("smartnsq.otel")

SYSTEM = "nsq"
_global: dict[str, Any] = {"on": False, "provider": None}
# set while a traced publish runs: the calls it makes on the producer (publish() with linger
# goes through publish_nowait) are not traced a second time
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("smartnsq_otel_inside",
                                                               default=False)


_API: Any = None


def _api() -> Any:
    """opentelemetry's names, imported on first use (never by an untraced client)."""
    global _API
    if _API is None:
        from opentelemetry import propagate, trace
        from opentelemetry.trace import (
            Link,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
        )

        _API = SimpleNamespace(propagate=propagate, trace=trace, Link=Link,
                               SpanContext=SpanContext, SpanKind=SpanKind, Status=Status,
                               StatusCode=StatusCode, TraceFlags=TraceFlags)
    return _API


def instrument(tracer_provider: Any = None, meter_provider: Any = None, *,
               tracing: bool = True, metrics: bool = True) -> None:
    """Trace and meter every Producer and Consumer created from now on, as OpenTelemetry's
    instrumentors do: spans with ``tracer_provider``, the messaging metrics
    (``smartnsq.observability.otel_metrics``) with ``meter_provider``, each by default the global
    one (``trace.get_tracer_provider()``, ``metrics.get_meter_provider()``);
    ``tracing=False``/``metrics=False`` leaves one off."""
    import opentelemetry.trace  # noqa: F401  - fail here, not in a client, without the extra

    if tracing:
        _global["on"] = True
        _global["provider"] = tracer_provider
    if metrics:
        otel_metrics.enable(meter_provider)


def uninstrument() -> None:
    """Clients created from now on are neither traced nor metered (unless given
    ``tracer_provider=``/``meter_provider=``); clients made before keep theirs."""
    _global["on"] = False
    _global["provider"] = None
    otel_metrics.disable()


def enabled() -> bool:
    """Whether :func:`instrument` is in force."""
    return bool(_global["on"])


def _tracer(tracer_provider: Any) -> Any:
    provider = tracer_provider if tracer_provider is not None else _global["provider"]
    if provider is None:
        provider = _api().trace.get_tracer_provider()
    return provider.get_tracer("smartnsq", __version__)


def youzan_link_context(trace_id: int) -> Any:
    """The remote span context both sides link to for a youzan ``trace_id`` (nonzero): trace
    id and span id are the 64-bit trace id itself, sampled."""
    api = _api()
    return api.SpanContext(trace_id=trace_id, span_id=trace_id, is_remote=True,
                           trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))


def _links(trace_id: int | None) -> list[Any] | None:
    if not trace_id:
        return None
    return [_api().Link(youzan_link_context(trace_id), {"messaging.nsq.trace_id": trace_id})]


def _fail(span: Any, error: BaseException) -> None:
    api = _api()
    span.record_exception(error)
    span.set_attribute("error.type", reason_of(error))
    span.set_status(api.Status(api.StatusCode.ERROR, str(error)))


# -- producer ----------------------------------------------------------------------------------

def producer_tracing(producer: Any, tracer_provider: Any) -> bool:
    """Trace ``producer``'s publish calls if ``tracer_provider`` is given or
    :func:`instrument` is in force (``Producer.__init__`` calls it); True when it does."""
    if tracer_provider is None and not _global["on"]:
        return False
    _PublishTracing(producer, _tracer(tracer_provider))
    return True


class _PublishTracing:
    """Wraps a producer's ``publish``, ``publish_nowait`` and ``publish_many`` (instance
    attributes over the class's methods: untraced producers are untouched)."""

    def __init__(self, producer: Any, tracer: Any) -> None:
        self.producer = producer
        self.tracer = tracer
        self._one_in = producer.config.span_one_in
        self._skip = 0
        from opentelemetry import context

        self._context = context.get_current
        self._current_span = _api().trace.get_current_span
        self._publish = producer.publish
        self._nowait = producer.publish_nowait
        self._many = producer.publish_many
        producer.publish = self.publish
        producer.publish_nowait = self.publish_nowait
        producer.publish_many = self.publish_many

    def _gated_out(self) -> bool:
        """``ProducerConfig.span_one_in`` > 1: whether this call goes untraced, decided
        before the SDK is asked (asking costs about an untraced publish's own CPU even when
        its sampler says no). A call made while a recording span is current is traced (the
        caller's trace stays whole); the others: the first, then one in ``span_one_in``."""
        if self._one_in == 1:
            return False
        current = self._context()
        # (an empty context, a pipeline's usual case, has no span: the cheap test first)
        if current and self._current_span(current).is_recording():
            return False
        if self._skip:
            self._skip -= 1
            return True
        self._skip = self._one_in - 1
        return False

    def _start(self, topic: str, kwargs: Mapping[str, Any], count: int | None,
               body_size: int | None) -> Any:
        trace_id = kwargs.get("trace_id")
        if not is_int(trace_id):
            trace_id = None
        span = self.tracer.start_span(
            f"publish {topic}", kind=_api().SpanKind.PRODUCER,
            attributes={"messaging.system": SYSTEM, "messaging.operation.type": "send",
                        "messaging.destination.name": topic},
            links=_links(trace_id))
        if not span.is_recording():
            return span  # not sampled: nothing more to gather
        span.set_attribute("messaging.operation.name", "publish")
        partition = kwargs.get("partition")
        if partition is not None:
            span.set_attribute("messaging.destination.partition.id", str(partition))
        if count is not None:
            span.set_attribute("messaging.batch.message_count", count)
        if body_size is not None:
            span.set_attribute("messaging.message.body.size", body_size)
        if trace_id:
            span.set_attribute("messaging.nsq.trace_id", trace_id)
        return span

    def _carrier(self, span: Any, topic: str) -> dict[str, str] | None:
        """The trace context to send in the ext headers (ext topics, routes known)."""
        routes = self.producer.pool.routes(topic)
        if routes is None or not routes.ext:
            return None
        api = _api()
        carrier: dict[str, str] = {}
        api.propagate.inject(carrier, context=api.trace.set_span_in_context(span))
        return carrier or None

    @staticmethod
    def _ended(span: Any, result: Any) -> None:
        if not span.is_recording():
            span.end()
            return
        for name, attribute in (("partition", "messaging.destination.partition.id"),
                                ("internal_id", "messaging.message.id"),
                                ("queue_offset", "messaging.nsq.queue_offset"),
                                ("attempts", "messaging.nsq.attempts"),
                                ("trace_id", "messaging.nsq.trace_id")):
            value = getattr(result, name, None)
            if value is not None:
                span.set_attribute(attribute, str(value) if name in (
                    "partition", "internal_id") else value)
        node = getattr(result, "node", "")
        if node:
            host, _, port = node.rpartition(":")
            span.set_attribute("server.address", host)
            if port.isdigit():
                span.set_attribute("server.port", int(port))
        span.end()

    async def _load_routes(self, topic: str, kwargs: dict[str, Any]) -> None:
        """Look the topic up (is it ext?) within the call's timeout, and leave the call what
        is left of it: the publish does not outlive its timeout for the lookup."""
        if self.producer.pool.routes(topic) is not None:
            return
        given = kwargs.get("timeout")
        if given is not None and (not is_real(given) or not 0 < given < float("inf")):
            return  # a bad timeout: the publish refuses it, as it is
        timeout = self.producer.config.timeout if given is None else float(given)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(Exception):  # the publish itself will say why
            await self.producer.routes(topic, timeout)
        kwargs["timeout"] = max(timeout - (loop.time() - started), 0.001)

    async def publish(self, topic: str, body: bytes, **kwargs: Any) -> Any:
        if _inside.get() or self._gated_out():
            return await self._publish(topic, body, **kwargs)
        return await self._publish_traced(topic, body, kwargs)

    async def _publish_traced(self, topic: str, body: bytes, kwargs: dict[str, Any]) -> Any:
        span = self._start(topic, kwargs, None, len(body) if isinstance(body, bytes) else None)
        token = _inside.set(True)
        try:
            await self._load_routes(topic, kwargs)
            carrier = self._carrier(span, topic)
            if carrier is not None:
                kwargs["headers"] = {**carrier, **(kwargs.get("headers") or {})}
            result = await self._publish(topic, body, **kwargs)
        except BaseException as exc:
            _fail(span, exc)
            span.end()
            raise
        finally:
            _inside.reset(token)
        self._ended(span, result)
        return result

    def publish_nowait(self, topic: str, body: bytes, **kwargs: Any) -> Any:
        if _inside.get() or self._gated_out():
            return self._nowait(topic, body, **kwargs)
        if self.producer.pool.routes(topic) is None and not self.producer.closed:
            # whether the topic is ext is not known yet: once per topic, through publish()
            return asyncio.ensure_future(self._publish_traced(topic, body, kwargs))
        span = self._start(topic, kwargs, None, len(body) if isinstance(body, bytes) else None)
        carrier = self._carrier(span, topic)
        if carrier is not None:
            kwargs["headers"] = {**carrier, **(kwargs.get("headers") or {})}
        token = _inside.set(True)
        try:
            future = self._nowait(topic, body, **kwargs)
        except BaseException as exc:
            _fail(span, exc)
            span.end()
            raise
        finally:
            _inside.reset(token)

        def done(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                span.set_attribute("error.type", "cancelled")
                span.end()
            elif future.exception() is not None:
                _fail(span, future.exception())  # type: ignore[arg-type]
                span.end()
            else:
                self._ended(span, future.result())

        future.add_done_callback(done)
        return future

    async def publish_many(self, topic: str, bodies: Any, **kwargs: Any) -> Any:
        if _inside.get() or self._gated_out():
            return await self._many(topic, bodies, **kwargs)
        bodies = list(bodies)
        span = self._start(topic, kwargs, len(bodies), None)
        token = _inside.set(True)
        try:
            await self._load_routes(topic, kwargs)
            carrier = self._carrier(span, topic)
            if carrier is not None:
                kwargs["headers"] = _merge_batch(kwargs.get("headers"), carrier, len(bodies))
            result = await self._many(topic, bodies, **kwargs)
        except BaseException as exc:
            _fail(span, exc)
            span.end()
            raise
        finally:
            _inside.reset(token)
        self._ended(span, result)
        return result


def _merge_batch(headers: Any, carrier: dict[str, str], count: int) -> Any:
    if headers is None or isinstance(headers, Mapping):
        return {**carrier, **(headers or {})}
    if isinstance(headers, Sequence) and len(headers) == count:
        return [{**carrier, **(h or {})} for h in headers]
    return headers  # wrong shape: publish_many refuses it


# -- consumer ----------------------------------------------------------------------------------

def consumer_tracing(topic: str, channel: str, handler: Any, config: Any,
                     tracer_provider: Any) -> tuple[Any, Any]:
    """``(handler, config)`` for a Consumer: wrapped to make process spans if
    ``tracer_provider`` is given or :func:`instrument` is in force, else as given
    (``Consumer.__init__`` calls it)."""
    if tracer_provider is None and not _global["on"]:
        return handler, config
    tracer = _tracer(tracer_provider)
    if handler is not None:
        handler = _traced_handler(handler, tracer, channel, config.span_one_in)
    hook = config.on_give_up
    return handler, dataclasses.replace(
        config, on_give_up=_traced_give_up(hook, tracer, channel, config.max_attempts))


class _ProcessSpans:
    """Starts the process spans of one consumer: what does not change from one message to
    the next (the span name and the attributes per topic, the server address per node) is
    built once, so a message costs its own attributes and the SDK's span."""

    __slots__ = ("_api", "_channel", "_nodes", "_start", "_topics")

    def __init__(self, tracer: Any, channel: str) -> None:
        self._api = _api()
        self._start = tracer.start_span
        self._channel = channel
        # topic -> (span name, the sampler's attributes, the rest of the fixed ones)
        self._topics: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}  # "host:port" -> server.* attributes

    def _topic(self, topic: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        fixed = self._topics.get(topic)
        if fixed is None:
            channel = self._channel
            fixed = self._topics[topic] = (
                f"process {topic}",
                {"messaging.system": SYSTEM, "messaging.operation.type": "process",
                 "messaging.destination.name": topic,
                 "messaging.consumer.group.name": channel},
                {"messaging.operation.name": "process",
                 "messaging.destination.subscription.name": channel})
        return fixed

    def _node(self, node: str) -> dict[str, Any]:
        server = self._nodes.get(node)
        if server is None:
            host, _, port = node.rpartition(":")
            server = {"server.address": host}
            if port.isdigit():
                server["server.port"] = int(port)
            self._nodes[node] = server
        return server

    def start(self, message: Any) -> Any:
        """A started process span for ``message`` (not current: the caller attaches it)."""
        api = self._api
        name, first, rest = self._topic(message.topic)
        youzan = message.youzan
        trace_id = message.trace_id if youzan else None
        parent = None
        links = None
        headers = message.headers if message.ext else None
        if headers and "traceparent" in headers:
            parent = api.propagate.extract(headers)
        elif trace_id:
            links = _links(trace_id)  # only when there is one
        # every attribute at the start, in one dict: the SDK cleans them into the span's
        # attributes once, where a second set_attributes call would take its lock and
        # copy again (an unsampled span drops the dict without looking at it)
        attributes = {**first, **rest, **self._node(message.node),
                      "messaging.message.body.size": len(message.body),
                      "messaging.nsq.attempts": message.attempts}
        if youzan:
            attributes["messaging.message.id"] = str(message.internal_id)
            if message.partition is not None:
                attributes["messaging.destination.partition.id"] = str(message.partition)
            if message.queue_offset is not None:
                attributes["messaging.nsq.queue_offset"] = message.queue_offset
        else:
            attributes["messaging.message.id"] = message.id.decode("ascii", "replace")
        if trace_id:
            attributes["messaging.nsq.trace_id"] = trace_id
        return self._start(name, context=parent, kind=api.SpanKind.CONSUMER,
                           attributes=attributes, links=links)


def _start_process(tracer: Any, message: Any, channel: str) -> Any:
    """A process span outside a traced handler (give-up hook, ``process_span``)."""
    return _ProcessSpans(tracer, channel).start(message)


def _outcome(message: Any, raised: bool) -> str:
    if message.has_responded:
        return "fin" if message.finished else "req"
    if message.auto_response:
        return "req" if raised else "fin"
    return "none"


def _parent_sampled(message: Any) -> bool | None:
    """The sampled flag of the W3C ``traceparent`` in ``message``'s ext headers; None when
    it has none, or not a well-formed one (the propagator would ignore it too)."""
    traceparent = message.headers.get("traceparent")
    if not isinstance(traceparent, str) or len(traceparent) != 55 \
            or traceparent[2] != "-" or traceparent[35] != "-" or traceparent[52] != "-":
        return None
    return traceparent[-1] in "13579bdfBDF"  # the flags' low bit: sampled


def _traced_handler(handler: Callable[[Any], Any], tracer: Any, channel: str,
                    one_in: int = 1) -> Any:
    """The handler inside a process span, current while it runs (the handler's own spans
    are its children). The span is made current by attaching its context directly, not
    through ``trace.use_span`` (a generator context manager with exception bookkeeping this
    path does not use: the outcome and the exception are recorded here).

    ``one_in`` (``ConsumerConfig.span_one_in``) > 1 gates the spans before the SDK is asked,
    because asking it costs about twice an untraced message even when its sampler says no:
    a message whose ext headers carry a W3C ``traceparent`` follows the producer's decision
    (its sampled flag), so a sampled publish keeps its consumer span; the others get a span
    for the first, then one in ``one_in`` (a countdown); the rest call the handler as an
    untraced consumer does. The common case (the countdown running, no ext header) is
    written out in both wrappers below: a call to a shared function would cost more than
    the rest of a gated-out message's tracing."""
    from opentelemetry import context

    set_in_context = _api().trace.set_span_in_context
    attach = context.attach
    detach = context.detach
    start = _ProcessSpans(tracer, channel).start
    gated = one_in > 1
    skip = 0

    def admit(message: Any) -> bool:
        """The gate's other cases: an ext message (its traceparent decides, when it has
        one), or the countdown at zero."""
        nonlocal skip
        ext = message.ext
        if ext and b"traceparent" in ext:
            sampled = _parent_sampled(message)
            if sampled is not None:
                return sampled
        if skip:
            skip -= 1
            return False
        skip = one_in - 1
        return True

    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)):  # noqa: B004
        async def traced_async(message: Any) -> Any:
            nonlocal skip
            if gated:  # (the gate: see above)
                if skip and not message.ext:
                    skip -= 1
                    return await handler(message)
                if not admit(message):
                    return await handler(message)
            span = start(message)
            token = attach(set_in_context(span))
            try:
                result = await handler(message)
            except BaseException as exc:
                detach(token)
                _end_process(span, message, exc)
                raise
            detach(token)
            _end_process(span, message, None)
            return result

        return traced_async

    def traced(message: Any) -> Any:
        nonlocal skip
        if gated:  # (the gate: see above; the common case first, in the fewest bytecodes)
            if skip and not message.ext:
                skip -= 1
                return handler(message)
            if not admit(message):
                return handler(message)
        span = start(message)
        token = attach(set_in_context(span))
        try:
            result = handler(message)
        except BaseException as exc:
            detach(token)
            _end_process(span, message, exc)
            raise
        detach(token)
        _end_process(span, message, None)
        return result

    return traced


def _end_process(span: Any, message: Any, exc: BaseException | None) -> None:
    """End a process span with the handler's outcome (and its exception, if it raised)."""
    span.set_attribute("messaging.nsq.outcome", _outcome(message, exc is not None))
    if exc is not None:
        _fail(span, exc)
    span.end()


def _traced_give_up(hook: Any, tracer: Any, channel: str, max_attempts: int) -> Any:
    """The ``on_give_up`` hook in a process span (outcome ``give_up``). Without a hook of the
    user's it logs what the consumer's default would, and leaves the answer to the consumer
    (FIN; on ordered subscriptions the message is handled again, never skipped)."""
    trace = _api().trace

    async def give_up(message: Any) -> None:
        span = _start_process(tracer, message, channel)
        span.set_attribute("messaging.nsq.outcome", "give_up")
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                if hook is None:
                    log.warning("%s/%s: giving up on %r after %d attempts (max_attempts %d)",
                                message.topic, channel, message, message.attempts,
                                max_attempts)
                    return
                result = hook(message)
                if inspect.isawaitable(result):
                    await result
        except BaseException as exc:
            _fail(span, exc)
            raise
        finally:
            span.end()

    return give_up


@contextlib.contextmanager
def process_span(message: Any, tracer_provider: Any = None) -> Iterator[Any]:
    """A process span around your own handling of ``message`` (``async for`` consumers):
    current inside the block, outcome read from the message when the block ends."""
    trace = _api().trace

    span = _start_process(_tracer(tracer_provider), message, message.channel)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            yield span
    except BaseException as exc:
        span.set_attribute("messaging.nsq.outcome", _outcome_by_hand(message))
        _fail(span, exc)
        raise
    else:
        span.set_attribute("messaging.nsq.outcome", _outcome_by_hand(message))
    finally:
        span.end()


def _outcome_by_hand(message: Any) -> str:
    if message.has_responded:
        return "fin" if message.finished else "req"
    return "none"
