"""Consume throughput: smartnsq's Consumer against the Python peers, same endpoint, same run.

    python bench/consume.py [--quick] [--server minimal|devcluster|real|nsqd=HOST:PORT[,...]]
                            [--messages N] [--max-in-flight 200,2500] [--rounds R]
                            [--clients smartnsq,smartnsq-conn,pynsq,...] [--via nsqd|lookupd]
                            [--loop asyncio|uvloop] [--prefix COMMAND]

By default (``--server minimal``) the endpoint is ``bench/_endpoint.py`` in its own process:
after SUB it pushes pre-built classic frames (100-byte bodies) as fast as RDY allows, never
more in flight than the last RDY, refilling on every FIN, so the client is what is measured.
Each client consumes N messages at each max_in_flight (200 and 2500); besides the rates the
table gives peak memory (``ru_maxrss`` at the end minus the reading after imports), FINs per
read at the endpoint (how well the client coalesces its FIN writes) and the largest number of
messages the endpoint had in flight against the largest RDY; the goal (>= 3x the best Python
peer) is printed.

``--server devcluster``: before each run N messages (100-byte
bodies) are loaded into a fresh topic's channel on one
classic nsqd of the dev cluster (its own process, loopback; ``--cluster youzan``: one youzan
nsqd, a one-partition topic, peers subscribing without a partition); then one client, in its own
interpreter, subscribes with max_in_flight M and finishes every message from a handler
that only counts. msg/s is the steady rate, from the first message handled to the N-th;
"first msg" is the time from creating the client to its first message (connect, IDENTIFY,
SUB, and for smartnsq via lookupd the lookup); "overall" is N over creation-to-last;
"CPU us/msg" is the client's process CPU time per message over the steady stretch (its
own cost, much less disturbed by the server and the machine's other load than a rate).
Draining and closing are not timed. The channel is checked
afterwards: what is left in it (depth + in flight) should be nothing but the last few FINs
a peer did not flush before stopping.

``--server nsqd=HOST:PORT[,lookupd=HOST:PORT][,http=HOST:PORT]`` runs the same as
``devcluster`` against a server this script does not start (a real nsqd 1.3.0; ``http``
defaults to the TCP port + 1): a fresh topic and channel per run over nsqd's HTTP API, loaded
by MPUB, drained, checked, deleted. With ``--cluster youzan`` the topic has one partition and
the given nsqd must lead it (a one-node youzan cluster); ``bench/youzan.py`` covers
partitioned clusters. ``--loop uvloop`` runs the asyncio clients on uvloop (with ``python
-O``: see ``bench/publish.py``). ``--prefix 'perf stat -e ... -o FILE'`` runs the Python
client workers of ``--server real`` under a command: system calls and user/system time per
message by the difference of two ``--messages`` counts (where a consumed message's cost goes).

``--server real`` (binaries from ``--real DIR`` or ``$SMARTNSQ_REAL_NSQ``) starts a real
classic nsqd 1.3.0 here (``bench/_real.py``) and runs smartnsq on asyncio and on uvloop, the
raw Connection, the Python peers and the Go tools (``nsq_tail``, ``bench_reader``) at
max_in_flight 200 and 2500, interleaved, with the nsqd's own CPU per message, and prints the
goals against the real nsqd (see ``bench/README.md``). Each channel holds more than the N
messages timed (the surplus: 4 x max_in_flight or N / 10), because nsqd holds a client's last
partial write until its 250 ms output-buffer timer ticks: a client timed to the channel's last
message was timed to that tick (the rates came out as 100k, 133k, 200k: N in 1.0, 0.75, 0.5 s).

Clients: ``smartnsq`` is ``smartnsq.Consumer`` with a plain-function handler (run
on the event loop, FIN on return); ``smartnsq-conn`` is the raw ``smartnsq.transport.connection``
path under it (``on_message`` callback, FIN per message), which shows what the consumer's
flow control, queue and handler dispatch cost. pynsq: ``nsq.Reader`` (tornado); gnsq:
``gnsq.Consumer`` (gevent); ansq: ``open_connection`` + ``subscribe`` + ``messages()``;
asyncnsq: ``create_reader`` + ``messages()``; each peer finishes the message its documented
way. With ``--rounds R`` the clients take turns R times (the order rotates) and the best
rate and the lowest CPU cost are kept. Ratios are each client's figure over smartnsq's
Consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import importlib.util
import os
import sys
import time
from typing import Any

from _common import (
    PEERS,
    PURE_SUFFIX,
    RawClient,
    ServerSpec,
    baseline_name,
    cluster_server,
    command_line,
    emit,
    environment,
    fmt_kib,
    fmt_rate,
    fmt_ratio,
    max_rss_kib,
    merge,
    minimal_endpoint,
    peer_available,
    run_worker,
    server_arg,
    set_baseline,
    table,
    topic_part,
    with_baseline,
)

from smartnsq.protocol.frames import CLASSIC_LAYOUT, YOUZAN_LAYOUT

CHANNEL = "bench"
CLIENTS = ("smartnsq", "smartnsq-conn", *PEERS)
# uvloop's transports are not asyncio.Transport subclasses, which Connection.connection_made
# asserts: uvloop workers run with python -O until that assertion goes (see publish.py)
OPT: dict[str, list[str]] = {"asyncio": [], "uvloop": ["-O"]}


# -- workers ----------------------------------------------------------------------------------

class Clock:
    """Created before the client connects; marks the first and the last message handled."""

    def __init__(self) -> None:
        self.created = time.perf_counter()
        self.t_first = self.t_last = 0.0
        self.cpu_first = self.cpu_last = 0.0

    def first(self) -> None:
        self.t_first = time.perf_counter()
        self.cpu_first = time.process_time()

    def last(self) -> None:
        self.t_last = time.perf_counter()
        self.cpu_last = time.process_time()


def sdk_tracer_provider(variant: str = "") -> Any:
    """An OpenTelemetry SDK provider sampling every span (a variant ending in ``1pct``: one
    trace in 100, parent-based, as production runs it), with an in-memory exporter behind
    a simple span processor (each ended span is handed over at once): what a test setup
    costs, with no network export in the measurement."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    class Dropping(InMemorySpanExporter):  # keeps nothing: memory stays flat over N spans
        def export(self, spans: Any) -> Any:
            return super().export(())

    sampler = ParentBased(TraceIdRatioBased(0.01)) if variant.endswith("1pct") else ALWAYS_ON
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    return provider


def sdk_metered(meter: Any) -> tuple[Any, Any]:
    """(the consumer's meter as ``Consumer(meter_provider=...)`` makes it, the process
    duration histogram's ``record``) over an SDK MeterProvider with an in-memory reader that
    is never collected: the per-message cost, without an export in the measurement."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from smartnsq.observability import otel_metrics

    class Stand:  # the consumer the observable counters would read (never collected here)
        topic, channel, closed = "bench_sub", CHANNEL, False

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    stand = Stand()
    metered = otel_metrics.consumer_meter(stand, meter, provider)
    sdk_metered.keep = (provider, stand)  # type: ignore[attr-defined]  # alive for the run
    return metered, provider.get_meter("smartnsq").create_histogram(
        otel_metrics.PROCESS, unit="s",
        explicit_bucket_boundaries_advisory=otel_metrics.DURATION_BOUNDS).record


def work_smartnsq(addr: str, lookupd: str, topic: str, count: int, mif: int,
                  variant: str = "") -> Clock:
    """``variant``: "" plain; "otel": the consumer traced (every message sampled); "span":
    the plain consumer whose handler starts and ends one bare SDK span (the SDK's floor)."""
    from smartnsq import Consumer

    extra: dict[str, Any] = {}
    bare: Any = None
    if variant.startswith("otel"):
        extra["tracer_provider"] = sdk_tracer_provider(variant)
    elif variant.startswith("span"):
        bare = sdk_tracer_provider(variant).get_tracer("bench").start_span

    async def run() -> Clock:
        done = asyncio.get_running_loop().create_future()
        seen = 0

        def handler(message: Any) -> None:
            nonlocal seen
            if bare is not None:
                bare("process").end()
            seen += 1
            if seen == 1:
                clock.first()
            if seen == count:
                clock.last()
                done.set_result(None)

        where: dict[str, Any] = {"lookupd": [lookupd]} if lookupd else {"nsqd": [addr]}
        clock = Clock()
        consumer = Consumer(topic, CHANNEL, handler=handler, max_in_flight=mif, **where,
                            **extra)
        async with consumer:
            await asyncio.wait_for(done, 600)
        return clock

    return asyncio.run(run())


def work_smartnsq_conn(addr: str, topic: str, count: int, mif: int) -> Clock:
    from smartnsq.protocol import commands
    from smartnsq.protocol.frames import MessageLayout
    from smartnsq.transport.connection import Connection

    async def run() -> Clock:
        done = asyncio.get_running_loop().create_future()
        seen = 0
        fin = commands.fin
        conn: Any = None

        def on_message(message: Any) -> None:
            nonlocal seen
            conn.send(fin(message.id))
            seen += 1
            if seen == 1:
                clock.first()
            if seen == count:
                clock.last()
                done.set_result(None)

        host, port = addr.rsplit(":", 1)
        clock = Clock()
        conn = await Connection.connect(host, int(port), on_message=on_message)
        conn.layout = MessageLayout.for_subscription(youzan=conn.is_youzan,
                                                     extend_support=False, command="SUB")
        await conn.request(commands.sub(topic, CHANNEL, 0 if conn.is_youzan else None))
        conn.send(commands.rdy(mif))
        await asyncio.wait_for(done, 600)
        await conn.close()
        return clock

    return asyncio.run(run())


def work_pynsq(addr: str, topic: str, count: int, mif: int) -> Clock:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    seen = 0

    def handler(message: Any) -> bool:
        nonlocal seen
        seen += 1
        if seen == 1:
            clock.first()
        if seen == count:
            clock.last()
            loop.add_callback(loop.stop)
        return True  # FIN

    clock = Clock()
    nsq.Reader(topic=topic, channel=CHANNEL, message_handler=handler,
               nsqd_tcp_addresses=[addr], max_in_flight=mif)
    loop.start()
    return clock


def work_gnsq(addr: str, topic: str, count: int, mif: int) -> Clock:
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    import gnsq

    seen = 0
    clock = Clock()
    consumer = gnsq.Consumer(topic, CHANNEL, nsqd_tcp_addresses=[addr], max_in_flight=mif)

    @consumer.on_message.connect
    def handler(consumer_: Any, message: Any) -> None:
        nonlocal seen
        seen += 1  # returning finishes the message
        if seen == 1:
            clock.first()
        if seen == count:
            clock.last()
            consumer.close()

    consumer.start(block=True)
    return clock


def work_ansq(addr: str, topic: str, count: int, mif: int) -> Clock:
    import ansq

    host, port = addr.rsplit(":", 1)

    async def run() -> Clock:
        seen = 0
        clock = Clock()
        conn = await ansq.open_connection(host, int(port))
        await conn.subscribe(topic, CHANNEL, mif)
        async for message in conn.messages():
            await message.fin()
            seen += 1
            if seen == 1:
                clock.first()
            if seen == count:
                clock.last()
                break
        await conn.close()
        return clock

    return asyncio.run(run())


def work_asyncnsq(addr: str, topic: str, count: int, mif: int) -> Clock:
    import asyncnsq

    async def run() -> Clock:
        seen = 0
        clock = Clock()
        reader = await asyncnsq.create_reader(nsqd_tcp_addresses=[addr], max_in_flight=mif)
        await reader.subscribe(topic, CHANNEL)
        async for message in reader.messages():
            await message.fin()
            seen += 1
            if seen == 1:
                clock.first()
            if seen == count:
                clock.last()
                break
        reader.close()
        return clock

    return asyncio.run(run())


def work_smartnsq_path(count: int, mif: int, ordered: bool, variant: str = "") -> Clock:
    """The Consumer's own layer, in process, without sockets: a link with the real runtime,
    flow control, dispatch and inline handler, fed ``count`` decoded messages (one read's
    worth, ``mif`` at a time) with a connection stand-in whose ``send`` drops the bytes.
    Deterministic, so callgrind's N/3N difference is the exact per-message cost of
    delivery, counting, RDY accounting, the handler call and the FIN's settling (the frame
    decoding and the socket writes are not in it). ``ordered``: a youzan SUB_ORDERED link
    (detail block, order checks, the lane, the partition's own back-off). ``variant``
    "otel": the handler traced as the Consumer traces it (every message sampled); "span":
    the handler starts and ends one bare span of the same provider (the SDK's floor);
    "metrics": metered as ``Consumer(meter_provider=...)`` meters; "metricsall": the same
    with the process duration recorded on every handler call (what sampling saves)."""
    import threading
    from types import SimpleNamespace

    from smartnsq.consumer.config import ConsumerConfig
    from smartnsq.consumer.dispatch import Dispatch
    from smartnsq.consumer.flow import Flow
    from smartnsq.consumer.handling import inline_runner
    from smartnsq.consumer.link import Link
    from smartnsq.consumer.runtime import Runtime
    from smartnsq.message import Message

    loop = asyncio.new_event_loop()
    cfg = ConsumerConfig()
    rt = Runtime("bench_sub", CHANNEL, cfg)
    rt.loop = loop
    rt.loop_thread_id = threading.get_ident()
    rt.queue = Dispatch(loop)
    rt.flow = Flow(loop, mif, cfg.backoff_policy, cfg.rdy_tick_interval,
                   cfg.low_rdy_idle_timeout)
    rt.concurrency = 1
    seen = 0
    clock = Clock()

    bare: Any = None
    if variant.startswith("span"):
        bare = sdk_tracer_provider(variant).get_tracer("bench").start_span

    def handler(message: Any) -> None:
        nonlocal seen
        if bare is not None:
            bare("process").end()
        seen += 1

    run: Any = handler
    if variant.startswith("otel"):
        from smartnsq.observability import otel

        if variant[4:].isdigit():  # "otelN": span_one_in N, smartnsq's gate before the SDK
            cfg = dataclasses.replace(cfg, span_one_in=int(variant[4:]))
        run, cfg = otel.consumer_tracing("bench_sub", CHANNEL, handler, cfg,
                                         sdk_tracer_provider(variant))
    elif variant.startswith("metrics"):  # "metrics": as the Consumer meters (sampled);
        # "metricsall": the process duration recorded on every call instead
        rt.meter, record = sdk_metered(rt.meter)
        if variant == "metricsall":
            from time import perf_counter

            attributes = {"messaging.system": "nsq", "messaging.operation.name": "process",
                          "messaging.operation.type": "process",
                          "messaging.destination.name": "bench_sub",
                          "messaging.consumer.group.name": CHANNEL,
                          "messaging.destination.subscription.name": CHANNEL}

            def run(message: Any) -> None:
                started = perf_counter()
                handler(message)
                record(perf_counter() - started, attributes)
    rt.run_now = inline_runner(rt, run)

    def send(data: bytes, now: bool = False) -> None:
        pass

    conn: Any = SimpleNamespace(send=send, send_now=send, address_text="127.0.0.1:4150",
                                is_youzan=ordered,
                                local_address="127.0.0.1:1", is_closed=False,
                                last_receive=0.0, max_rdy_count=2500)
    link = Link(rt, conn, 0 if ordered else None, ordered=ordered, detail=ordered)
    rt.flow.add(link)
    body = b"x" * 100
    trace = bytes(8)
    on_message = link.on_message
    clock.first()
    for i in range(1, count + 1):
        if ordered:
            msg = Message(0, 1, i.to_bytes(8, "big") + trace, body, 0, None, i, 100, True)
        else:
            msg = Message(0, 1, b"%016x" % i, body, 0, None, None, None, False)
        conn.last_receive = time.monotonic() if i % mif == 0 else conn.last_receive
        on_message(msg)
    clock.last()
    assert seen == count, (seen, count)
    rt.flow.close()
    loop.close()
    return clock


# Consumer variants for --instructions (what tracing costs): worker name -> variant
# ("1pct": a parent-based 1-in-100 ratio sampler instead of every message)
VARIANTS = {f"smartnsq-{v}": v for v in ("otel", "span", "otel1pct", "span1pct")}
# What each worker imports before its baseline memory reading (see publish.py).
# (the modules themselves: the packages' __init__ import nothing)
PREIMPORT = {"smartnsq": "smartnsq.consumer.core",
             "smartnsq-conn": "smartnsq.transport.connection",
             **{client: "smartnsq.consumer.core" for client in VARIANTS},
             **{f"smartnsq-path{o}{v}": "smartnsq.consumer.core" for o in ("", "-ordered")
                for v in ("", "-otel", "-span", "-otel1pct", "-span1pct", "-metrics",
                          "-metricsall")},
             "pynsq": "nsq", "ansq": "ansq", "asyncnsq": "asyncnsq"}


def preimport(client: str) -> None:
    if client == "gnsq":
        from gevent import monkey

        monkey.patch_all()  # before anything else imports socket
        import gnsq  # noqa: F401
        return
    importlib.import_module(PREIMPORT[client])


def worker(argv: list[str]) -> int:
    client, addr, lookupd, topic, count_s, mif_s, loop = argv
    count, mif = int(count_s), int(mif_s)
    if loop == "uvloop" and client in ("smartnsq", "smartnsq-conn", "ansq", "asyncnsq"):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    preimport(client)
    baseline = max_rss_kib()
    if client.startswith("smartnsq-path"):
        clock = work_smartnsq_path(count, mif, ordered="ordered" in client,
                                   variant=client.rsplit("-", 1)[-1])
    elif client == "smartnsq" or client in VARIANTS:
        clock = work_smartnsq(addr, lookupd, topic, count, mif, VARIANTS.get(client, ""))
    else:
        fn = {"smartnsq-conn": work_smartnsq_conn, "pynsq": work_pynsq, "gnsq": work_gnsq,
              "ansq": work_ansq, "asyncnsq": work_asyncnsq}[client]
        clock = fn(addr, topic, count, mif)
    steady = clock.t_last - clock.t_first
    emit({"count": count, "seconds": steady, "rate": (count - 1) / steady,
          "cpu_us": (clock.cpu_last - clock.cpu_first) / (count - 1) * 1e6,
          "first": clock.t_first - clock.created,
          "overall": count / (clock.t_last - clock.created),
          "peak_kib": max_rss_kib() - baseline, "baseline_kib": baseline})
    return 0


# -- the orchestrator -----------------------------------------------------------------------

GOAL = 3.0  # smartnsq's Consumer over the best Python peer, at each setting


def leftover(cluster: Any, topic: str) -> int | None:
    for ch in cluster.stats(topic).get("channels") or []:
        if ch.get("channel_name") == CHANNEL:
            return int(ch.get("depth", 0)) + int(ch.get("in_flight_count", 0))
    return None


def run_minimal(args: argparse.Namespace, clients: list[str], count: int, rounds: int,
                timeout: float) -> dict[tuple[str, int], dict[str, Any]]:
    mifs = [int(m) for m in args.max_in_flight.split(",")]
    best: dict[tuple[str, int], dict[str, Any]] = {}
    with minimal_endpoint(args.body) as endpoint:
        for rnd in range(rounds):
            for mif in mifs:
                shift = rnd % len(clients)
                for client in clients[shift:] + clients[:shift]:
                    key = (client, mif)
                    if "error" in best.get(key, {}):
                        continue
                    endpoint.connections(expect=0, timeout=0)
                    result = run_worker("consume.py", [client, endpoint.tcp, "", "bench_sub",
                                                       str(count), str(mif), args.loop],
                                        timeout=timeout, python_flags=OPT[args.loop])
                    conns = [c for c in endpoint.connections() if c["max_rdy"]]
                    if "error" not in result and conns:
                        fins = sum(c["fins"] for c in conns)
                        reads = sum(c["fin_reads"] for c in conns)
                        result["fins_per_read"] = fins / reads if reads else 0.0
                        result["max_in_flight"] = max(c["max_in_flight"] for c in conns)
                        result["max_rdy"] = max(c["max_rdy"] for c in conns)
                        result["rdys"] = sum(c.get("rdys", 0) for c in conns)
                    best[key] = merge(best.get(key), result)
    return best


def run_instructions(args: argparse.Namespace, clients: list[str], count: int) -> int:
    """User-space instructions per message, by callgrind: each client's worker run under
    ``valgrind --tool=callgrind`` on the minimal endpoint with N and 3N messages; the
    difference over 2N is the steady per-message cost (start-up, imports and the close cancel
    out), a figure the machine's load does not move."""
    import tempfile

    mifs = [int(m) for m in args.max_in_flight.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="smartnsq-callgrind-") as tmp, \
            minimal_endpoint(args.body) as endpoint:
        for mif in mifs:
            for client in clients:
                # a run outside valgrind first: it fills the bytecode cache, whose writing
                # would otherwise land in the first counted run only (and skew the difference)
                endpoint.connections(expect=0, timeout=0)
                run_worker("consume.py", [client, endpoint.tcp, "", "bench_sub", "100",
                                          str(mif), args.loop], python_flags=OPT[args.loop])
                endpoint.connections()
                totals = []
                for n in (count, 3 * count):
                    out = os.path.join(tmp, f"{client}-{mif}-{n}.out")
                    endpoint.connections(expect=0, timeout=0)
                    result = run_worker(
                        "consume.py", [client, endpoint.tcp, "", "bench_sub", str(n),
                                       str(mif), args.loop],
                        timeout=args.timeout or 900, python_flags=OPT[args.loop],
                        prefix=["valgrind", "--tool=callgrind",
                                f"--callgrind-out-file={out}"])
                    endpoint.connections()
                    if "error" in result:
                        rows.append([str(mif), client, "-", result["error"], "-"])
                        break
                    with open(out) as f:
                        totals.append(int(next(ln for ln in f if ln.startswith("totals:"))
                                          .split()[1]))
                if len(totals) == 2:
                    per = (totals[1] - totals[0]) / (2 * count)
                    rows.append([str(mif), client, f"{count:,} / {3 * count:,}",
                                 f"{totals[0]:,} / {totals[1]:,}", f"{per:,.0f}"])
                print(f"  max_in_flight {mif:<5} {client:<16} {rows[-1][-1]}", flush=True)
    print()
    print(table(["max_in_flight", "client", "N", "instructions (whole process)",
                 "user-space instructions per message"], rows))
    print("\nvalgrind --tool=callgrind on the client worker against bench/_endpoint.py, with N "
          "and 3N messages; per message = (I(3N) - I(N)) / 2N. smartnsq-otel: the Consumer "
          "with an SDK TracerProvider sampling every message (in-memory exporter that keeps "
          "nothing, simple processor); smartnsq-span: the plain Consumer whose handler starts "
          "and ends one bare span of the same provider (the SDK's own floor); -otel1pct, "
          "-span1pct: the same with a parent-based 1-in-100 ratio sampler.")
    return 0


def report_minimal(best: dict[tuple[str, int], dict[str, Any]], clients: list[str],
                   mifs: list[int], unavailable: dict[str, str]) -> None:
    goal_rows = []
    for mif in mifs:
        base = best.get(("smartnsq", mif), {})
        rows = []
        notes = []
        for client in clients:
            r = best[(client, mif)]
            if "error" in r:
                rows.append([client, "failed", *["-"] * 8])
                notes.append(f"{client}: {r['error']}")
                continue
            fpr = r.get("fins_per_read")
            rows.append([client, fmt_rate(r["rate"]), fmt_ratio(r["rate"], base.get("rate")),
                         f"{r['cpu_us']:.2f}", fmt_ratio(r["cpu_us"], base.get("cpu_us")),
                         fmt_kib(r["peak_kib"]), f"{r['first'] * 1000:.0f} ms",
                         "?" if fpr is None else f"{fpr:.1f}",
                         f"{r.get('max_in_flight', '?')} / {r.get('max_rdy', '?')}",
                         str(r.get("rdys", "?"))])
        for peer, why in unavailable.items():
            rows.append([peer, "not importable", *["-"] * 8])
            notes.append(f"{peer}: {why}")
        print(f"--- max_in_flight {mif} ---\n")
        print(table(["client", "msg/s", "vs smartnsq", "CPU us/msg", "vs smartnsq",
                     "peak memory", "first msg", "FINs per read", "max in flight / RDY",
                     "RDY sent"],
                    rows))
        for note in notes:
            print(f"  - {note}")
        print()
        ok = [best[(p, mif)] | {"name": p} for p in clients
              if p in PEERS and "error" not in best[(p, mif)]]
        if base and "error" not in base and ok:
            top = max(ok, key=lambda r: r["rate"])
            cheap = min(ok, key=lambda r: r["cpu_us"])
            lean = min(ok, key=lambda r: r["peak_kib"])
            ratio = base["rate"] / top["rate"]
            goal_rows.append([
                str(mif), f">= {GOAL:g}x", f"{ratio:.2f}x vs {top['name']}",
                "met" if ratio >= GOAL else f"missed ({ratio / GOAL:.0%} of goal)",
                f"{cheap['cpu_us'] / base['cpu_us']:.2f}x vs {cheap['name']}",
                f"{fmt_kib(base['peak_kib'])} vs {fmt_kib(lean['peak_kib'])} ({lean['name']})"])
    if goal_rows:
        print("goals: smartnsq Consumer's rate over the best Python peer's; "
              "CPU: the cheapest peer's CPU/msg over smartnsq's\n")
        print(table(["max_in_flight", "goal", "rate ratio", "rate goal", "CPU ratio",
                     "peak memory (smartnsq vs leanest peer)"], goal_rows))
    print("\nFINs per read: FINs the endpoint found per read that carried any (higher = the "
          "client coalesces its FIN writes; a lower bound, since a busy endpoint also merges "
          "writes). max in flight / RDY: the most messages the endpoint had out at once and "
          "the largest RDY the client sent. RDY sent: RDY commands over the whole run.")


# -- --server real: the real classic nsqd, the Python peers and the Go tools in one run ---------

REAL_CLIENTS = ("smartnsq", "smartnsq-uvloop", "smartnsq-conn", *PEERS, "go-nsq_tail",
                "go-bench_reader")
REAL_GOAL = 0.9  # goal: smartnsq's Consumer >= 0.9x bench_reader (raw Go)
RSS_GOAL_KIB = 20 * 1024


def channel_left(cluster: Any, topic: str) -> tuple[int, int]:
    for ch in cluster.stats(topic).get("channels") or []:
        if ch.get("channel_name") == CHANNEL:
            return int(ch.get("depth", 0)), int(ch.get("in_flight_count", 0))
    return -1, -1


def tail_surplus(count: int, mif: int) -> int:
    """Messages loaded past the N timed: several windows of max_in_flight, at least 10%."""
    return max(4 * mif, count // 10)


def real_run(client: str, srv: Any, go: Any, count: int, mif: int, args: argparse.Namespace
             ) -> dict[str, Any]:
    from _real import ServerCpu

    topic = f"bench_real_sub_{topic_part(client)}"
    body = b"x" * args.body
    # More than N on the channel: nsqd holds a client's last partial write until its output
    # buffer timer ticks (250 ms by default), so a client timed to the channel's very last
    # message is timed to that tick, and the rates came out quantized (100k, 133k, 200k:
    # 100,000 messages in 1.0, 0.75, 0.5 s). With a surplus the N-th message is never last.
    surplus = tail_surplus(count, mif)
    load = count + surplus
    if client == "go-bench_reader":  # more than it can read in its window
        load = max(count, int(args.runfor * args.reader_rate))
    srv.fresh_topic(topic, CHANNEL)
    loader = RawClient(srv.tcp)
    loader.preload(topic, load, body)
    extra_topic = ""
    if client == "go-nsq_tail":
        # its start-up run (--n 1) gets a surplus too, for the same reason
        extra_topic = topic + "_one"
        srv.fresh_topic(extra_topic, CHANNEL)
        loader.preload(extra_topic, 1 + surplus, body)
    loader.close()
    cpu = ServerCpu(srv.nsqd_pids)
    if client == "go-nsq_tail":
        result = go.nsq_tail(srv.tcp, topic, CHANNEL, count, mif, extra_topic)
    elif client == "go-bench_reader":
        result = go.bench_reader(srv.tcp, topic, CHANNEL, mif, args.body, args.runfor)
    else:
        twin = client[len(baseline_name(client)):]  # "", "@base" or "@pure"
        worker_client, loop = (("smartnsq" + twin, "uvloop")
                               if baseline_name(client) == "smartnsq-uvloop"
                               else (client, args.loop))
        result = run_worker("consume.py", [worker_client, srv.tcp, "", topic, str(count),
                                           str(mif), loop], python_flags=OPT[loop],
                            prefix=args.prefix.split())
        if "error" not in result:
            result["how"] = ("in-process clock from the first message handled to the N-th "
                             "(rate over N - 1)")
            result["total_kib"] = result["peak_kib"] + result.get("baseline_kib", 0)
    server_s = cpu.used()
    if "error" not in result:
        depth, in_flight = channel_left(srv, topic)
        result["left"] = depth + in_flight
        result["server_us"] = server_s / max(result["count"], 1) * 1e6
        result.setdefault("total_kib", result["peak_kib"])
        if client == "go-bench_reader":
            taken = load - depth
            result["verified"] = depth > 0 and abs(taken - result["count"]) <= mif
            result["check"] = (f"loaded {load:,}, {taken:,} taken off the channel, the tool "
                               f"counted {result['count']:,}"
                               + ("; drained before its window ended: a lower bound"
                                  if depth == 0 else ""))
        else:
            # the surplus stays (or is requeued at the client's close); the N counted ones
            # were taken off the channel (nsq_tail --n N exits before its N-th FIN)
            taken = load - depth - in_flight
            result["verified"] = count - 1 <= taken <= count + surplus
            if not result["verified"]:
                result["check"] = (f"loaded {load:,} (N + {surplus:,} so that the N-th is "
                                   f"not the last), {taken:,} FINed")
    srv.drop_topic(topic)
    if extra_topic:
        srv.drop_topic(extra_topic)
    return result


def main_real(args: argparse.Namespace) -> int:
    from _real import GoTools, real_dir, real_server

    folder = real_dir(args.real)
    go = GoTools(folder, args.go_procs)
    count = args.messages or (20_000 if args.quick else 100_000)
    rounds = args.rounds or (1 if args.quick else 2)
    args.runfor = args.runfor or (1.0 if args.quick else 2.0)
    args.reader_rate = 1_000_000  # bench_reader's load: runfor x this (above its rate here;
    # 400k was drained early on a faster machine, which the notes then flag as a lower bound)
    mifs = [int(m) for m in (args.max_in_flight or "200,2500").split(",")]
    clients = [c for c in (args.clients if args.clients != ",".join(CLIENTS)
                           else ",".join(REAL_CLIENTS)).split(",") if c]
    unavailable: dict[str, str] = {}
    for c in clients:
        why = (peer_available(c) if c in PEERS else
               go.available(c.removeprefix("go-")) if c.startswith("go-") else None)
        if why:
            unavailable[c] = why
    clients = [c for c in clients if c not in unavailable]
    if args.pure:
        print("pure path (rows CLIENT@pure): SMARTNSQ_NO_EXTENSIONS=1")
        clients = with_baseline(clients, PURE_SUFFIX)
    best: dict[tuple[str, int], dict[str, Any]] = {}
    # pre-loaded channels stay in memory (the default --mem-queue-size, 10000, would put
    # most of them on disk and measure nsqd's disk queue)
    with real_server("classic", folder, nsqd_args=("--mem-queue-size=10000000",)) as srv:
        where = srv.describe()
        print(f"consume from the real nsqd: {count:,} pre-loaded messages of {args.body} "
              f"bytes per run (bench_reader: {args.runfor:g} s from a larger load), "
              f"max_in_flight {', '.join(map(str, mifs))}, no-op handler + FIN; best of "
              f"{rounds} round(s), clients interleaved; server: {where}\n")
        for rnd in range(rounds):
            for mif in mifs:
                shift = rnd % len(clients)
                for client in clients[shift:] + clients[:shift]:
                    key = (client, mif)
                    if "error" in best.get(key, {}):
                        continue
                    result = real_run(client, srv, go, count, mif, args)
                    prev = best.get(key)
                    best[key] = merge(prev, result)
                    for k in ("server_us", "total_kib"):
                        if prev and k in prev and k in result:
                            best[key][k] = min(prev[k], result[k])
                    print(f"  round {rnd + 1} max_in_flight {mif:<5} {client:<16} "
                          + (f"{fmt_rate(result['rate'])} msg/s, {result['cpu_us']:.1f} us "
                             f"client, {result['server_us']:.1f} us nsqd per msg"
                             if "error" not in result else result["error"]), flush=True)
    print()
    report_real(best, clients, mifs, unavailable)
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: {where}\n  event loop  {args.loop} (asyncio clients; the "
                      f"smartnsq-uvloop row: uvloop, python -O)\n  Go tools    {folder} "
                      f"(GOMAXPROCS={args.go_procs} for bench_reader)"))
    return 0


def report_real(best: dict[tuple[str, int], dict[str, Any]], clients: list[str],
                mifs: list[int], unavailable: dict[str, str]) -> None:
    headers = ["client", *(f"max_in_flight {m}" for m in mifs)]
    tables: list[list[list[str]]] = [[], [], [], []]
    notes = []
    for client in clients:
        rows: list[list[str]] = [[client], [client], [client], [client]]
        for mif in mifs:
            r = best.get((client, mif))
            if r is None or "error" in r:
                for row in rows:
                    row.append("failed")
                if r is not None:
                    notes.append(f"{client} {mif}: {r['error']}")
                continue
            base = best.get(("smartnsq", mif), {})
            mark = "" if r.get("verified") else " (!)"
            if r.get("check"):
                notes.append(f"{client} {mif}: {r['check']}")
            elif not r.get("verified"):
                notes.append(f"{client} {mif}: {r['left']} left in the channel")
            ratio = fmt_ratio(r["rate"], base.get("rate"))
            rows[0].append(f"{fmt_rate(r['rate'])}{mark} ({ratio})")
            rows[1].append(f"{r['cpu_us']:.1f}")
            rows[2].append(f"{r['server_us']:.1f}")
            rows[3].append(fmt_kib(r["total_kib"]))
        for t, row in zip(tables, rows, strict=True):
            t.append(row)
    for client, why in unavailable.items():
        notes.append(f"{client}: not run ({why})")
    titles = ["throughput, msg/s (x smartnsq's Consumer)",
              "client CPU per message, microseconds (whole client process)",
              "nsqd CPU per message, microseconds (/proc/PID/stat over the client's run)",
              "peak RSS of the client process (VmHWM; Python: the whole worker, which also "
              "imports bench/_common)"]
    for title, t in zip(titles, tables, strict=True):
        print(f"{title}\n")
        print(table(headers, t))
        print()
    goal_rows = []
    for mif in mifs:
        ref = best.get(("go-bench_reader", mif), {})
        for me_name in ("smartnsq", "smartnsq-uvloop"):
            me = best.get((me_name, mif), {})
            if not me or "error" in me or not ref or "error" in ref:
                continue
            ratio = me["rate"] / ref["rate"]
            goal_rows.append([str(mif), me_name, f">= {REAL_GOAL:g}x go-bench_reader",
                              f"{ratio:.2f}x", "met" if ratio >= REAL_GOAL
                              else f"missed ({ratio / REAL_GOAL:.0%})",
                              f"{me['cpu_us']:.1f} vs {ref['cpu_us']:.1f}",
                              f"{me['server_us']:.1f} vs {ref['server_us']:.1f}"])
    peaks = [best[("smartnsq", m)] for m in mifs
             if "error" not in best.get(("smartnsq", m), {"error": 1})]
    if peaks:
        top = max(peaks, key=lambda r: r["total_kib"])
        goal_rows.append(["-", "smartnsq", f"peak RSS <= {fmt_kib(RSS_GOAL_KIB)}",
                          f"{fmt_kib(top['total_kib'])} (+{fmt_kib(top['peak_kib'])} over the "
                          "worker after import)",
                          "met" if top["total_kib"] <= RSS_GOAL_KIB else "missed", "-", "-"])
    print("goals (against the real nsqd)\n")
    print(table(["max_in_flight", "client", "goal", "rate ratio", "verdict",
                 "client CPU us/msg (vs ref)", "nsqd CPU us/msg (vs ref)"], goal_rows))
    print("\nhow each figure was taken:")
    seen = set()
    for client in clients:
        for mif in mifs:
            how = best.get((client, mif), {}).get("how")
            if how and (client, how) not in seen:
                seen.add((client, how))
                print(f"  - {client}: {how}")
    if notes:
        print("\nnotes:")
        for note in notes:
            print(f"  - {note}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--server", type=server_arg, default="minimal",
                        metavar="minimal|devcluster|nsqd=HOST:PORT[,lookupd=HOST:PORT]",
                        help="minimal: bench/_endpoint.py pushes as fast as RDY allows, so the "
                             "client is measured; devcluster: pre-loaded dev cluster nsqd; "
                             "nsqd=HOST:PORT: a real server you run (optionally lookupd= "
                             "and http=, default TCP port + 1), pre-loaded")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="event loop of the asyncio clients (uvloop: the fast extra)")
    parser.add_argument("--messages", type=int, default=None,
                        help="default 100k, quick 20k (the performance journal's "
                             "minimal-server tables used 200k)")
    parser.add_argument("--max-in-flight", default=None,
                        help="comma-separated (default: minimal 200,2500; devcluster 1000)")
    parser.add_argument("--body", type=int, default=100, help="body size in bytes")
    parser.add_argument("--rounds", type=int, default=None,
                        help="default 2, quick 1 (the performance journal's tables used 3)")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--cluster", choices=("classic", "youzan"), default="classic",
                        help="devcluster server: its flavour (youzan: peers SUB without a "
                             "partition and get the node's default one, with binary ids)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="per client run, seconds (default 300, youzan 60)")
    parser.add_argument("--via", choices=("auto", "nsqd", "lookupd"), default="auto",
                        help="devcluster/real server: how smartnsq's Consumer finds the node "
                             "(auto: lookupd when there is one); minimal: always nsqd")
    parser.add_argument("--real", default=None, metavar="DIR",
                        help="--server real: the real binaries' folder (default "
                             "$SMARTNSQ_REAL_NSQ)")
    parser.add_argument("--runfor", type=float, default=None,
                        help="--server real: seconds bench_reader runs (default 2, quick 1)")
    parser.add_argument("--instructions", action="store_true",
                        help="minimal server: user-space instructions per message by "
                             "callgrind (N and 3N, --messages default 10k; clients default "
                             "smartnsq,smartnsq-conn; also smartnsq-otel, smartnsq-span, "
                             "smartnsq-path[-ordered][-otel|-span]: the Consumer's layer alone, "
                             "in process, deterministic; -otel1pct, -span1pct: a 1-in-100 "
                             "ratio sampler)")
    parser.add_argument("--prefix", default="", metavar="COMMAND",
                        help="--server real: run the Python client workers under COMMAND "
                             "(e.g. 'strace -f -c -o FILE': system calls per message by the "
                             "difference of two --messages counts)")
    parser.add_argument("--go-procs", type=int, default=1,
                        help="--server real: GOMAXPROCS of bench_reader (one connection per "
                             "proc; default 1)")
    parser.add_argument("--pure", action="store_true",
                        help="each smartnsq row also runs on the pure-Python modules, named "
                             "CLIENT@pure (SMARTNSQ_NO_EXTENSIONS=1), in the same run")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="another checkout of smartnsq (the tree before a change): its "
                             "smartnsq rows run beside this tree's, named CLIENT@base, in the "
                             "same run and interleaved")
    args = parser.parse_args()
    if args.server == "real":
        return main_real(args)
    minimal = args.server == "minimal"
    if isinstance(args.server, ServerSpec) and not args.server.lookupd:
        if args.via == "lookupd":
            parser.error("--via lookupd needs --server ...,lookupd=HOST:PORT")
        args.via = "nsqd"
    if args.max_in_flight is None:
        args.max_in_flight = "200,2500" if minimal else "1000"
    count = args.messages or (20_000 if args.quick else 100_000)
    timeout = args.timeout or (60.0 if args.cluster == "youzan" else 300.0)
    rounds = args.rounds or (1 if args.quick else 2)  # the default run stays near 2 minutes
    lookup_landed = importlib.util.find_spec("smartnsq.discovery.lookup") is not None
    via = "nsqd" if minimal else (
        args.via if args.via != "auto" else ("lookupd" if lookup_landed else "nsqd"))
    clients = [c for c in args.clients.split(",") if c]
    if "smartnsq" in clients and importlib.util.find_spec("smartnsq.consumer") is None:
        clients.remove("smartnsq")
        print("smartnsq.consumer is not there: measuring the raw Connection path only")

    unavailable: dict[str, str] = {}
    for peer in [c for c in clients if c in PEERS]:
        why = peer_available(peer)
        if why:
            unavailable[peer] = why
    clients = [c for c in clients if c not in unavailable]
    if args.instructions and args.clients == ",".join(CLIENTS):
        clients = ["smartnsq", "smartnsq-conn"]
    if args.baseline:
        print(f"baseline (rows CLIENT@base): {set_baseline(args.baseline)}")
        clients = with_baseline(clients)
    if args.pure:
        print("pure path (rows CLIENT@pure): SMARTNSQ_NO_EXTENSIONS=1")
        clients = with_baseline(clients, PURE_SUFFIX)

    if args.instructions:
        if not minimal:
            parser.error("--instructions runs on the minimal endpoint")
        print(f"consume, user-space instructions per message: {args.body}-byte bodies "
              f"pushed by bench/_endpoint.py, max_in_flight {args.max_in_flight}; asyncio "
              f"clients on {args.loop}\n")
        run_instructions(args, clients, args.messages or 10_000)
        print(f"\ncommand: {command_line()}")
        print(environment("server: bench/_endpoint.py, separate process, loopback"))
        return 0
    if minimal:
        mifs = [int(m) for m in args.max_in_flight.split(",")]
        print(f"consume: {count:,} messages of {args.body} bytes pushed by bench/_endpoint.py "
              f"as fast as RDY allows, max_in_flight {', '.join(map(str, mifs))}, no-op "
              f"handler + FIN; best of {rounds} round(s); asyncio clients on {args.loop}\n")
        best_m = run_minimal(args, clients, count, rounds, timeout)
        report_minimal(best_m, clients, mifs, unavailable)
        print(f"\ncommand: {command_line()}")
        print(environment("server: bench/_endpoint.py, separate process, loopback\n"
                          f"  event loop  {args.loop} (asyncio clients)"))
        return 0
    return main_devcluster(args, clients, count, rounds, timeout, via, unavailable)


def main_devcluster(args: argparse.Namespace, clients: list[str], count: int, rounds: int,
                    timeout: float, via: str, unavailable: dict[str, str]) -> int:
    mif = int(args.max_in_flight.split(",")[0])
    body = b"x" * args.body
    best: dict[str, dict[str, Any]] = {}
    with cluster_server(args.server, args.cluster) as cluster:
        where = cluster.describe()
        print(f"consume: {count:,} pre-loaded messages of {args.body} bytes, max_in_flight "
              f"{mif}, no-op handler + FIN; best of {rounds} round(s); smartnsq "
              f"Consumer via {via}; asyncio clients on {args.loop}; server: {where}\n")
        for rnd in range(rounds):
            shift = rnd % len(clients)
            for client in clients[shift:] + clients[:shift]:
                if "error" in best.get(client, {}):
                    continue  # failed once: a client that cannot consume here will not later
                topic = f"bench_sub_{topic_part(client)}"
                cluster.fresh_topic(topic, CHANNEL)
                youzan = args.cluster == "youzan"
                loader = RawClient(cluster.tcp, YOUZAN_LAYOUT if youzan else CLASSIC_LAYOUT)
                loader.preload(topic, count, body, partition=0 if youzan else None)
                loader.close()
                result = run_worker("consume.py", [
                    client, cluster.tcp,
                    cluster.lookupd_http[0] if (client == "smartnsq" and via == "lookupd")
                    else "", topic, str(count), str(mif), args.loop],
                    timeout=timeout, python_flags=OPT[args.loop])
                if "error" not in result:
                    result["left"] = leftover(cluster, topic)
                cluster.drop_topic(topic)
                best[client] = merge(best.get(client), result)

    base = best.get("smartnsq", {}).get("rate")
    base_cpu = best.get("smartnsq", {}).get("cpu_us")
    rows = []
    notes = []
    for client in clients:
        r = best[client]
        if "error" in r:
            rows.append([client, "failed", "-", "-", "-", "-", "-", "-", "-"])
            notes.append(f"{client}: {r['error']}")
            continue
        left = r.get("left")
        rows.append([client, fmt_rate(r["rate"]), fmt_ratio(r["rate"], base),
                     f"{r['cpu_us']:.1f}", fmt_ratio(r["cpu_us"], base_cpu),
                     fmt_kib(r["peak_kib"]), f"{r['first'] * 1000:.0f} ms",
                     fmt_rate(r["overall"]), "?" if left is None else str(left)])
    for peer, why in unavailable.items():
        rows.append([peer, "not importable", "-", "-", "-", "-", "-", "-", "-"])
        notes.append(f"{peer}: {why}")
    print(table(["client", "msg/s", "vs smartnsq", "CPU us/msg", "vs smartnsq", "peak memory",
                 "first msg", "overall msg/s", "left in channel"], rows))
    for note in notes:
        print(f"  - {note}")
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: {where}\n  event loop  {args.loop} (asyncio clients)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
