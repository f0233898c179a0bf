"""OpenTelemetry spans where a call goes wrong or off the common path, against the dev
cluster and the SDK's in-memory exporter: a failed, refused or cancelled publish ends its
span with the error; a batch on an ext topic carries the trace context in every message and
keeps the caller's headers; an unsampled provider records nothing and changes no result;
coroutine handlers, answers given by hand, give-ups and ``process_span`` (``async for``)
get the outcome the message really got; classic messages are named by their id; and
``instrument()``'s switches turn tracing and metrics on one at a time. Skipped without the
``otel`` extra."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from support import Watch, bounded, channel_reaches

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from smartnsq import Consumer, Producer
from smartnsq.errors import InvalidArgument, TopicNotFound
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.observability import otel, otel_metrics

ONE = pytest.mark.nsq_cluster(nodes=1, lookupds=1)
FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5,
                        "backoff_policy": BackoffPolicy(enabled=False),
                        "requeue_policy": RequeuePolicy(initial=0.0, cap=0.0)}


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_kind(exporter: InMemorySpanExporter, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


def failed(span: Any) -> tuple[str, StatusCode, bool]:
    """What an errored span says: its error.type, its status, whether it kept the exception."""
    return (span.attributes.get("error.type"), span.status.status_code,
            any(event.name == "exception" for event in span.events))


# -- the publish side ----------------------------------------------------------------------------

@ONE
async def test_failed_refused_and_cancelled_publishes_end_their_spans_with_the_error(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oerr", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses, tracer_provider=provider,
                        timeout=5) as producer:
        async with bounded(5):
            with pytest.raises(TopicNotFound):
                await producer.publish("onosuch", b"x", timeout=2)
        with pytest.raises(InvalidArgument, match="timeout"):
            await producer.publish("oerr", b"x", timeout=-1)
        async with bounded(5):
            await producer.publish("oerr", b"routes known now")
        # the routes are known: publish_nowait spans the call itself
        with pytest.raises(InvalidArgument, match="body"):
            producer.publish_nowait("oerr", "not bytes")  # type: ignore[arg-type]
        refused = producer.publish_nowait("oerr", b"x", partition=7)
        with pytest.raises(InvalidArgument, match="partition 7"):
            await refused
        cancelled = producer.publish_nowait("oerr", b"given up")
        cancelled.cancel()
        # an unknown topic: the call goes through publish() (is it ext?), as a task
        async with bounded(5):
            with pytest.raises(TopicNotFound):
                await producer.publish_nowait("onosuch2", b"x", timeout=2)
    publishes = {(s.attributes["messaging.destination.name"],
                  s.attributes.get("messaging.destination.partition.id"),
                  s.attributes.get("messaging.message.body.size")): s
                 for s in by_kind(exporter, SpanKind.PRODUCER)}
    assert failed(publishes["onosuch", None, 1]) == ("TopicNotFound", StatusCode.ERROR, True)
    assert failed(publishes["onosuch2", None, 1]) == ("TopicNotFound", StatusCode.ERROR, True)
    assert failed(publishes["oerr", None, None]) == ("InvalidArgument", StatusCode.ERROR, True)
    assert failed(publishes["oerr", "7", 1]) == ("InvalidArgument", StatusCode.ERROR, True)
    errored = [s for s in by_kind(exporter, SpanKind.PRODUCER)
               if s.attributes.get("error.type") is not None]
    assert sorted(s.attributes["error.type"] for s in errored) == [
        "InvalidArgument", "InvalidArgument", "InvalidArgument", "TopicNotFound",
        "TopicNotFound", "cancelled"]
    [gave_up] = [s for s in errored if s.attributes["error.type"] == "cancelled"]
    assert gave_up.status.status_code == StatusCode.UNSET  # a cancel is not an error
    [ok] = [s for s in by_kind(exporter, SpanKind.PRODUCER)
            if s.attributes.get("error.type") is None]
    assert ok.attributes["messaging.destination.partition.id"] == "0"
    assert ok.attributes["messaging.nsq.attempts"] == 1
    assert ok.attributes["server.address"] == "127.0.0.1"
    assert isinstance(ok.attributes["server.port"], int)


@ONE
async def test_a_batch_on_an_ext_topic_carries_its_trace_context_in_every_message(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("obatch", partitions=2, ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer, bounded(10):
        per_message = await producer.publish_many("obatch", [b"a", b"b"], partition=0,
                                                  headers=[{"k": "a"}, None])
        shared = await producer.publish_many("obatch", [b"c", b"d"], partition=1,
                                             headers={"k": "cd"})
        bare = await producer.publish_many("obatch", [b"e"], partition=1)
        with pytest.raises(InvalidArgument, match="headers"):
            await producer.publish_many("obatch", [b"f", b"g"], partition=1,
                                        headers=[{"k": "f"}])  # one mapping for two bodies
    assert (per_message.count, shared.count, bare.count) == (2, 2, 1)
    got: dict[bytes, Message] = {}
    watch = Watch()

    def record(msg: Message) -> None:
        got[msg.body] = msg
        watch.poke()

    async with Consumer("obatch", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=record, **FAST):
        await watch.until(lambda: len(got) == 5)
    assert {body: m.headers.get("k") for body, m in got.items()} == {
        b"a": "a", b"b": None, b"c": "cd", b"d": "cd", b"e": None}
    publishes = by_kind(exporter, SpanKind.PRODUCER)
    assert sorted(s.attributes["messaging.batch.message_count"] for s in publishes) \
        == [1, 2, 2, 2]
    [refused] = [s for s in publishes if s.attributes.get("error.type")]
    assert failed(refused) == ("InvalidArgument", StatusCode.ERROR, True)
    by_partition_count = {(s.attributes["messaging.destination.partition.id"],
                           s.attributes["messaging.batch.message_count"]): s
                          for s in publishes if not s.attributes.get("error.type")}
    for bodies, key in (((b"a", b"b"), ("0", 2)), ((b"c", b"d"), ("1", 2)), ((b"e",), ("1", 1))):
        span_id = f"{by_partition_count[key].context.span_id:016x}"
        for body in bodies:
            assert got[body].headers["traceparent"].split("-")[2] == span_id


@ONE
async def test_an_unsampled_provider_records_nothing_and_changes_no_result(
        nsq_cluster: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await nsq_cluster.create_topic("ooff", ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer, bounded(10):
        one = await producer.publish("ooff", b"one", trace_id=77)
        nowait = await producer.publish_nowait("ooff", b"two")
        many = await producer.publish_many("ooff", [b"three"])
    assert (one.topic, nowait.topic, many.count) == ("ooff", "ooff", 1)
    got: list[Message] = []
    watch = Watch()

    def record(msg: Message) -> None:
        got.append(msg)
        watch.poke()

    async with Consumer("ooff", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=record, tracer_provider=provider, **FAST):
        await watch.until(lambda: len(got) == 3)
    assert sorted(m.body for m in got) == [b"one", b"three", b"two"]
    # the unsampled decision still travels (its flag's low bit clear): the consumer follows it
    assert all(not int(m.headers["traceparent"].rsplit("-", 1)[1], 16) & 1 for m in got)
    assert exporter.get_finished_spans() == ()


@ONE
async def test_instrument_turns_tracing_and_metrics_on_one_at_a_time(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("oswitch", channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses
    try:
        otel.instrument(tracing=False)
        assert not otel.enabled() and otel_metrics.enabled()
        async with Producer(lookupd=lookupd) as producer:
            assert "publish" not in vars(producer)  # not traced
        otel.uninstrument()
        # no provider given: the global one (the API's no-op here) is asked at creation
        otel.instrument(metrics=False)
        assert otel.enabled() and not otel_metrics.enabled()
        async with Producer(lookupd=lookupd) as producer, bounded(10):
            assert "publish" in vars(producer)  # traced
            result = await producer.publish("oswitch", b"x", trace_id=5)
        assert result.topic == "oswitch" and result.trace_id in (None, 5)
    finally:
        otel.uninstrument()
    assert not otel.enabled() and not otel_metrics.enabled()


# -- the consumer side ---------------------------------------------------------------------------

@ONE
async def test_coroutine_handlers_get_process_spans_with_their_outcome(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oasync", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        await producer.publish_many("oasync", [b"ok", b"flaky"])
    seen: list[tuple[bytes, int]] = []
    watch = Watch()
    tracer = provider.get_tracer("test")

    async def handler(msg: Message) -> None:
        seen.append((msg.body, msg.attempts))
        watch.poke()
        with tracer.start_as_current_span("inner"):  # a child of the process span
            await asyncio.sleep(0)
        if msg.body == b"flaky" and msg.attempts == 1:
            raise ValueError("not yet")

    async with Consumer("oasync", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, tracer_provider=provider, **FAST):
        await watch.until(lambda: len(seen) == 3)
    processes = sorted(by_kind(exporter, SpanKind.CONSUMER),
                       key=lambda s: (s.attributes["messaging.message.body.size"],
                                      s.attributes["messaging.nsq.attempts"]))
    outcomes = [(s.attributes["messaging.nsq.attempts"], s.attributes["messaging.nsq.outcome"],
                 s.attributes.get("error.type")) for s in processes]
    assert sorted(outcomes) == [(1, "fin", None), (1, "req", "ValueError"), (2, "fin", None)]
    inner = [s for s in exporter.get_finished_spans() if s.name == "inner"]
    assert len(inner) == 3
    assert {s.parent.span_id for s in inner} == {s.context.span_id for s in processes}


@ONE
async def test_a_gated_coroutine_handler_spans_the_first_message_then_one_in_n(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("ogate", ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        # ext messages without a trace context: the countdown decides
        await producer.publish_many("ogate", [b"%d" % i for i in range(5)])
    got: list[Message] = []
    watch = Watch()

    async def handler(msg: Message) -> None:
        got.append(msg)
        watch.poke()

    async with Consumer("ogate", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, tracer_provider=provider, span_one_in=2,
                        concurrency=1, **FAST):
        await watch.until(lambda: len(got) == 5)
    spanned = [s.attributes["messaging.message.id"]
               for s in by_kind(exporter, SpanKind.CONSUMER)]
    assert spanned == [str(got[i].internal_id) for i in (0, 2, 4)]


@ONE
async def test_answers_given_by_hand_are_the_outcome(nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("ohand", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        await producer.publish_many("ohand", [b"fin", b"req", b"later"])
    held: list[Message] = []
    watch = Watch()
    handled: list[bytes] = []

    def handler(msg: Message) -> None:
        handled.append(msg.body)
        watch.poke()
        if msg.body == b"fin":
            msg.fin()
        elif msg.body == b"req" and msg.attempts == 1:
            msg.req(0)
        elif msg.body == b"later":
            held.append(msg)  # answered after the handler returned
        else:
            msg.fin()

    async with Consumer("ohand", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, tracer_provider=provider, auto_finish=False, **FAST):
        await watch.until(lambda: len(handled) == 4 and len(held) == 1)
        held[0].fin()
    outcomes = sorted((s.attributes["messaging.message.body.size"],
                       s.attributes["messaging.nsq.attempts"],
                       s.attributes["messaging.nsq.outcome"])
                      for s in by_kind(exporter, SpanKind.CONSUMER))
    # (body sizes: fin 3, req 3, later 5)
    assert outcomes == [(3, 1, "fin"), (3, 1, "req"), (3, 2, "fin"), (5, 1, "none")]


@ONE
async def test_give_ups_are_spanned_with_and_without_a_hook(
        nsq_cluster: Any, spans: Any, caplog: pytest.LogCaptureFixture) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("ogiveup", channels=["ch"])
    await nsq_cluster.create_topic("ogiveup2", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        await producer.publish("ogiveup", b"poison")
        await producer.publish("ogiveup2", b"poison")
    attempts: list[int] = []
    watch = Watch()

    def handler(msg: Message) -> None:
        attempts.append(msg.attempts)
        watch.poke()
        raise RuntimeError("always")

    # no hook of the user's: the span logs the give-up, the consumer finishes the message
    with caplog.at_level(logging.WARNING, "smartnsq"):
        async with Consumer("ogiveup", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                            handler=handler, tracer_provider=provider, max_attempts=1,
                            **FAST) as consumer:
            channel = nsq_cluster.state.topics["ogiveup"].partitions[0].channels["ch"]
            await channel_reaches(channel, lambda: channel.finish_count == 1)
            stats = consumer.stats()
    assert attempts == [1]
    assert (stats.give_ups, stats.finished, stats.requeued) == (1, 1, 1)
    assert any("giving up on" in r.getMessage() and "max_attempts 1" in r.getMessage()
               for r in caplog.records if r.name == "smartnsq.otel")

    # a coroutine hook that raises: the span keeps the error
    hooked: list[int] = []

    async def hook(msg: Message) -> None:
        hooked.append(msg.attempts)
        watch.poke()
        raise KeyError("hook broke")

    async with Consumer("ogiveup2", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, tracer_provider=provider, max_attempts=1,
                        on_give_up=hook, **FAST) as consumer:
        channel = nsq_cluster.state.topics["ogiveup2"].partitions[0].channels["ch"]
        await channel_reaches(channel, lambda: channel.finish_count == 1)
        assert consumer.stats().give_ups == 1
    assert hooked == [2]  # the hook's failure is logged; the message is finished all the same
    give_ups = {s.attributes["messaging.destination.name"]: s
                for s in by_kind(exporter, SpanKind.CONSUMER)
                if s.attributes["messaging.nsq.outcome"] == "give_up"}
    assert set(give_ups) == {"ogiveup", "ogiveup2"}
    assert give_ups["ogiveup"].attributes["messaging.nsq.attempts"] == 2
    assert give_ups["ogiveup"].status.status_code == StatusCode.UNSET
    assert failed(give_ups["ogiveup2"]) == ("KeyError", StatusCode.ERROR, True)


@ONE
async def test_process_span_around_async_for_reads_the_outcome_from_the_message(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oiter", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        await producer.publish_many("oiter", [b"fin", b"req", b"boom", b"none"])
    tracer = provider.get_tracer("test")
    inside: list[int] = []
    left: list[Message] = []
    async with Consumer("oiter", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        tracer_provider=provider, max_in_flight=4, **FAST) as consumer:
        async with bounded(10):
            async for msg in consumer:
                try:
                    with otel.process_span(msg, provider) as span:
                        with tracer.start_as_current_span("work") as work:
                            inside.append(work.parent.span_id)
                        assert span.is_recording()
                        if msg.body == b"fin":
                            msg.fin()
                        elif msg.body == b"req":
                            msg.req(0)
                        elif msg.body == b"boom":
                            raise LookupError("broke by hand")
                        else:
                            left.append(msg)
                except LookupError:
                    msg.fin()
                if len(inside) == 4:
                    break
        for msg in left:
            msg.fin()
    processes = by_kind(exporter, SpanKind.CONSUMER)
    outcomes = sorted((s.attributes["messaging.nsq.outcome"], s.attributes.get("error.type", ""),
                       s.attributes["messaging.consumer.group.name"]) for s in processes)
    assert outcomes == [("fin", "", "ch"), ("none", "", "ch"),
                        ("none", "LookupError", "ch"), ("req", "", "ch")]
    assert sorted(inside) == sorted(s.context.span_id for s in processes)


@pytest.mark.nsq_cluster(nodes=0, classic_nodes=1, lookupds=1, mode="classic")
async def test_classic_messages_are_named_by_their_id(nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oclassic", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer, bounded(10):
        await producer.publish("oclassic", b"classic")
    got: list[Message] = []
    watch = Watch()

    def record(msg: Message) -> None:
        got.append(msg)
        watch.poke()

    async with Consumer("oclassic", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=record, tracer_provider=provider, **FAST):
        await watch.until(lambda: len(got) == 1)
    [publish] = by_kind(exporter, SpanKind.PRODUCER)
    [process] = by_kind(exporter, SpanKind.CONSUMER)
    assert "messaging.destination.partition.id" not in publish.attributes
    assert process.attributes["messaging.message.id"] == got[0].id.decode()
    assert "messaging.destination.partition.id" not in process.attributes
    assert "messaging.nsq.queue_offset" not in process.attributes
    assert process.attributes["messaging.nsq.outcome"] == "fin"


@ONE
async def test_gated_publish_calls_of_every_kind_go_untraced_between_spans(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("opgate", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses, tracer_provider=provider,
                        span_one_in=3) as producer, bounded(10):
        await producer.publish("opgate", b"1")  # the first: traced
        await producer.publish_nowait("opgate", b"2")
        await producer.publish_many("opgate", [b"3"])
        await producer.publish_many("opgate", [b"4", b"5"])  # one in three: traced
        await producer.publish_nowait("opgate", b"6")
        await producer.publish("opgate", b"7")
        result = await producer.publish_nowait("opgate", b"8")  # traced
    assert result.topic == "opgate"
    traced = sorted((s.attributes.get("messaging.batch.message_count", 0),
                     s.attributes.get("messaging.message.body.size", 0))
                    for s in by_kind(exporter, SpanKind.PRODUCER))
    assert traced == [(0, 1), (0, 1), (2, 0)]


@ONE
async def test_a_traceparent_decides_for_gated_handlers_and_a_bad_one_leaves_it_to_the_gate(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("ohdr", ext=True, channels=["a", "b"])
    trace, span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        for body, traceparent in ((b"garbage", "not-a-traceparent"),
                                  (b"sampled", f"00-{trace}-{span}-01"),
                                  (b"unsampled", f"00-{trace}-{span}-00"),
                                  (b"garbage again", "x" * 55)):
            await producer.publish("ohdr", body, headers={"traceparent": traceparent})
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    watch = Watch()

    async def on_a(msg: Message) -> None:
        got["a"].append(msg.body)
        watch.poke()

    def on_b(msg: Message) -> None:
        got["b"].append(msg.body)
        watch.poke()

    async with Consumer("ohdr", "a", lookupd=nsq_cluster.lookupd_http_addresses, handler=on_a,
                        tracer_provider=provider, span_one_in=1000, concurrency=1, **FAST), \
            Consumer("ohdr", "b", lookupd=nsq_cluster.lookupd_http_addresses, handler=on_b,
                     tracer_provider=provider, span_one_in=1000, **FAST):
        await watch.until(lambda: len(got["a"]) == len(got["b"]) == 4)
    assert got["a"] == got["b"] == [b"garbage", b"sampled", b"unsampled", b"garbage again"]
    for channel in ("a", "b"):
        processes = [s for s in by_kind(exporter, SpanKind.CONSUMER)
                     if s.attributes["messaging.consumer.group.name"] == channel]
        # the sampled one (a child of the remote parent), and the gate's first (no parent)
        parents = sorted(s.parent.span_id if s.parent else 0 for s in processes)
        assert parents == [0, int(span, 16)]
        assert all(s.attributes["messaging.message.body.size"] == 7 for s in processes)
