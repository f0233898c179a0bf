"""OpenTelemetry across two processes: a publish span here, its process span in a consumer
process, one trace.

    python examples/otel_tracing.py

This process starts a dev cluster, creates an ext topic, and publishes a few orders with a
Producer given ``tracer_provider=``: each publish is a PRODUCER span, and its W3C trace
context (``traceparent``) travels in the message's ext JSON headers. A consumer runs in a
subprocess (this script with ``--consume``), with its own tracer provider: each handled
message is a CONSUMER span whose parent is the publish span. The consumer asks for a span on
one message in 1000 only (``span_one_in=1000``, what a busy consumer would set), yet every
message here gets one: a message carrying a sampled trace context follows the producer's
decision. Both processes export to the
SDK's in-memory exporter; the consumer prints its spans as JSON lines, and this process
prints the joined trace and checks that every process span is a child of a publish span.

Needs the ``otel`` extra and the OpenTelemetry SDK (``pip install -e '.[otel]'
opentelemetry-sdk``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from smartnsq import Consumer, Message, Producer
from smartnsq.devcluster import DevCluster

TOPIC, CHANNEL, ORDERS = "payments", "ledger", 3


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def as_record(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None
    return {"name": span.name, "kind": span.kind.name,
            "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
            "attributes": dict(span.attributes or {})}


async def consume(lookupd: str) -> None:
    """The consumer process: handle ORDERS messages, print each process span."""
    provider, exporter = tracing()
    done = asyncio.Event()
    handled = 0

    def handle(message: Message) -> None:
        nonlocal handled
        handled += 1
        if handled == ORDERS:
            done.set()

    async with Consumer(TOPIC, CHANNEL, lookupd=[lookupd], handler=handle,
                        tracer_provider=provider, span_one_in=1000):
        await asyncio.wait_for(done.wait(), 60)
    for span in exporter.get_finished_spans():
        print(json.dumps(as_record(span)), flush=True)


async def main() -> None:
    provider, exporter = tracing()
    async with DevCluster(nodes=2, lookupds=1) as cluster:
        await cluster.create_topic(TOPIC, partitions=2, ext=True, channels=[CHANNEL])
        lookupd = cluster.lookupd_http_addresses[0]
        async with Producer(lookupd=[lookupd], tracer_provider=provider) as producer:
            for order in range(1, ORDERS + 1):
                await producer.publish(TOPIC, b"order %d paid" % order, sharding_key=order,
                                       headers={"kind": "payment"})
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--consume", lookupd, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(child.communicate(), 120)
        if child.returncode != 0:
            raise SystemExit(f"the consumer process failed ({child.returncode})")
    published = [as_record(s) for s in exporter.get_finished_spans()]
    processed = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    by_id = {s["span_id"]: s for s in published}
    print(f"{len(published)} publish spans in this process (pid {os.getpid()}), "
          f"{len(processed)} process spans in the consumer's (pid {child.pid}):")
    for span in processed:
        parent = by_id.get(span["parent_id"])
        if parent is None or parent["trace_id"] != span["trace_id"]:
            raise SystemExit(f"process span {span['span_id']} is not a child of a publish span")
        attrs = span["attributes"]
        print(f"  trace {span['trace_id']}")
        print(f"    {parent['kind']:<8} {parent['name']:<18} span {parent['span_id']} "
              f"partition {parent['attributes'].get('messaging.destination.partition.id')}, "
              f"offset {parent['attributes'].get('messaging.nsq.queue_offset')}")
        print(f"    {span['kind']:<8} {span['name']:<18} span {span['span_id']} "
              f"(parent {span['parent_id']}) message {attrs.get('messaging.message.id')}, "
              f"outcome {attrs.get('messaging.nsq.outcome')}")
    print("every process span is a child of its publish span")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--consume", metavar="LOOKUPD", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(consume(args.consume) if args.consume else main())
