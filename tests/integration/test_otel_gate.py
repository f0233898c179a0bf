"""``span_one_in``: smartnsq's gate in front of the OpenTelemetry SDK (issue 22's tracing
cost), against the dev cluster with the SDK's in-memory exporter. One message in N gets a
process span, one call in N a publish span; a sampled publish on an ext topic keeps its
consumer span whatever the consumer's gate; a publish inside a recording span is traced.
Skipped without the ``otel`` extra."""

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

from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.producer import Producer

FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5}


def provider_and_exporter() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def spans_of(exporter: InMemorySpanExporter, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


async def consume(cluster: Any, topic: str, count: int, provider: Any,
                  **options: Any) -> list[Message]:
    got: list[Message] = []
    watch = Watch()

    def record(msg: Message) -> None:
        got.append(msg)
        watch.poke()

    async with Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=record,
                        tracer_provider=provider, **FAST, **options):
        await watch.until(lambda: len(got) >= count)
    return got


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_the_consumer_spans_the_first_message_then_one_in_n(nsq_cluster: Any) -> None:
    provider, exporter = provider_and_exporter()
    await nsq_cluster.create_topic("gate", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer, bounded(10):
        await producer.publish_many("gate", [b"%d" % i for i in range(9)])
    got = await consume(nsq_cluster, "gate", 9, provider, span_one_in=4)
    processes = spans_of(exporter, SpanKind.CONSUMER)
    assert len(got) == 9
    # the 1st, 5th and 9th messages handled, in the order they were handled
    spanned = [str(got[i].internal_id) for i in (0, 4, 8)]
    assert [p.attributes["messaging.message.id"] for p in processes] == spanned


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_sampled_publish_keeps_its_consumer_span_whatever_the_consumers_gate(
        nsq_cluster: Any) -> None:
    provider, exporter = provider_and_exporter()
    await nsq_cluster.create_topic("gext", ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses, tracer_provider=provider,
                        span_one_in=2) as producer, bounded(10):
        for i in range(6):
            await producer.publish("gext", b"%d" % i)
    publishes = spans_of(exporter, SpanKind.PRODUCER)
    assert len(publishes) == 3  # the 1st, 3rd and 5th calls
    got = await consume(nsq_cluster, "gext", 6, provider, span_one_in=1000)
    assert [("traceparent" in m.headers) for m in got] == [True, False] * 3
    processes = spans_of(exporter, SpanKind.CONSUMER)
    children = [p for p in processes if p.parent is not None]
    assert sorted(p.parent.span_id for p in children) == sorted(
        p.context.span_id for p in publishes)
    # the messages without a trace context: the gate's first one only (then 1 in 1000)
    assert [p.attributes["messaging.message.id"] for p in processes if p.parent is None] \
        == [str(got[1].internal_id)]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_publish_inside_a_recording_span_is_always_traced(nsq_cluster: Any) -> None:
    provider, exporter = provider_and_exporter()
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
    publishes = spans_of(exporter, SpanKind.PRODUCER)
    assert len(publishes) == 4
    inside = [p for p in publishes if p.parent is not None]
    assert len(inside) == 3
    assert all(p.parent.span_id == request.get_span_context().span_id for p in inside)
