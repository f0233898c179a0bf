"""OpenTelemetry spans (issue 22) against the dev cluster, exported to the SDK's in-memory
exporter: a published message's process span is a child of its publish span on ext topics
(W3C trace context in the ext JSON headers), linked by the youzan trace id elsewhere;
outcomes, attributes, the global switch. Skipped without the ``otel`` extra."""

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

import smartnsq.otel
from smartnsq.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.producer import Producer

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


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_on_ext_topics_the_process_span_is_a_child_of_the_publish_span(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oext", partitions=2, ext=True, channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer:
        async with bounded(10):
            result = await producer.publish("oext", b"one", partition=1,
                                            headers={"kind": "order"})
        async with bounded(10):
            await producer.publish_nowait("oext", b"two", partition=0)
    [first, second] = await consume(nsq_cluster, "oext", 2, provider)
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


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_elsewhere_both_spans_link_to_the_youzan_trace_id(
        nsq_cluster: Any, spans: Any) -> None:
    provider, exporter = spans
    await nsq_cluster.create_topic("oplain", channels=["ch"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses,
                        tracer_provider=provider) as producer, bounded(10):
        await producer.publish("oplain", b"traced", trace_id=4242)
    [msg] = await consume(nsq_cluster, "oplain", 1, provider)
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
    smartnsq.otel.instrument(provider)
    try:
        async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
            await producer.publish("oglobal", b"x")
    finally:
        smartnsq.otel.uninstrument()
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        await producer.publish("oglobal", b"y")
        assert "publish" not in vars(producer)  # an untraced client is not wrapped
    assert len(by_kind(exporter, SpanKind.PRODUCER)) == 1
