"""OpenTelemetry's messaging metrics: a metered producer and consumer, collected and printed.

    python examples/otel_metrics.py

``Producer(..., meter_provider=provider)`` and ``Consumer(..., meter_provider=provider)``
report the semantic conventions' messaging metrics: ``messaging.client.sent.messages`` and
``messaging.client.consumed.messages`` (observable counters read from the clients' stats()
when the reader collects: nothing per message), ``messaging.client.operation.duration``
(publish) and ``messaging.process.duration`` (the handler), histograms recorded on the calls
the counters already time (a sample: the counters give the rates). The demo publishes to a
2-partition topic on a dev cluster, consumes it (one handler call in five raises once, for an
``error.type``), collects with the SDK's in-memory reader and prints every series. In
production give the provider a ``PeriodicExportingMetricReader`` (OTLP, Prometheus...)
instead. Needs the ``otel`` extra and opentelemetry-sdk.
"""

from __future__ import annotations

import asyncio
import logging

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from smartnsq import BackoffPolicy, Consumer, Message, Producer, RequeuePolicy
from smartnsq.devcluster import DevCluster

TOPIC, CHANNEL, MESSAGES = "orders", "billing", 200
SHORT = {"messaging.destination.partition.id": "partition", "messaging.client.id": "client",
         "error.type": "error.type", "messaging.operation.name": "operation"}


def show(reader: InMemoryMetricReader) -> None:
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                print(f"{metric.name} ({metric.unit})")
                for point in sorted(metric.data.data_points,
                                    key=lambda p: sorted(p.attributes.items())):
                    labels = " ".join(f"{SHORT[k]}={v}" for k, v in sorted(
                        point.attributes.items()) if k in SHORT)
                    if hasattr(point, "count"):  # a histogram
                        print(f"  {labels}: count {point.count}, "
                              f"mean {point.sum / point.count * 1000:.3f} ms")
                    else:
                        print(f"  {labels}: {point.value}")


async def main() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with DevCluster(nodes=2, lookupds=1) as cluster:
        await cluster.create_topic(TOPIC, partitions=2, channels=[CHANNEL])
        lookupd = cluster.lookupd_http_addresses
        done = asyncio.Event()
        seen: set[bytes] = set()
        handled = 0

        def handle(message: Message) -> None:
            nonlocal handled
            body = bytes(message.body)
            if int(body.split()[-1]) % 5 == 0 and body not in seen:
                seen.add(body)
                raise ValueError("not yet")  # requeued, handled again: an error.type
            handled += 1
            if handled == MESSAGES:
                done.set()

        async with Producer(lookupd=lookupd, meter_provider=provider) as producer, \
                Consumer(TOPIC, CHANNEL, lookupd=lookupd, handler=handle,
                         meter_provider=provider, backoff_policy=BackoffPolicy(enabled=False),
                         requeue_policy=RequeuePolicy(initial=0.0, cap=0.0)):
            for i in range(MESSAGES):
                await producer.publish(TOPIC, b"order %d" % i, sharding_key=i)
            await asyncio.wait_for(done.wait(), 60)
            show(reader)  # collect while both are open: a closed client stops reporting


if __name__ == "__main__":
    logging.getLogger("smartnsq.consumer").setLevel(logging.ERROR)  # (the requeues' warnings)
    asyncio.run(main())
