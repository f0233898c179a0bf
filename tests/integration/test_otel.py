"""OpenTelemetry spans against the dev cluster, exported to the SDK's in-memory
exporter: a published message's process span is a child of its publish span on ext topics
(W3C trace context in the ext JSON headers), linked by the youzan trace id elsewhere;
outcomes, attributes, the global switch, and ``span_one_in`` (one message or call in N gets a
span; sampled trace contexts and publishes inside a recording span always do). The parent
and the link run on the real servers too (``nsq_any_cluster``). Skipped
without the ``otel`` extra."""

from __future__ import annotations

from typing import Any

import pytest
from support import Watch, bounded

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind

import smartnsq.observability.otel
from smartnsq import Consumer, Producer
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy

FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5}


@pytest.fixture
def spans() -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_kind(exporter: InMemorySpanExporter, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


async def consume(cluster: Any, topic: str, count: int, provider: Any,
                  handler: Any = None, **options: Any) -> list[Message]:
    got: list[Message] = []
    watch = Watch()

    def record(msg: Message) -> None:
        if handler is not None:
            handler(msg)
        got.append(msg)
        watch.poke()

    async with Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=record,
                        tracer_provider=provider, **FAST, **options):
        await watch.until(lambda: len(got) >= count)
    return got


async def test_on_ext_topics_the_process_span_is_a_child_of_the_publish_span(
        nsq_any_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_any_cluster.create_topic("oext", partitions=2, ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer:
        async with bounded(10):
            result = await producer.publish("oext", b"one", partition=1,
                                            headers={"kind": "order"})
        async with bounded(10):
            await producer.publish_nowait("oext", b"two", partition=0)
    [first, second] = await consume(nsq_any_cluster, "oext", 2, provider)
    publishes = by_kind(exporter, SpanKind.PRODUCER)
    processes = by_kind(exporter, SpanKind.CONSUMER)
    assert len(publishes) == 2 and len(processes) == 2
    assert {m.headers["kind"] for m in (first, second) if "kind" in m.headers} == {"order"}
    assert all("traceparent" in m.headers for m in (first, second))
    for process in processes:
        parent = next(p for p in publishes
                      if p.attributes["messaging.destination.partition.id"]
                      == process.attributes["messaging.destination.partition.id"])
        assert process.parent is not None
        assert process.parent.span_id == parent.context.span_id
        assert process.context.trace_id == parent.context.trace_id
        assert process.attributes["messaging.nsq.outcome"] == "fin"
        assert process.attributes["messaging.system"] == "nsq"
        assert process.attributes["messaging.destination.name"] == "oext"
        assert process.attributes["messaging.consumer.group.name"] == "ch"
        assert process.attributes["messaging.message.id"].isdigit()
    one = next(p for p in publishes if p.attributes["messaging.destination.partition.id"] == "1")
    assert one.name == "publish oext"
    assert one.attributes["messaging.operation.type"] == "send"
    assert one.attributes["server.address"] == "127.0.0.1"
    if result.queue_offset is not None:
        assert one.attributes["messaging.nsq.queue_offset"] == result.queue_offset


async def test_elsewhere_both_spans_link_to_the_youzan_trace_id(
        nsq_any_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_any_cluster.create_topic("oplain", channels=["ch"])
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer, bounded(10):
        await producer.publish("oplain", b"traced", trace_id=4242)
    [msg] = await consume(nsq_any_cluster, "oplain", 1, provider)
    assert msg.trace_id == 4242 and "traceparent" not in msg.headers
    [publish] = by_kind(exporter, SpanKind.PRODUCER)
    [process] = by_kind(exporter, SpanKind.CONSUMER)
    assert process.parent is None
    for span in (publish, process):
        [link] = span.links
        assert link.context.trace_id == 4242 and link.context.span_id == 4242
        assert span.attributes["messaging.nsq.trace_id"] == 4242


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_outcomes_req_then_fin_and_give_up(nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oout", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:  # untraced
        await producer.publish("oout", b"flaky")
        await producer.publish("oout", b"poison")
    seen: dict[bytes, int] = {}

    def handler(msg: Message) -> None:
        seen[msg.body] = seen.get(msg.body, 0) + 1
        if msg.body == b"poison" or seen[msg.body] == 1:
            raise RuntimeError("not yet")

    gave_up: list[Message] = []
    watch = Watch()

    def on_give_up(msg: Message) -> None:
        gave_up.append(msg)
        watch.poke()

    async with Consumer("oout", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, tracer_provider=provider, max_attempts=2,
                        on_give_up=on_give_up, backoff_policy=BackoffPolicy(enabled=False),
                        requeue_policy=RequeuePolicy(initial=0.0, cap=0.0), **FAST):
        await watch.until(lambda: gave_up and seen.get(b"flaky") == 2)
    assert not by_kind(exporter, SpanKind.PRODUCER)
    outcomes = sorted((s.attributes["messaging.nsq.attempts"],
                       s.attributes["messaging.nsq.outcome"])
                      for s in by_kind(exporter, SpanKind.CONSUMER))
    assert outcomes == [(1, "req"), (1, "req"), (2, "fin"), (2, "req"), (3, "give_up")]
    failed = [s for s in by_kind(exporter, SpanKind.CONSUMER)
              if s.attributes["messaging.nsq.outcome"] == "req"]
    assert all(s.attributes["error.type"] == "RuntimeError" for s in failed)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_instrument_traces_clients_created_afterwards(nsq_cluster: Any,
                                                            spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oglobal", channels=["ch"])
    smartnsq.observability.otel.instrument(provider)
    try:
        async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
            await producer.publish("oglobal", b"x")
    finally:
        smartnsq.observability.otel.uninstrument()
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        await producer.publish("oglobal", b"y")
        assert "publish" not in vars(producer)  # an untraced client is not wrapped
    assert len(by_kind(exporter, SpanKind.PRODUCER)) == 1


# -- span_one_in: the gate in front of the SDK ----------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_span_one_in_the_consumer_spans_the_first_message_then_one_in_n(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("gate", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        await producer.publish_many("gate", [b"%d" % i for i in range(9)])
    got = await consume(nsq_cluster, "gate", 9, provider, span_one_in=4)
    processes = by_kind(exporter, SpanKind.CONSUMER)
    assert len(got) == 9
    # the 1st, 5th and 9th messages handled, in the order they were handled
    spanned = [str(got[i].internal_id) for i in (0, 4, 8)]
    assert [p.attributes["messaging.message.id"] for p in processes] == spanned


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_span_one_in_a_sampled_publish_keeps_its_consumer_span_whatever_the_gate(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("gext", ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses, tracer_provider=provider,
                        span_one_in=2) as producer, bounded(10):
        for i in range(6):
            await producer.publish("gext", b"%d" % i)
    publishes = by_kind(exporter, SpanKind.PRODUCER)
    assert len(publishes) == 3  # the 1st, 3rd and 5th calls
    got = await consume(nsq_cluster, "gext", 6, provider, span_one_in=1000)
    assert [("traceparent" in m.headers) for m in got] == [True, False] * 3
    processes = by_kind(exporter, SpanKind.CONSUMER)
    children = [p for p in processes if p.parent is not None]
    assert sorted(p.parent.span_id for p in children) == sorted(
        p.context.span_id for p in publishes)
    # the messages without a trace context: the gate's first one only (then 1 in 1000)
    assert [p.attributes["messaging.message.id"] for p in processes if p.parent is None] \
        == [str(got[1].internal_id)]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_span_one_in_a_publish_inside_a_recording_span_is_always_traced(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("gin", channels=["ch"])
    tracer = provider.get_tracer("test")
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses, tracer_provider=provider,
                        span_one_in=1000) as producer, bounded(10):
        await producer.publish("gin", b"first")  # the gate's first call
        await producer.publish("gin", b"gated out")
        with tracer.start_as_current_span("request") as request:
            await producer.publish("gin", b"inside")
            await producer.publish_nowait("gin", b"inside too")
            await producer.publish_many("gin", [b"a", b"b"])
    publishes = by_kind(exporter, SpanKind.PRODUCER)
    assert len(publishes) == 4
    inside = [p for p in publishes if p.parent is not None]
    assert len(inside) == 3
    assert all(p.parent.span_id == request.get_span_context().span_id for p in inside)
