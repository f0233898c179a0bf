"""Youzan hot paths: sharded publishing and ordered consumption, client CPU per message.

    python bench/youzan.py [--quick] [--items drain,ordered,...] [--rounds R]
                           [--loop asyncio|uvloop] [--count] [--profile ITEM]
                           [--instructions] [--prefix COMMAND] [--otel]
                           [--server devcluster|real] [--real DIR] [--handlers N]

The server is the dev cluster in youzan mode (3 nsqd, 2 nsqlookupd) **in its own process**,
and every work item runs in a fresh interpreter of its own, so the CPU time a worker reports
(``time.process_time()``: user + system of the client process, every thread, over the timed
window) is the client's alone, like the reference figures taken beside youzan's Go client on a
real cluster. Each work item gets a fresh topic of 4 partitions x 2 replicas (channel
``bench`` created on every partition's leader before anything is written) and ends with a
server-side check: publishes are counted on the partitions' leaders, drains leave nothing in
the channel.

Work items (100-byte bodies; 200 sharding keys ``key-0``..``key-199`` where there are keys):

* ``drain``: plain drain of N messages pre-loaded over the 4 partitions, max_in_flight 2500,
  a counting handler (FIN on return);
* ``ordered``: ordered drain (``ordered=True``: SUB_ORDERED, one message in flight per
  partition, so every message is a full deliver -> handler -> FIN -> next cycle) of N
  messages pre-loaded by sharding key, 200 keys; the handler checks per-key order and counts
  redeliveries;
* ``ordered-floor`` (opt-in): the same ordered drain with no library at all, a bare asyncio
  ``BufferedProtocol`` per partition leader that FINs every message inside
  ``data_received`` (no order check, no flow control, no handler): what the event loop and
  the two socket calls cost by themselves, the floor under any asyncio client (what the
  ordered goals are weighed against);
* ``pub-seq``: sharded publish one at a time (``await publish(..., sharding_key=k)``) with the
  default ``sharded_receipts=True`` (PUB_TRACE, trace id 0, so the result has a receipt);
* ``pub-seq-plain``: the same with ``sharded_receipts=False`` (plain PUB with the partition,
  what youzan's go-nsq sends);
* ``pub-seq-traced``: the same with a trace id per publish (``trace_id=n``: PUB_TRACE and a
  trace line when the trace log is on; it is not, as in production);
* ``pub-conc64``: 64 coroutines each publishing one at a time (64 outstanding);
* ``pub-nowait``: 1024 outstanding via ``publish_nowait`` (windows of 1024 futures, each
  window gathered);
* ``pub-many``: ``publish_many`` per key, batches of 100 messages with one sharding key each;
* ``pub-conc64-linger``, ``pub-nowait-linger``: ``pub-conc64`` and ``pub-nowait`` with
  ``linger=0.002`` and ``sharded_receipts=False`` (opt-in batching: the concurrent publishes
  to one partition go as one MPUB, each call keeping its own result).

Every publishing worker first publishes once to each partition (not timed) so its
connections are open. The workers use only the public API (``from smartnsq import Producer,
Consumer``) and import nothing of this directory, so their peak RSS (``ru_maxrss``) is what a
producer or consumer process costs. Pre-loading is done by another worker through
``Producer.publish_many`` before the timed one starts.

``--count`` instruments the worker's event loop (asyncio only) and prints, per message,
event-loop iterations, callbacks scheduled (``call_soon``), timers set (``call_at``), tasks
and futures created; it adds its own cost, so its run's CPU figures are not comparable.
``--profile ITEM`` runs that item under cProfile and prints calls and own time per message by
source file, then the top functions. ``--prefix 'valgrind --tool=callgrind ...'`` runs the
timed workers under a command; ``--instructions`` does the callgrind recipe itself for the
items with one message in flight (ordered, pub-seq*): two runs each, N and 3N messages, whose
difference gives user-space instructions per message, a figure the machine's load does not
move.
``--loop uvloop`` runs the workers on uvloop (the ``fast`` extra), with ``python -O``.
``--server real`` (binaries from ``--real DIR`` or ``$SMARTNSQ_REAL_NSQ``, etcd on PATH) runs
every item on the real youzan cluster started here (etcd, 2 nsqlookupd, 3 nsqd) and, for drain,
ordered, pub-seq(-plain), pub-conc64 and pub-nowait, youzan's Go client ``yzgo`` beside
smartnsq on a topic of its own, interleaved, with the nsqd processes' CPU per message and
the goals against yzgo.
``--otel`` traces every client of the workers (``smartnsq.observability.otel.instrument`` with the
OpenTelemetry SDK's ``TracerProvider``: every message sampled, spans recorded and dropped, no
exporter), which is what the instrumentation costs (the ``otel`` extra).

The reference figures were measured with youzan's Go client (youzan/go-nsq v1.7.2-HA) and
smartnsq on a real youzan cluster (0.3.7-HA.1.13.0, 2 lookupds, 3 nsqd, 4 partitions x 2
replicas, loopback, medians of 3 interleaved rounds). The dev cluster is a Python broker and
slower than the real one, so compare the CPU columns, not the rates.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed copy

CHANNEL = "bench"
PARTITIONS = 4
REPLICAS = 2
KEYS = 200
BODY = 100
WARMUP = PARTITIONS  # one publish per partition before the clock starts

# item -> (what it is, the reference Go client msg/s and CPU us/msg, smartnsq's on the real
# cluster, the CPU-per-message target); None where there is no reference figure
ITEMS: dict[str, dict[str, Any]] = {
    "drain": {"label": "plain drain, max_in_flight 2500", "go": (99_563, 5.1),
              "real": (101_850, 4.1), "target": None},
    "ordered": {"label": "ordered drain, 200 keys (SUB_ORDERED)", "go": (8_699, 42.0),
                "real": (6_439, 74.0), "target": 40.0},
    "ordered-floor": {"label": "ordered drain, no library: a bare asyncio Protocol per partition",
                      "go": None, "real": None, "target": None},
    "pub-seq": {"label": "sharded publish, one at a time (receipts: PUB_TRACE)",
                "go": (3_826, 78.0), "real": (3_148, 111.0), "target": 78.0},
    "pub-seq-plain": {"label": "sharded publish, one at a time, plain PUB",
                      "go": (3_826, 78.0), "real": None, "target": 78.0},
    "pub-seq-traced": {"label": "sharded publish, one at a time, trace_id given",
                       "go": None, "real": None, "target": None},
    "pub-conc64": {"label": "sharded publish, 64 concurrent", "go": (9_041, 44.0),
                   "real": (10_523, 46.0), "target": None},
    "pub-nowait": {"label": "sharded publish, 1024 outstanding (publish_nowait)",
                   "go": (9_815, 41.0), "real": (12_180, 46.0), "target": None},
    "pub-many": {"label": "publish_many per key, 100 per batch", "go": None, "real": None,
                 "target": None},
    "pub-conc64-linger": {"label": "sharded publish, 64 concurrent, linger 2 ms",
                          "go": (9_041, 44.0), "real": None, "target": None},
    "pub-nowait-linger": {"label": "sharded publish, 1024 outstanding, linger 2 ms",
                          "go": (9_815, 41.0), "real": None, "target": None},
}
# messages per item: default, --quick
COUNTS = {"drain": (200_000, 20_000), "ordered": (20_000, 4_000),
          "ordered-floor": (20_000, 4_000), "pub-seq": (5_000, 1_500),
          "pub-seq-plain": (5_000, 1_500), "pub-seq-traced": (5_000, 1_500),
          "pub-conc64": (20_000, 4_000), "pub-nowait": (20_000, 4_000),
          "pub-many": (50_000, 10_000), "pub-conc64-linger": (20_000, 4_000),
          "pub-nowait-linger": (20_000, 4_000)}
# opt-in items: run only when named in --items
OPT_IN = ("pub-conc64-linger", "pub-nowait-linger", "ordered-floor")


def key(i: int) -> str:
    return f"key-{i % KEYS}"


# -- the worker: one work item in a fresh interpreter, nothing of bench/ imported --------------

class LoopCounter:
    """Counts what the event loop does (asyncio's pure-Python loop only)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.counts = {"iterations": 0, "call_soon": 0, "timers": 0, "tasks": 0, "futures": 0}
        self.on = False
        counts = self.counts
        run_once = loop._run_once  # type: ignore[attr-defined]
        call_soon, call_at, create_future = loop.call_soon, loop.call_at, loop.create_future
        factory = loop.get_task_factory()

        def counted_run_once() -> None:
            if self.on:
                counts["iterations"] += 1
            run_once()

        def counted_call_soon(*a: Any, **k: Any) -> Any:
            if self.on:
                counts["call_soon"] += 1
            return call_soon(*a, **k)

        def counted_call_at(*a: Any, **k: Any) -> Any:
            if self.on:
                counts["timers"] += 1
            return call_at(*a, **k)

        def counted_future() -> Any:
            if self.on:
                counts["futures"] += 1
            return create_future()

        def task_factory(lp: Any, coro: Any, **k: Any) -> Any:
            if self.on:
                counts["tasks"] += 1
            if factory is not None:
                return factory(lp, coro, **k)
            return asyncio.Task(coro, loop=lp, **k)

        loop._run_once = counted_run_once  # type: ignore[attr-defined]
        loop.call_soon = counted_call_soon  # type: ignore[method-assign]
        loop.call_at = counted_call_at  # type: ignore[method-assign]
        loop.create_future = counted_future  # type: ignore[method-assign]
        loop.set_task_factory(task_factory)  # type: ignore[arg-type]


class Window:
    """The timed window: wall clock, client CPU (user + system), and the optional probes."""

    def __init__(self, counter: LoopCounter | None, profiler: Any) -> None:
        self.counter = counter
        self.profiler = profiler
        self.wall = self.cpu = self.user = self.sys = 0.0
        self._w0 = self._c0 = 0.0
        self._t0 = os.times()

    def start(self) -> None:
        if self.counter:
            self.counter.on = True
        if self.profiler:
            self.profiler.enable()
        self._t0 = os.times()
        self._w0 = time.perf_counter()
        self._c0 = time.process_time()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._w0
        self.cpu = time.process_time() - self._c0
        t1 = os.times()  # the same CPU time split in user and kernel (10 ms ticks)
        self.user = t1.user - self._t0.user
        self.sys = t1.system - self._t0.system
        if self.profiler:
            self.profiler.disable()
        if self.counter:
            self.counter.on = False


def body_for(k: str, seq: int) -> bytes:
    return f"{k}:{seq}:".encode().ljust(BODY, b"x")


async def preload(lookupd: str, topic: str, item: str, count: int) -> None:
    """Not timed: the messages a drain item consumes, written by the public API."""
    from smartnsq import Producer

    async with Producer(lookupd=[lookupd], sharded_receipts=False) as producer:
        if item == "yz-ordered":  # yzgo's ordered bodies: 3-digit key, 6-digit sequence
            per_key = count // KEYS
            for k in range(KEYS):
                await producer.publish_many(
                    topic, [f"{k:03d}{s:06d}".encode().ljust(BODY, b"x")
                            for s in range(per_key)], sharding_key=key(k))
        elif item == "yz-drain":  # yzgo's plain bodies: a 10-digit index
            for i in range(0, count, 1600):
                await asyncio.gather(*[
                    producer.publish_many(
                        topic, [f"{n:010d}".encode().ljust(BODY, b"x")
                                for n in range(j, min(j + 100, count))],
                        partition=(j // 100) % PARTITIONS)
                    for j in range(i, min(i + 1600, count), 100)])
        elif item == "ordered":  # by key, in order: per key 0..count/KEYS-1
            per_key = count // KEYS
            for k in range(KEYS):
                name = key(k)
                await producer.publish_many(topic, [body_for(name, s) for s in range(per_key)],
                                            sharding_key=name)
        else:  # spread over the partitions, 100 per batch
            body = b"x" * BODY
            sent = 0
            futures = []
            while sent < count:
                n = min(100, count - sent)
                futures.append(producer.publish_many(topic, [body] * n,
                                                     partition=(sent // 100) % PARTITIONS))
                sent += n
                if len(futures) == 16:
                    await asyncio.gather(*futures)
                    futures = []
            await asyncio.gather(*futures)


async def drain(lookupd: str, topic: str, item: str, count: int, window: Window) -> dict[str, Any]:
    from smartnsq import Consumer

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    seen = 0
    extra: dict[str, Any] = {"redelivered": 0, "order_errors": 0}
    last: dict[str, int] = {}
    distinct = 0

    def plain(message: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            window.start()
        if seen == count:
            window.stop()
            done.set_result(None)

    def ordered(message: Any) -> None:
        nonlocal seen, distinct
        seen += 1
        if seen == 1:
            window.start()
        k, s_, _ = message.body.split(b":", 2)
        name, seq = k.decode(), int(s_)
        prev = last.get(name, -1)
        if seq == prev + 1:
            last[name] = seq
            distinct += 1
        elif seq <= prev:
            extra["redelivered"] += 1  # the server's duplicated first ordered delivery
        else:
            extra["order_errors"] += 1
            last[name] = seq
            distinct += 1
        if distinct == count and not done.done():
            window.stop()
            done.set_result(None)

    if item == "ordered":
        consumer = Consumer(topic, CHANNEL, lookupd=[lookupd], handler=ordered, ordered=True,
                            max_in_flight=PARTITIONS * 4)
    else:
        consumer = Consumer(topic, CHANNEL, lookupd=[lookupd], handler=plain,
                            max_in_flight=2500)
    async with consumer:
        await asyncio.wait_for(done, 600)
    extra["handled"] = seen
    return extra


async def ordered_floor(lookupd: str, topic: str, count: int, window: Window) -> dict[str, Any]:
    """The ordered drain with no client library: what asyncio's loop alone costs per message.

    One bare ``asyncio.BufferedProtocol`` per partition leader (found by one lookup, not timed):
    IDENTIFY, ``SUB_ORDERED``, ``RDY 1``, then for every message frame the FIN of its id,
    written inside ``data_received``. No order check, no flow control, no handler call: the
    floor under any asyncio client of the same exchange. A message whose id equals the
    connection's previous one (the server's duplicated first ordered delivery) is FINed but
    not counted.
    """
    import urllib.request

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    seen = 0
    with urllib.request.urlopen(f"http://{lookupd}/lookup?topic={topic}&access=r",
                                timeout=30) as resp:
        answer = json.loads(resp.read())
    answer = answer.get("data", answer)
    leaders = {int(p): (peer["broadcast_address"], int(peer["tcp_port"]))
               for p, peer in (answer.get("partitions") or {}).items()}
    identify = json.dumps({"client_id": "floor", "hostname": "floor",
                           "feature_negotiation": True, "heartbeat_interval": 30000}).encode()

    # a BufferedProtocol reading into one preallocated buffer: a plain Protocol's recv of
    # 256 KiB per read costs an mmap, a munmap and page faults per read (3 more system calls
    # per message here), which no client needs to pay
    view = memoryview(bytearray(256 * 1024))

    class Floor(asyncio.BufferedProtocol):
        def __init__(self, partition: int) -> None:
            self.partition = partition
            self.buf = b""
            self.last = b""
            self.transport: Any = None

        def get_buffer(self, sizehint: int) -> memoryview:
            return view

        def buffer_updated(self, nbytes: int) -> None:
            self.data_received(bytes(view[:nbytes]))

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            transport.write(b"  V2IDENTIFY\n" + len(identify).to_bytes(4, "big") + identify
                            + f"SUB_ORDERED {topic} {CHANNEL} {self.partition}\nRDY 1\n"
                            .encode())

        def data_received(self, data: bytes) -> None:
            nonlocal seen
            buf = self.buf + data if self.buf else data
            pos, n = 0, len(buf)
            while n - pos >= 8:
                end = pos + 4 + int.from_bytes(buf[pos:pos + 4], "big")
                if end > n:
                    break
                kind = buf[pos + 7]
                if kind == 2:
                    mid = buf[pos + 18:pos + 34]
                    self.transport.write(b"FIN " + mid + b"\n")
                    if mid != self.last:
                        self.last = mid
                        seen += 1
                        if seen == 1:
                            window.start()
                        elif seen == count:
                            window.stop()
                            done.set_result(None)
                elif kind == 1:
                    # the FIN of the duplicated first delivery fails (the copy was not in
                    # flight): expected; any other error ends the run
                    text = buf[pos + 8:end].decode("ascii", "replace")
                    if not text.startswith("E_FIN_FAILED") and not done.done():
                        done.set_exception(RuntimeError(text))
                elif buf[pos + 8:end] == b"_heartbeat_":
                    self.transport.write(b"NOP\n")
                pos = end
            self.buf = buf[pos:]

    transports = []
    for partition, (host, port) in sorted(leaders.items()):
        transport, _ = await loop.create_connection(lambda p=partition: Floor(p), host, port)
        transports.append(transport)
    try:
        await asyncio.wait_for(done, 600)
    finally:
        for transport in transports:
            transport.close()
    return {"handled": seen, "partitions": len(leaders)}


async def publish(lookupd: str, topic: str, item: str, count: int,
                  window: Window) -> dict[str, Any]:
    from smartnsq import Producer

    options: dict[str, Any] = {}
    if item == "pub-seq-plain":
        options["sharded_receipts"] = False
    if item.endswith("-linger"):
        options.update(sharded_receipts=False, linger=0.002)
        item = item.removesuffix("-linger")
    body = b"x" * BODY
    async with Producer(lookupd=[lookupd], **options) as producer:
        pub = producer.publish
        for p in range(PARTITIONS):  # warm-up: lookup and every leader's connection
            await pub(topic, body, partition=p)
        window.start()
        if item in ("pub-seq", "pub-seq-plain"):
            for i in range(count):
                await pub(topic, body, sharding_key=key(i))
        elif item == "pub-seq-traced":
            for i in range(count):
                await pub(topic, body, sharding_key=key(i), trace_id=i + 1)
        elif item == "pub-conc64":
            async def one_of_64(start: int) -> None:
                for i in range(start, count, 64):
                    await pub(topic, body, sharding_key=key(i))

            await asyncio.gather(*[one_of_64(s) for s in range(64)])
        elif item == "pub-nowait":
            nowait = producer.publish_nowait
            for w in range(0, count, 1024):
                await asyncio.gather(*[nowait(topic, body, sharding_key=key(i))
                                       for i in range(w, min(w + 1024, count))])
        elif item == "pub-many":
            many = producer.publish_many
            for b, i in enumerate(range(0, count, 100)):
                await many(topic, [body] * min(100, count - i), sharding_key=key(b))
        else:
            raise ValueError(item)
        window.stop()
    return {}


def by_module(stats: Any, count: int) -> str:
    """Calls and own time per message, summed per source file (deterministic call counts
    are the figure to compare on a loaded machine; cProfile's times are wall clock)."""
    groups: dict[str, list[float]] = {}
    total_calls = 0
    total_time = 0.0
    for (filename, _line, func), (_cc, ncalls, tottime, _ct, _callers) in stats.stats.items():
        if filename == "~":
            name = f"C: {func.split(' of ')[-1].strip('<>{}') if ' of ' in func else func}"
        elif "/smartnsq/" in filename:
            name = "smartnsq/" + filename.split("/smartnsq/", 1)[1]
        elif "/asyncio/" in filename:
            name = "asyncio/" + filename.split("/asyncio/", 1)[1]
        else:
            name = os.path.basename(filename)
        g = groups.setdefault(name, [0, 0.0])
        g[0] += ncalls
        g[1] += tottime
        total_calls += ncalls
        total_time += tottime
    lines = [f"function calls per message: {total_calls / count:.1f} "
             f"(own time {total_time / count * 1e6:.1f} us per message, wall clock, with "
             "the profiler's overhead)", "",
             f"{'source':<44} {'calls/msg':>10} {'own us/msg':>11} {'share':>6}"]
    for name, (calls, tt) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:22]:
        lines.append(f"{name:<44} {calls / count:>10.2f} {tt / count * 1e6:>11.1f} "
                     f"{tt / total_time:>6.0%}")
    return "\n".join(lines)


def rss_kib() -> int:
    """Peak RSS in KiB: VmHWM (ru_maxrss keeps the forking orchestrator's high-water mark)."""
    import resource

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def worker(argv: list[str]) -> int:
    item, lookupd, topic, count_s, loop_kind, flags = argv
    count = int(count_s)
    if loop_kind == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from smartnsq import Consumer, Producer  # noqa: F401  - what a user's process imports

    if "otel" in flags:  # every client traced, every message sampled; spans recorded, dropped
        from opentelemetry.sdk.trace import TracerProvider

        import smartnsq.observability.otel

        smartnsq.observability.otel.instrument(TracerProvider())
    after_import = rss_kib()
    if item.startswith("preload-"):
        asyncio.run(preload(lookupd, topic, item.removeprefix("preload-"), count))
        print(json.dumps({"ok": True}), flush=True)
        return 0
    profiler = None
    if "profile" in flags:
        import cProfile

        profiler = cProfile.Profile()

    async def run() -> tuple[dict[str, Any], Window]:
        counter = LoopCounter(asyncio.get_running_loop()) if "count" in flags else None
        window = Window(counter, profiler)
        if item == "ordered-floor":
            extra = await ordered_floor(lookupd, topic, count, window)
        elif item in ("drain", "ordered"):
            extra = await drain(lookupd, topic, item, count, window)
        else:
            extra = await publish(lookupd, topic, item, count, window)
        if counter:
            extra["per_msg"] = {k: v / count for k, v in counter.counts.items()}
        return extra, window

    extra, window = asyncio.run(run())
    result = {"count": count, "seconds": window.wall, "rate": count / window.wall,
              "cpu_us": window.cpu / count * 1e6, "peak_kib": rss_kib(),
              "user_us": window.user / count * 1e6, "sys_us": window.sys / count * 1e6,
              "import_kib": after_import, **extra}
    if profiler is not None:
        import io
        import pstats

        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(25)
        out.write("smartnsq's own functions, by calls:\n")
        stats.sort_stats("ncalls").print_stats("/smartnsq/", 40)
        result["profile"] = by_module(stats, count) + "\n" + out.getvalue()
    print(json.dumps(result), flush=True)
    return 0


# -- the orchestrator --------------------------------------------------------------------------

def fmt_ref(ref: tuple[float, float] | None) -> str:
    return "-" if ref is None else f"{ref[0]:,.0f} msg/s, {ref[1]:g} us"


def left_in_channel(cluster: Any, topic: str) -> int:
    import urllib.request

    left = 0
    for http in cluster.nsqd_http:
        req = urllib.request.Request(f"http://{http}/stats?format=json&topic={topic}",
                                     headers={"Accept": "application/vnd.nsq; version=1.0"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            data = json.loads(resp.read())
        data = data.get("data", data)
        for t in data.get("topics") or []:
            if t.get("topic_name") != topic or not t.get("is_leader"):
                continue
            for ch in t.get("channels") or []:
                if ch.get("channel_name") == CHANNEL:
                    left += int(ch.get("depth", 0)) + int(ch.get("in_flight_count", 0))
    return left


class Runner:
    """Runs one work item: a fresh topic, the pre-load, the timed worker, the server check."""

    def __init__(self, cluster: Any, loop: str, notes: list[str], run_worker: Any) -> None:
        self.cluster = cluster
        self.lookupd = cluster.lookupd_http[0]
        self.loop = loop
        self.notes = notes
        self.run_worker = run_worker
        # uvloop's transports are not asyncio.Transport subclasses, which Connection.
        # connection_made asserts: uvloop workers run with python -O until that assertion goes
        self.opt = ["-O"] if loop == "uvloop" else []

    def item(self, item: str, count: int, flags: str = "-",
             prefix: list[str] | None = None) -> dict[str, Any]:
        cluster = self.cluster
        from _common import baseline_name, topic_part

        drains = ("drain", "ordered", "ordered-floor")
        kind = baseline_name(item)  # (an ``@base`` item: the same work, the baseline's tree)
        if kind in ("ordered", "ordered-floor"):
            count -= count % KEYS
        topic = f"bench_yz_{topic_part(item)}"
        cluster.fresh_topic(topic, CHANNEL, partitions=PARTITIONS, replicas=REPLICAS)
        try:
            if kind in drains:
                load = "ordered" if kind == "ordered-floor" else kind  # the same messages
                loaded = self.run_worker("youzan.py", [f"preload-{load}", self.lookupd, topic,
                                                       str(count), self.loop, "-"],
                                         timeout=300, python_flags=self.opt)
                if "error" in loaded:
                    return {"error": f"pre-loading failed: {loaded['error']}"}
            cpu = self.server_cpu()
            result: dict[str, Any] = self.run_worker(
                "youzan.py", [item, self.lookupd, topic, str(count), self.loop, flags],
                timeout=900, prefix=prefix or [], python_flags=self.opt)
            if "error" in result:
                return result
            if cpu is not None:
                result["server_us"] = cpu.used() / count * 1e6
            if kind in drains:
                result["left"] = left_in_channel(cluster, topic)
                result["verified"] = result["left"] == 0
            else:
                stored = cluster.youzan_count(topic)
                result["verified"] = stored == count + WARMUP
                if not result["verified"]:
                    self.notes.append(f"{item}: the leaders hold {stored} messages, "
                                      f"expected {count + WARMUP}")
            return result
        finally:
            cluster.drop_topic(topic)


    def server_cpu(self) -> Any:
        """The real nsqd processes' CPU over a run (None on the dev cluster: one process)."""
        pids = getattr(self.cluster, "nsqd_pids", None)
        if not pids:
            return None
        from _real import ServerCpu

        return ServerCpu(pids)

    def go_item(self, item: str, count: int, go: Any, handlers: int) -> dict[str, Any]:
        """The same work item by youzan's Go client (``yzgo``), on a fresh topic."""
        cluster = self.cluster
        if item == "ordered":
            count -= count % KEYS
        topic = f"bench_yzgo_{item.replace('-', '_')}"
        cluster.fresh_topic(topic, CHANNEL, partitions=PARTITIONS, replicas=REPLICAS)
        lookupds = ",".join(cluster.lookupd_http)
        try:
            if item in ("drain", "ordered"):
                loaded = self.run_worker("youzan.py", [f"preload-yz-{item}", self.lookupd,
                                                       topic, str(count), self.loop, "-"],
                                         timeout=300, python_flags=self.opt)
                if "error" in loaded:
                    return {"error": f"pre-loading failed: {loaded['error']}"}
                args = (["consume", topic, CHANNEL, str(count), "2500", str(handlers),
                         lookupds] if item == "drain" else
                        ["ordered", topic, CHANNEL, str(count), str(PARTITIONS * 4),
                         str(handlers), lookupds, str(KEYS)])
            else:
                args = ["pub", topic, str(count), str(KEYS), str(GO_CONCURRENCY[item]),
                        lookupds]
            cpu = self.server_cpu()
            data = go.yzgo(args)
            if "error" in data:
                return data
            server_s = cpu.used() if cpu is not None else None
            msgs = int(data.get("messages") or count)
            result: dict[str, Any] = {
                "count": msgs, "seconds": float(data["seconds"]), "rate": float(data["rate"]),
                "cpu_us": float(data["cpu_s"]) / msgs * 1e6,
                "peak_kib": data["wait4_peak_kib"], "yzgo": data}
            if server_s is not None:
                result["server_us"] = server_s / msgs * 1e6
            if item in ("drain", "ordered"):
                result["left"] = left_in_channel(cluster, topic)
                result["verified"] = result["left"] == 0
            else:
                stored = cluster.youzan_count(topic)
                result["verified"] = stored == count
                if not result["verified"]:
                    self.notes.append(f"yzgo {item}: the leaders hold {stored} messages, "
                                      f"expected {count}")
            return result
        finally:
            cluster.drop_topic(topic)


# the work items yzgo has, and its goroutines each publishing one at a time
GO_CONCURRENCY = {"pub-seq": 1, "pub-seq-plain": 1, "pub-conc64": 64, "pub-nowait": 1024}
GO_ITEMS = ("drain", "ordered", *GO_CONCURRENCY)
# the goals on the real youzan cluster: (rate ratio over yzgo, CPU us/msg bound, CPU no
# more than Go's)
REAL_GOALS: dict[str, tuple[float | None, float | None, bool]] = {
    "ordered": (1.2, 40.0, False), "pub-seq": (1.0, None, False),
    "pub-seq-plain": (1.0, None, False), "pub-nowait": (1.2, None, True)}
REAL_RSS_KIB = 30 * 1024


# one message in flight: the client's speed does not change how the server batches, so
# instruction counts taken under valgrind (50x slower) hold; with many in flight they do not
INSTRUCTION_ITEMS = {"ordered": 400, "ordered-floor": 400, "pub-seq": 300, "pub-seq-plain": 300,
                     "pub-seq-traced": 300}


def instructions(run: Runner, items: list[str], notes: list[str], flags: str = "-") -> None:
    """User-space instructions per message: two callgrind runs, N and 3N, by difference."""
    import tempfile

    from _common import baseline_name, table

    rows = []
    with tempfile.TemporaryDirectory(prefix="smartnsq-callgrind-") as tmp:
        for item in items:
            n1 = INSTRUCTION_ITEMS.get(baseline_name(item))
            if n1 is None:
                notes.append(f"{item}: not counted (many in flight: under valgrind the client "
                             "reads one by one what it would read in batches)")
                continue
            totals = []
            for n in (n1, 3 * n1):
                out = os.path.join(tmp, f"{item}-{n}.out")
                result = run.item(item, n, flags, ["valgrind", "--tool=callgrind",
                                                  f"--callgrind-out-file={out}"])
                if "error" in result:
                    notes.append(f"{item} (N={n}): {result['error']}")
                    break
                with open(out) as f:
                    totals.append(int(next(ln for ln in f if ln.startswith("totals:"))
                                      .split()[1]))
            if len(totals) == 2:
                rows.append([item, ITEMS[baseline_name(item)]["label"],
                             f"{n1:,} / {3 * n1:,}", f"{totals[0]:,} / {totals[1]:,}",
                             f"{(totals[1] - totals[0]) / (2 * n1):,.0f}"])
    print(table(["item", "work", "N", "instructions (whole process)",
                 "user-space instructions per message"], rows))
    print("\nvalgrind --tool=callgrind on the client worker, run with N and 3N messages; the "
          "difference over 2N leaves out start-up and imports. The kernel's work is not "
          "counted.")
    for note in notes:
        print(f"  - {note}")


def keep_best(best: dict[str, dict[str, Any]], item: str, result: dict[str, Any]) -> None:
    """The best rate, the lowest CPU, peak and server CPU over the rounds."""
    prev = best.get(item)
    if prev is None or "error" in prev:
        best[item] = result
    elif "error" not in result:
        keep = result if result["rate"] > prev["rate"] else prev
        for k in ("cpu_us", "peak_kib", "server_us"):
            if k in prev and k in result:
                keep[k] = min(prev[k], result[k])
        best[item] = keep


def report_real(best: dict[str, dict[str, Any]], best_go: dict[str, dict[str, Any]],
                items: list[str]) -> None:
    """smartnsq beside yzgo on the real cluster, and the goals."""
    from _common import fmt_kib, table

    rows, goal_rows = [], []
    for item in items:
        me, g = best.get(item, {}), best_go.get(item)
        if not me or "error" in me:
            continue

        def cells(r: dict[str, Any] | None) -> list[str]:
            if r is None:
                return ["-", "-", "-", "-"]
            if "error" in r:
                return ["failed", "-", "-", "-"]
            mark = "" if r.get("verified") else " (!)"
            return [f"{r['rate']:,.0f}{mark}", f"{r['cpu_us']:.1f}",
                    f"{r['server_us']:.1f}" if "server_us" in r else "-",
                    fmt_kib(r["peak_kib"])]

        ratio = (f"{me['rate'] / g['rate']:.2f}x" if g and "error" not in g else "-")
        rows.append([item, *cells(me), *cells(g), ratio])
        goal = REAL_GOALS.get(item)
        if goal and g and "error" not in g:
            rate_goal, cpu_bound, cpu_vs_go = goal
            r_ratio = me["rate"] / g["rate"]
            verdicts = []
            if rate_goal is not None:
                verdicts.append(f"rate {r_ratio:.2f}x (>= {rate_goal:g}x: "
                                f"{'met' if r_ratio >= rate_goal else 'missed'})")
            if cpu_bound is not None:
                verdicts.append(f"CPU {me['cpu_us']:.1f} us (<= {cpu_bound:g}: "
                                f"{'met' if me['cpu_us'] <= cpu_bound else 'missed'})")
            if cpu_vs_go:
                verdicts.append(f"CPU {me['cpu_us']:.1f} vs Go {g['cpu_us']:.1f} us (<= Go: "
                                f"{'met' if me['cpu_us'] <= g['cpu_us'] else 'missed'})")
            goal_rows.append([item, "; ".join(verdicts)])
    peaks = [r["peak_kib"] for r in best.values() if "peak_kib" in r]
    if peaks:
        top = max(peaks)
        verdict = "met" if top <= REAL_RSS_KIB else "missed"
        goal_rows.append(["peak RSS (every item)",
                          f"{fmt_kib(top)} (<= {fmt_kib(REAL_RSS_KIB)}: {verdict})"])
    print("\nsmartnsq beside youzan's Go client (yzgo) on the real cluster\n")
    print(table(["item", "smartnsq msg/s", "CPU us/msg", "nsqd CPU us/msg", "peak RSS",
                 "yzgo msg/s", "CPU us/msg", "nsqd CPU us/msg", "peak RSS",
                 "smartnsq / yzgo"], rows))
    print("\ngoals (real youzan cluster)\n")
    print(table(["item", "verdict"], goal_rows))
    print("\nhow: smartnsq's msg/s and CPU are over its timed window (publish: after one "
          "warm-up publish per partition; drains: first message handled to the N-th); yzgo's "
          "are its own RESULT line (rate, cpu_s over its window, which starts before its "
          "producer or consumer is made, so it includes lookups and connects); yzgo's peak "
          "RSS is its process's VmHWM; nsqd CPU: the 3 nsqd processes' /proc/PID/stat over "
          "the whole client run (pre-load excluded), over the messages. yzgo pub: N "
          "goroutines each publishing one at a time (1 = one at a time, 64, 1024 = 1024 "
          "outstanding); consume/ordered: max_in_flight 2500 / 16, --handlers goroutines.")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    import argparse
    import shlex

    from _common import (
        baseline_name,
        command_line,
        dev_cluster,
        environment,
        fmt_kib,
        run_worker,
        set_baseline,
        table,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (about 30 s)")
    parser.add_argument("--items", default=",".join(i for i in ITEMS if i not in OPT_IN),
                        help=f"comma-separated, of {','.join(ITEMS)}")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages per item (default: per item, see --help of the items)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every item R times, interleaved; the table keeps the "
                             "lowest CPU, the best rate and the lowest peak of each")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--count", action="store_true",
                        help="count event-loop iterations, callbacks, timers, tasks and "
                             "futures per message (asyncio only; adds its own cost)")
    parser.add_argument("--profile", default="", metavar="ITEM",
                        help="run ITEM under cProfile and print its top functions")
    parser.add_argument("--instructions", action="store_true",
                        help="user-space instructions per message of the one-in-flight items "
                             "(ordered, pub-seq*), by callgrind: two runs each, N and 3N "
                             "(a few minutes)")
    parser.add_argument("--otel", action="store_true",
                        help="trace every client with OpenTelemetry "
                             "(smartnsq.observability.otel.instrument with the SDK's "
                             "TracerProvider: every message sampled, no "
                             "exporter): the instrumentation's cost (the otel extra)")
    parser.add_argument("--prefix", default="", metavar="COMMAND",
                        help="run the timed workers under COMMAND, e.g. 'valgrind "
                             "--tool=callgrind --callgrind-out-file=/tmp/cg.%%p' (instruction "
                             "counts: run two message counts and take the difference)")
    parser.add_argument("--server", choices=("devcluster", "real"), default="devcluster",
                        help="real: the real youzan cluster (etcd, 2 nsqlookupd, 3 nsqd) "
                             "started here from --real DIR or $SMARTNSQ_REAL_NSQ, with "
                             "youzan's Go client (yzgo) run beside smartnsq on the items it has")
    parser.add_argument("--real", default=None, metavar="DIR",
                        help="--server real: the real binaries' folder")
    parser.add_argument("--handlers", type=int, default=PARTITIONS,
                        help="--server real: yzgo's handler goroutines (default: one per "
                             "partition)")
    parser.add_argument("--no-go", action="store_true", help="--server real: skip yzgo")
    parser.add_argument("--pure", action="store_true",
                        help="each item also runs on the pure-Python modules, named ITEM@pure "
                             "(SMARTNSQ_NO_EXTENSIONS=1), in the same run and interleaved")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="another checkout of smartnsq (the tree before a change): each "
                             "item also runs from it, named ITEM@base, in the same run and "
                             "interleaved")
    args = parser.parse_args()
    real = args.server == "real"
    items = [i for i in args.items.split(",") if i]
    for i in items:
        if i not in ITEMS:
            parser.error(f"unknown item {i!r}")
    if args.count and args.loop != "asyncio":
        parser.error("--count needs the asyncio loop")
    if args.baseline:
        print(f"baseline (items ITEM@base): {set_baseline(args.baseline)}")
        items = [i for item in items for i in (item, item + "@base")]
    if args.pure:
        print("pure path (items ITEM@pure): SMARTNSQ_NO_EXTENSIONS=1")
        items = [i for item in items for i in (item, item + "@pure")]
    flags = ",".join(f for f, on in (("count", args.count), ("profile", False),
                                     ("otel", args.otel)) if on) or "-"

    go = None
    if real:
        from _real import GoTools, real_dir, real_server

        folder = real_dir(args.real)
        if not args.no_go:
            go = GoTools(folder)
            if go.available("yzgo"):
                print(f"yzgo not run: {go.available('yzgo')}")
                go = None
    where = ("the real youzan cluster (etcd, 3 nsqd, 2 nsqlookupd, processes started here)"
             if real else "dev cluster (youzan, 3 nsqd, 2 nsqlookupd) in its own process")
    print(f"youzan hot paths: {where}, "
          f"a fresh {PARTITIONS}-partition x {REPLICAS}-replica topic per item, {BODY}-byte "
          f"bodies, {KEYS} sharding keys; each item in its own interpreter on {args.loop}; "
          f"{args.rounds} round(s){'; yzgo beside smartnsq, interleaved' if go else ''}\n")
    best: dict[str, dict[str, Any]] = {}
    best_go: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    profiles: dict[str, str] = {}
    started = time.monotonic()
    server_cm = (real_server("youzan", folder, nodes=3, lookupds=2) if real
                 else dev_cluster("youzan", nodes=3, lookupds=2))
    with server_cm as cluster:
        run = Runner(cluster, args.loop, notes, run_worker)
        if args.instructions:
            instructions(run, items, notes, flags)
            server = cluster.describe()
            print(f"\ncommand: {command_line()}")
            print(environment(f"server: {server}\n  event loop  {args.loop}"))
            return 0
        for rnd in range(args.rounds):
            for item in items[rnd % len(items):] + items[:rnd % len(items)]:
                count = args.messages or COUNTS[baseline_name(item)][1 if args.quick else 0]
                item_flags = flags
                if args.profile == item:
                    item_flags = ",".join(f for f in (flags, "profile") if f != "-")
                go_first = go is not None and item in GO_ITEMS and rnd % 2 == 1
                if go_first:
                    keep_best(best_go, item, run.go_item(item, count, go, args.handlers))
                result = run.item(item, count, item_flags, shlex.split(args.prefix))
                if go is not None and item in GO_ITEMS and not go_first:
                    keep_best(best_go, item, run.go_item(item, count, go, args.handlers))
                if real:
                    r_, g_ = result, best_go.get(item, {})
                    print(f"  round {rnd + 1} {item:<14} smartnsq "
                          + (f"{r_['rate']:,.0f} msg/s {r_['cpu_us']:.1f} us"
                             if "error" not in r_ else r_["error"])
                          + (f" | yzgo (best) {g_['rate']:,.0f} msg/s {g_['cpu_us']:.1f} us"
                             if g_ and "error" not in g_ else f" | yzgo {g_.get('error', '-')}"),
                          flush=True)
                if "profile" in result:
                    profiles[item] = result.pop("profile")
                keep_best(best, item, result)
        server = cluster.describe()

    rows = []
    for item in items:
        spec = ITEMS[baseline_name(item)]
        r = best.get(item)
        if r is None or "error" in r:
            rows.append([item, spec["label"], "failed", "-", "-", "-", "-", "-", "-"])
            if r is not None:
                notes.append(f"{item}: {r['error']}")
            continue
        target = spec["target"]
        verdict = "-" if target is None else ("met" if r["cpu_us"] <= target else
                                              f"missed ({r['cpu_us'] / target:.2f}x)")
        mark = "" if r.get("verified") else " (!)"
        rows.append([item, spec["label"], f"{r['rate']:,.0f}{mark}",
                     f"{r['cpu_us']:.1f} ({r['user_us']:.0f}/{r['sys_us']:.0f})",
                     "-" if target is None else f"<= {target:g}", verdict,
                     f"{fmt_kib(r['peak_kib'])} ({fmt_kib(r['import_kib'])} after import)",
                     fmt_ref(spec["go"]), fmt_ref(spec["real"])])
        if baseline_name(item) == "ordered":
            notes.append(f"ordered: {r.get('redelivered', 0)} redelivered (a key's message "
                         f"seen again after it was handled), {r.get('order_errors', 0)} per-key "
                         f"order errors, {r.get('handled', 0)} handler calls")
        if r.get("left"):
            notes.append(f"{item}: {r['left']} messages left in the channel")
    print(table(["item", "work", "msg/s", "client CPU us/msg (user/sys)", "target",
                 "CPU target",
                 "peak RSS", "Go client (reference)", "smartnsq, real cluster (reference)"],
                rows))
    if real:
        report_real(best, best_go, items)
    plain = best.get("pub-seq-plain", {})
    for other in ("pub-seq", "pub-seq-traced"):
        r = best.get(other, {})
        if "cpu_us" in r and "cpu_us" in plain:
            notes.append(f"{other} vs pub-seq-plain: {r['cpu_us'] - plain['cpu_us']:+.1f} us "
                         f"of client CPU per message ({r['cpu_us'] / plain['cpu_us']:.2f}x), "
                         f"rate {r['rate'] / plain['rate']:.2f}x")
    if notes:
        print("\nnotes:")
        for note in notes:
            print(f"  - {note}")
    if args.count:
        print("\nper message, over the timed window (asyncio loop instrumented):\n")
        count_rows = []
        for item in items:
            per = best.get(item, {}).get("per_msg")
            if per:
                count_rows.append([item, *(f"{per[k]:.3f}" for k in
                                           ("iterations", "call_soon", "timers", "tasks",
                                            "futures"))])
        print(table(["item", "loop iterations", "call_soon", "timers (call_at)", "tasks",
                     "futures (loop.create_future)"], count_rows))
    for item, text in profiles.items():
        count = best[item]["count"]
        print(f"\ncProfile of {item} ({count:,} messages; divide ncalls by {count:,} for "
              f"calls per message):\n")
        print(text)
    print("\nmsg/s: wall clock over the timed window"
          + (" (the real cluster: the rates compare with yzgo's, taken in the same run). "
             if real else
             " (the dev cluster is a Python broker on the same 2 cores: compare the CPU "
             "column with the Go client's, not the rates). ")
          + ("client CPU: user + system time of the client process over the same window. peak "
          "RSS: the client process's VmHWM at the end (after import: right after "
          "`from smartnsq import Producer, Consumer`). (!): the server-side check failed."))
    print(f"\nelapsed {time.monotonic() - started:.0f} s")
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: {server}\n  event loop  {args.loop}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
