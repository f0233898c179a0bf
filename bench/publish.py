"""Publish throughput: smartnsq's Producer against the Python peers, same endpoint, same run.

    python bench/publish.py [--quick] [--server minimal|devcluster|real|nsqd=HOST:PORT[,...]]
                            [--body 100,1024] [--messages N] [--sequential N] [--window W]
                            [--rounds R] [--clients smartnsq,pynsq,...] [--via nsqd|lookupd]
                            [--loop asyncio|uvloop]

Clients: ``smartnsq`` (``smartnsq.Producer``, asyncio), ``smartnsq-sync`` (the
blocking ``smartnsq.sync.Producer``, calls cross to a background event loop thread; its
pipelined row is 8 threads each publishing one at a time, sharing one producer), pynsq
(``nsq.Writer``, tornado callbacks), gnsq (``gnsq.Producer``, gevent), ansq
(``open_connection``), asyncnsq (``create_writer``), and ``asyncio-floor``: no library, the
thinnest asyncio Protocol driven like the asyncio clients, which shows what the event loop
alone allows.

The server: by default (``--server minimal``) ``bench/_endpoint.py`` in its own process, which
answers OK to every publish as fast as its socket allows, so that the client is what is
measured; the bodies are 100 B (``--body 100,1024`` adds 1 KiB), and the goals (smartnsq's rate
over the best peer's: >= 2x one at a time, >= 3x pipelined, >= 1.2x MPUB) are printed against
the best peer. ``--server devcluster``: one classic nsqd of the dev cluster (its own process,
loopback; ``--cluster youzan``: one youzan nsqd and a one-partition topic, which the peers
write without naming the partition).
``--server nsqd=HOST:PORT[,lookupd=HOST:PORT][,http=HOST:PORT]``: a server this script does not
start (a real nsqd 1.3.0 with ``nsqd -tcp-address 127.0.0.1:4150``; ``http`` defaults to the
TCP port + 1), used exactly like the dev cluster: a fresh topic per run over nsqd's HTTP API,
the stored message count checked, the topic deleted; with ``lookupd=`` smartnsq finds the node
through it (``--via``); ``--cluster youzan`` for a youzan server (it needs ``lookupd=`` to
create topics).

``--server real`` (binaries from ``--real DIR`` or ``$SMARTNSQ_REAL_NSQ``) starts a real
classic nsqd 1.3.0 here (``bench/_real.py``) and runs smartnsq on asyncio and on uvloop, the
Python peers, the floor and the Go tools (``to_nsq`` one at a time, ``bench_writer`` MPUB of 1
and of 100) interleaved, with the nsqd's own CPU per message, and prints the goals against the
real nsqd (see ``bench/README.md``).

``--loop uvloop`` runs the asyncio clients (smartnsq, smartnsq-sync, ansq, asyncnsq and the
floor) on uvloop (the ``fast`` extra: ``pip install smartnsq[fast]``) by installing its event
loop policy in each worker, so the figures with and without it are the same code on another
loop. ``-O`` runs every worker with ``python -O``. uvloop's transports are not subclasses of
``asyncio.Transport``, and ``Connection.connection_made`` (and the floor client) assert that
they are, so ``--loop uvloop`` implies ``-O`` until smartnsq drops that assertion; compare it
with an ``-O`` run on asyncio.

Three ways of publishing:

* sequential: one publish at a time, each awaited (acknowledged) before the next;
* pipelined: windows of W (1024) concurrent publishes on one connection, each window awaited
  (``smartnsq-sync``: 8 threads, each one at a time; ``--window 8`` puts the asyncio rows at 8
  outstanding beside them, to weigh the blocking facade against the asyncio client);
* MPUB x100: batches of 100 messages, each batch awaited before the next.

Each client runs in its own interpreter (gevent's monkeypatching stays with gnsq) after a
one-message warm-up that opens its connection; the clock covers the publishes only. Three
figures per run: msg/s (wall clock), the client's CPU time per message (every thread of its
interpreter; the library's own cost, which the server's speed and the machine's other load
disturb much less than a rate) and its peak memory (``ru_maxrss`` at the end minus the
reading after importing the library). The server's message count is checked after each run.
With ``--rounds R`` the clients take turns R times (the order rotates each round) and the
best rate, lowest CPU cost and lowest peak of each are kept, which evens out the noise of a
shared machine. Ratios are each client's figure over smartnsq's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from _common import (
    PEERS,
    PURE_SUFFIX,
    ServerSpec,
    Span,
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

MODES = {"seq": "sequential", "pipe": "pipelined", "mpub": "MPUB x100"}
CLIENTS = ("smartnsq", "smartnsq-sync", *PEERS)
SKIP: set[tuple[str, str]] = set()
SYNC_THREADS = 8  # the blocking facade's "pipelined" row: this many threads, one producer
BATCH = 100


def _batches(count: int) -> list[int]:
    return [min(BATCH, count - i) for i in range(0, count, BATCH)]


def _windows(count: int, window: int) -> list[int]:
    return [min(window, count - i) for i in range(0, count, window)]


# -- workers: each runs in its own interpreter -------------------------------------------------

def work_smartnsq(mode: str, addr: str, lookupd: str, topic: str, count: int, body: bytes,
                  window: int, traced: str = "") -> Span:
    """``traced`` (what tracing costs, ``--worker`` only): "otel" an SDK tracer provider
    tracing every call; "otelN" the same behind ``span_one_in`` N (see consume.py's
    ``sdk_tracer_provider``)."""
    from smartnsq import Producer

    async def run() -> Span:
        where: dict[str, Any] = {"lookupd": [lookupd]} if lookupd else {"nsqd": [addr]}
        if traced:
            from consume import sdk_tracer_provider

            where["tracer_provider"] = sdk_tracer_provider(traced)
            if traced[4:].isdigit():
                where["span_one_in"] = int(traced[4:])
        async with Producer(**where) as producer:
            publish = producer.publish
            await publish(topic, body)  # warm-up: connection and routes
            start = Span.begin()
            if mode == "seq":
                for _ in range(count):
                    await publish(topic, body)
            elif mode == "pipe":
                # many in flight without a task each: publish_nowait returns a future
                nowait = producer.publish_nowait
                for n in _windows(count, window):
                    await asyncio.gather(*[nowait(topic, body) for _ in range(n)])
            else:
                for n in _batches(count):
                    await producer.publish_many(topic, [body] * n)
            return start.end()

    return asyncio.run(run())


def work_smartnsq_sync(mode: str, addr: str, lookupd: str, topic: str, count: int,
                       body: bytes, window: int) -> Span:
    from smartnsq import sync

    where: dict[str, Any] = {"lookupd": [lookupd]} if lookupd else {"nsqd": [addr]}
    with sync.Producer(**where) as producer:
        producer.publish(topic, body)  # warm-up
        start = Span.begin()
        if mode == "seq":
            for _ in range(count):
                producer.publish(topic, body)
        elif mode == "mpub":
            for n in _batches(count):
                producer.publish_many(topic, [body] * n)
        else:  # pipelined: SYNC_THREADS threads, each publishing one at a time
            def publisher(n: int) -> None:
                for _ in range(n):
                    producer.publish(topic, body)

            _in_threads(publisher, count)
        return start.end()


def _in_threads(publisher: Callable[[int], None], count: int) -> None:
    """``count`` publishes shared out among SYNC_THREADS threads, ``publisher(n)`` each."""
    import threading

    share, extra = divmod(count, SYNC_THREADS)
    threads = [threading.Thread(target=publisher, args=(share + (i < extra),))
               for i in range(SYNC_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def work_pynsq(mode: str, addr: str, topic: str, count: int, body: bytes,
               window: int) -> Span:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([addr])
    state: dict[str, Any] = {"left": count, "pending": 0, "error": None, "span": None}
    batches = _batches(count)

    def fail(data: Any) -> bool:
        if isinstance(data, Exception):
            state["error"] = repr(data)
            loop.stop()
            return True
        return False

    def finish() -> None:
        state["span"].end()
        loop.stop()

    def seq_cb(conn: Any, data: Any) -> None:
        if fail(data):
            return
        if state["left"] == 0:
            finish()
            return
        state["left"] -= 1
        writer.pub(topic, body, callback=seq_cb)

    def pipe_cb(conn: Any, data: Any) -> None:
        if fail(data):
            return
        state["pending"] -= 1
        if state["pending"] == 0:
            send_window()

    def send_window() -> None:
        if state["left"] == 0:
            finish()
            return
        n = min(window, state["left"])
        state["left"] -= n
        state["pending"] = n
        for _ in range(n):
            writer.pub(topic, body, callback=pipe_cb)

    def mpub_cb(conn: Any, data: Any) -> None:
        if fail(data):
            return
        if not batches:
            finish()
            return
        writer.mpub(topic, [body] * batches.pop(), callback=mpub_cb)

    def begin(conn: Any, data: Any) -> None:
        if fail(data):
            return
        state["span"] = Span.begin()
        if mode == "seq":
            seq_cb(conn, data)
        elif mode == "pipe":
            send_window()
        else:
            mpub_cb(conn, data)

    def when_connected() -> None:
        if not writer.conns:
            loop.call_later(0.01, when_connected)
            return
        writer.pub(topic, body, callback=begin)  # warm-up

    loop.call_later(0.01, when_connected)
    loop.start()
    if state["error"]:
        raise RuntimeError(state["error"])
    span: Span = state["span"]
    return span


def work_gnsq(mode: str, addr: str, topic: str, count: int, body: bytes, window: int) -> Span:
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    import gnsq

    producer = gnsq.Producer([addr])
    producer.start()
    producer.publish(topic, body)  # warm-up
    start = Span.begin()
    if mode == "seq":
        for _ in range(count):
            producer.publish(topic, body)
    elif mode == "pipe":
        for n in _windows(count, window):
            results = [producer.publish(topic, body, raise_error=False) for _ in range(n)]
            for result in results:
                result.get()
    else:
        for n in _batches(count):
            producer.multipublish(topic, [body] * n)
    elapsed = start.end()
    producer.close()
    return elapsed


def work_ansq(mode: str, addr: str, topic: str, count: int, body: bytes, window: int) -> Span:
    import ansq

    host, port = addr.rsplit(":", 1)

    def check(response: Any) -> None:
        if not response.is_ok:
            raise RuntimeError(repr(response))

    async def run() -> Span:
        conn = await ansq.open_connection(host, int(port))
        check(await conn.pub(topic, body))
        start = Span.begin()
        if mode == "seq":
            for _ in range(count):
                check(await conn.pub(topic, body))
        elif mode == "pipe":
            for n in _windows(count, window):
                for r in await asyncio.gather(*[conn.pub(topic, body) for _ in range(n)]):
                    check(r)
        else:
            for n in _batches(count):
                check(await conn.mpub(topic, *([body] * n)))
        elapsed = start.end()
        await conn.close()
        return elapsed

    return asyncio.run(run())


def work_asyncnsq(mode: str, addr: str, topic: str, count: int, body: bytes,
                  window: int) -> Span:
    import asyncnsq

    host, port = addr.rsplit(":", 1)

    def check(response: Any) -> None:
        if response != b"OK":
            raise RuntimeError(repr(response))

    async def run() -> Span:
        writer = await asyncnsq.create_writer(host, int(port))
        check(await writer.pub(topic, body))
        start = Span.begin()
        if mode == "seq":
            for _ in range(count):
                check(await writer.pub(topic, body))
        elif mode == "pipe":
            for n in _windows(count, window):
                for r in await asyncio.gather(*[writer.pub(topic, body) for _ in range(n)]):
                    check(r)
        else:
            for n in _batches(count):
                check(await writer.mpub(topic, *([body] * n)))
        elapsed = start.end()
        writer.close()
        return elapsed

    return asyncio.run(run())


def work_floor(mode: str, addr: str, topic: str, count: int, body: bytes, window: int) -> Span:
    """The thinnest asyncio client: what the event loop alone costs per publish.

    Not a library: a Protocol that writes a pre-built PUB/MPUB and resolves one future per
    answer, with no validation, routing, retries or error handling. The benchmark drives it
    exactly like the asyncio clients (an awaited call per publish, ``asyncio.gather`` for the
    pipelined windows), so the gap between it and smartnsq is smartnsq's own cost and what it
    shares with it is the asyncio floor.
    """
    import collections
    import struct

    host, port = addr.rsplit(":", 1)
    pub = b"PUB " + topic.encode() + b"\n" + struct.pack(">I", len(body)) + body

    def mpub(n: int) -> bytes:
        data = struct.pack(">I", n) + b"".join(struct.pack(">I", len(body)) + body
                                                for _ in range(n))
        return b"MPUB " + topic.encode() + b"\n" + struct.pack(">I", len(data)) + data

    class Floor(asyncio.Protocol):
        def __init__(self) -> None:
            self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
            self.buf = b""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            buf = self.buf + data if self.buf else data
            pos, end = 0, len(buf)
            while end - pos >= 4:
                stop = pos + 4 + int.from_bytes(buf[pos:pos + 4], "big")
                if stop > end:
                    break
                if buf[pos + 4:pos + 8] == b"\x00\x00\x00\x00" and buf[pos + 8:stop] == b"OK":
                    self.waiters.popleft().set_result(None)
                pos = stop
            self.buf = buf[pos:]

        def send(self, payload: bytes) -> asyncio.Future[None]:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            self.transport.write(payload)
            return fut

    async def run() -> Span:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(Floor, host, int(port))
        proto.transport.write(b"  V2")
        await proto.send(pub)  # warm-up; no IDENTIFY, which nsqd does not require

        async def publish() -> None:
            await proto.send(pub)

        start = Span.begin()
        if mode == "seq":
            for _ in range(count):
                await proto.send(pub)
        elif mode == "pipe":
            for n in _windows(count, window):
                await asyncio.gather(*[publish() for _ in range(n)])
        else:
            for n in _batches(count):
                await proto.send(mpub(n))
        elapsed = start.end()
        proto.transport.close()
        return elapsed

    return asyncio.run(run())


def work_blocking_floor(mode: str, addr: str, topic: str, count: int, body: bytes,
                        window: int) -> Span:
    """The blocking facade's lower bound if the calling thread used the socket itself (to weigh
    that design against the loop thread): no library, no loop thread, a blocking socket written
    and read by the publishing thread. Sequential: one thread, one socket. Pipelined:
    ``SYNC_THREADS`` threads share one socket under a lock (a publish goes out when nothing else
    is in flight, as that design would do), each one at a time, like ``smartnsq-sync``'s row.
    MPUB: batches. Validation, routing, retries, heartbeats and error frames are left out, so a
    real design would cost more than this, never less."""
    import socket
    import struct
    import threading

    host, port = addr.rsplit(":", 1)
    pub = b"PUB " + topic.encode() + b"\n" + struct.pack(">I", len(body)) + body
    ok = struct.pack(">II", 6, 0) + b"OK"

    def mpub(n: int) -> bytes:
        data = struct.pack(">I", n) + b"".join(struct.pack(">I", len(body)) + body
                                                for _ in range(n))
        return b"MPUB " + topic.encode() + b"\n" + struct.pack(">I", len(data)) + data

    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")

    def call(payload: bytes) -> None:
        sock.sendall(payload)
        got = b""
        while len(got) < len(ok):
            chunk = sock.recv(len(ok) - len(got))
            if not chunk:
                raise ConnectionError("closed")
            got += chunk
        if got != ok:
            raise RuntimeError(f"not OK: {got!r}")

    call(pub)  # warm-up
    start = Span.begin()
    if mode == "seq":
        for _ in range(count):
            call(pub)
    elif mode == "mpub":
        for n in _batches(count):
            call(mpub(n))
    else:
        lock = threading.Lock()

        def publisher(n: int) -> None:
            for _ in range(n):
                with lock:
                    call(pub)

        _in_threads(publisher, count)
    elapsed = start.end()
    sock.close()
    return elapsed


# What each worker imports before its baseline memory reading: the library's entry points,
# so that the peak it reports is what publishing costs, not what importing costs.
# (the producer module itself: the package's __init__ imports nothing)
PREIMPORT = {"smartnsq": "smartnsq.producer.producer", "smartnsq-sync": "smartnsq.sync",
             "pynsq": "nsq", "ansq": "ansq", "asyncnsq": "asyncnsq", "asyncio-floor": "asyncio",
             "blocking-floor": "socket"}


def preimport(client: str) -> None:
    if client == "gnsq":
        from gevent import monkey

        monkey.patch_all()  # before anything else imports socket
        import gnsq  # noqa: F401
        return
    importlib.import_module(PREIMPORT[client.split("-otel")[0]])


ASYNCIO_CLIENTS = ("smartnsq", "smartnsq-sync", "ansq", "asyncnsq", "asyncio-floor")


def use_loop(loop: str, client: str) -> None:
    """``--loop uvloop``: every loop the worker creates (asyncio.run, the sync facade's loop
    thread) is a uvloop one, without the library being told."""
    if loop == "uvloop" and client in ASYNCIO_CLIENTS:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def worker(argv: list[str]) -> int:
    client, mode, addr, lookupd, topic, count_s, body_s, window_s, loop = argv
    count, body, window = int(count_s), b"x" * int(body_s), int(window_s)
    use_loop(loop, client)
    preimport(client)
    if lookupd:  # the lookup client (and httpx) is imported on first use: not a publish cost
        importlib.import_module("smartnsq.discovery.lookup")
    baseline = max_rss_kib()
    if client == "smartnsq" or client.startswith("smartnsq-otel"):
        span = work_smartnsq(mode, addr, lookupd, topic, count, body, window,
                             client.partition("-")[2])
    elif client == "smartnsq-sync":
        span = work_smartnsq_sync(mode, addr, lookupd, topic, count, body, window)
    else:
        fn = {"pynsq": work_pynsq, "gnsq": work_gnsq, "ansq": work_ansq,
              "asyncnsq": work_asyncnsq, "asyncio-floor": work_floor,
              "blocking-floor": work_blocking_floor}[client]
        span = fn(mode, addr, topic, count, body, window)
    emit({"count": count, "seconds": span.wall, "rate": count / span.wall,
          "cpu_us": span.cpu / count * 1e6, "sys_us": span.system / count * 1e6,
          "peak_kib": max_rss_kib() - baseline,
          "baseline_kib": baseline})
    return 0


# -- the orchestrator -----------------------------------------------------------------------

GOALS = {"seq": 2.0, "pipe": 3.0, "mpub": 1.2}  # smartnsq's rate over the best peer's


def lookup_landed() -> bool:
    return importlib.util.find_spec("smartnsq.discovery.lookup") is not None


class DevClusterServer:
    """One nsqd of the dev cluster, or a real server; every run gets a fresh topic."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.tcp = cluster.tcp

    def before(self, topic: str) -> None:
        self.cluster.fresh_topic(topic, channel=None)

    def stored(self, topic: str) -> int | None:
        # youzan: summed over the partitions' leaders (a real cluster has several nodes)
        cluster = self.cluster
        count: int | None = (cluster.youzan_count(topic) if cluster.mode == "youzan"
                             else cluster.message_count(topic))
        self.cluster.drop_topic(topic)
        return count


class MinimalServer:
    """bench/_endpoint.py: answers OK to every publish and counts the messages."""

    def __init__(self, endpoint: Any) -> None:
        self.endpoint = endpoint
        self.tcp = endpoint.tcp

    def before(self, topic: str) -> None:
        self.endpoint.connections(expect=0, timeout=0)  # forget anything left over

    def stored(self, topic: str) -> int | None:
        conns = self.endpoint.connections()
        return sum(c["msgs"] for c in conns) if conns else None


@contextmanager
def server(kind: str | ServerSpec, cluster_mode: str) -> Iterator[Any]:
    if kind == "minimal":
        with minimal_endpoint() as endpoint:
            yield MinimalServer(endpoint)
    else:
        with cluster_server(kind, cluster_mode) as cluster:
            yield DevClusterServer(cluster)


def report(best: dict[tuple[str, str, int], dict[str, Any]], clients: list[str],
           modes: list[str], body: int, unavailable: dict[str, str], show_goals: bool) -> None:
    rows, cpu_rows, mem_rows, notes = [], [], [], []
    for client in clients:
        row, cpu_row, mem_row = [client], [client], [client]
        for mode in modes:
            if (client, mode) in SKIP:
                for r_ in (row, cpu_row, mem_row):
                    r_.append("n/a")
                continue
            r = best[(client, mode, body)]
            base = best.get(("smartnsq", mode, body), {})
            if "error" in r:
                for r_ in (row, cpu_row, mem_row):
                    r_.append("failed")
                notes.append(f"{client} {MODES[mode]}: {r['error']}")
                continue
            mark = "" if r["verified"] else " (!)"
            if not r["verified"]:
                notes.append(f"{client} {MODES[mode]}: server counted {r['stored']} messages, "
                             f"expected {r['count'] + 1}")
            row.append(f"{fmt_rate(r['rate'])}{mark} ({fmt_ratio(r['rate'], base.get('rate'))})")
            cpu_row.append(f"{r['cpu_us']:.1f} ({fmt_ratio(r['cpu_us'], base.get('cpu_us'))})")
            mem_row.append(fmt_kib(r["peak_kib"]))
        rows.append(row)
        cpu_rows.append(cpu_row)
        mem_rows.append(mem_row)
    for peer, why in unavailable.items():
        rows.append([peer] + ["not importable"] * len(modes))
        cpu_rows.append([peer] + ["-"] * len(modes))
        mem_rows.append([peer] + ["-"] * len(modes))
        notes.append(f"{peer}: {why}")
    headers = ["client", *(MODES[m] for m in modes)]
    print(f"--- {body}-byte bodies ---\n")
    print("throughput, msg/s (x smartnsq's rate; higher is faster)\n")
    print(table(headers, rows))
    print("\nclient CPU per message, microseconds (x smartnsq's cost; lower is cheaper)\n")
    print(table(headers, cpu_rows))
    print("\npeak memory: RSS high-water mark at the end minus the one after imports "
          "(lower is leaner)\n")
    print(table(headers, mem_rows))
    if notes:
        print("\nnotes:")
        for note in notes:
            print(f"  - {note}")
    if show_goals and "smartnsq" in clients:
        print()
        print(goals(best, clients, modes, body))
    print()


def goals(best: dict[tuple[str, str, int], dict[str, Any]], clients: list[str],
          modes: list[str], body: int) -> str:
    """The goals over the Python peers, against the best peer of each column (rate and CPU both
    shown)."""
    peers = [c for c in clients if c in PEERS]
    rows = []
    for mode in modes:
        me = best.get(("smartnsq", mode, body), {})
        ok = [best[(p, mode, body)] | {"name": p} for p in peers
              if "error" not in best.get((p, mode, body), {"error": 1})]
        if "error" in me or not me or not ok:
            continue
        top = max(ok, key=lambda r: r["rate"])
        cheap = min(ok, key=lambda r: r["cpu_us"])
        lean = min(ok, key=lambda r: r["peak_kib"])
        ratio = me["rate"] / top["rate"]
        cpu_ratio = cheap["cpu_us"] / me["cpu_us"]
        goal = GOALS[mode]
        floor = best.get(("asyncio-floor", mode, body), {})
        floor_cell = (f"{floor['rate'] / top['rate']:.2f}x" if floor and "error" not in floor
                      else "-")
        rows.append([
            MODES[mode], f">= {goal:g}x", f"{ratio:.2f}x vs {top['name']}",
            "met" if ratio >= goal else f"missed ({ratio / goal:.0%} of goal)",
            f"{cpu_ratio:.2f}x vs {cheap['name']}",
            f"{fmt_kib(me['peak_kib'])} vs {fmt_kib(lean['peak_kib'])} ({lean['name']})",
            "met" if me["peak_kib"] <= lean["peak_kib"] else "missed", floor_cell])
    return ("goals: smartnsq's rate over the best peer's; CPU: the cheapest "
            "peer's CPU/msg over smartnsq's; memory: smartnsq's peak vs the leanest peer's; the "
            "last column is the thinnest asyncio client's rate over the same best peer (what "
            "the event loop allows at all)\n\n"
            + table(["pattern", "goal", "rate ratio", "rate goal", "CPU ratio",
                     "peak memory", "memory goal", "asyncio floor's rate ratio"], rows))


# -- --server real: the real classic nsqd, the Python peers and the Go tools in one run ---------

# row name -> (worker client, event loop); the go-* rows are the real distribution's tools
REAL_CLIENTS = ("smartnsq", "smartnsq-uvloop", *PEERS, "asyncio-floor", "go-to_nsq",
                "go-bench_writer")
REAL_SKIP = {("go-to_nsq", "pipe"), ("go-to_nsq", "mpub"), ("go-bench_writer", "pipe")}
# the goals against the real nsqd, per pattern: (reference, ratio)
REAL_GOALS = {"seq": ("go-to_nsq", 1.0), "pipe": ("best Python peer", 3.0),
              "mpub": ("go-bench_writer", 0.9)}
RSS_GOAL_KIB = 20 * 1024
REAL_HOW = {
    "seq": "one PUB at a time, each acknowledged before the next",
    "pipe": "1024 outstanding (windows of 1024 concurrent publishes)",
    "mpub": "MPUB x100, each batch acknowledged before the next",
}


def real_run(client: str, mode: str, srv: Any, go: Any, n: int, body: int,
             args: argparse.Namespace, topic: str) -> dict[str, Any]:
    """One client, one pattern, on a fresh topic; the nsqd's CPU over the run beside it."""
    from _real import ServerCpu

    cluster = srv.cluster
    cluster.fresh_topic(topic, channel=None)
    cpu = ServerCpu(cluster.nsqd_pids)
    expect = n + 1  # the Python workers' warm-up / to_nsq's 1-line start-up run
    if client == "go-to_nsq":
        result = go.to_nsq(cluster.tcp, topic, n, body)
    elif client == "go-bench_writer":
        result = go.bench_writer(cluster.tcp, topic, 1 if mode == "seq" else BATCH, body,
                                 args.runfor)
        expect = result.get("count", -1)
    else:
        twin = client[len(baseline_name(client)):]  # "", "@base" or "@pure"
        worker_client, loop = (("smartnsq" + twin, "uvloop")
                               if baseline_name(client) == "smartnsq-uvloop"
                               else (client, args.loop))
        flags = ["-O"] if loop == "uvloop" or args.optimize else []
        result = run_worker("publish.py", [worker_client, mode, cluster.tcp, "", topic, str(n),
                                           str(body), str(args.window), loop],
                            python_flags=flags)
        if "error" not in result:
            result["how"] = "in-process clock over the N publishes (after a warm-up publish)"
            result["total_kib"] = result["peak_kib"] + result.get("baseline_kib", 0)
    server_s = cpu.used()
    if "error" not in result:
        stored = cluster.message_count(topic)
        result["stored"] = stored
        result["verified"] = stored == expect
        result["expected"] = expect
        result["server_us"] = server_s / max(stored or 1, 1) * 1e6
        result.setdefault("total_kib", result["peak_kib"])
    cluster.drop_topic(topic)
    return result


def main_real(args: argparse.Namespace) -> int:
    from _real import GoTools, real_dir, real_server

    folder = real_dir(args.real)
    go = GoTools(folder, args.go_procs)
    count = args.messages or (20_000 if args.quick else 100_000)
    seq_count = args.sequential or max(count // 5, 1)
    rounds = args.rounds or (1 if args.quick else 2)
    args.runfor = args.runfor or (1.0 if args.quick else 2.0)
    body = int((args.body or "100").split(",")[0])
    modes = [m for m in args.modes.split(",") if m]
    clients = [c for c in (args.clients or ",".join(REAL_CLIENTS)).split(",") if c]
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
    best: dict[tuple[str, str], dict[str, Any]] = {}
    # a topic without a channel keeps its messages in memory up to --mem-queue-size (10000 by
    # default), then writes them to disk: the runs would measure nsqd's disk queue
    nsqd_args = ("--mem-queue-size=10000000",)
    with real_server("classic", folder, nsqd_args=nsqd_args) as cluster:
        srv = DevClusterServer(cluster)
        where = cluster.describe()
        print(f"publish against the real nsqd: {seq_count:,} one at a time, {count:,} with "
              f"{args.window} outstanding, {count:,} in MPUB x{BATCH} ({args.runfor:g} s for "
              f"bench_writer); {body}-byte bodies; best of {rounds} round(s), clients "
              f"interleaved; server: {where}\n")
        for rnd in range(rounds):
            for mode in modes:
                n = seq_count if mode == "seq" else count
                shift = rnd % len(clients)
                for client in clients[shift:] + clients[:shift]:
                    key = (client, mode)
                    if key in REAL_SKIP or "error" in best.get(key, {}):
                        continue
                    topic = f"bench_real_{topic_part(client)}_{mode}"
                    result = real_run(client, mode, srv, go, n, body, args, topic)
                    prev = best.get(key)
                    best[key] = merge(prev, result)
                    if prev and "server_us" in prev and "server_us" in result:
                        best[key]["server_us"] = min(prev["server_us"], result["server_us"])
                    if prev and "total_kib" in prev and "total_kib" in result:
                        best[key]["total_kib"] = min(prev["total_kib"], result["total_kib"])
                    print(f"  round {rnd + 1} {MODES[mode]:<11} {client:<16} "
                          + (f"{fmt_rate(result['rate'])} msg/s, {result['cpu_us']:.1f} us "
                             f"client, {result['server_us']:.1f} us nsqd per msg"
                             if "error" not in result else result["error"]), flush=True)
    print()
    report_real(best, clients, modes, unavailable)
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: {where}\n  event loop  {args.loop} (asyncio clients; the "
                      f"smartnsq-uvloop row: uvloop, python -O)\n  Go tools    {folder} "
                      f"(GOMAXPROCS={args.go_procs} for bench_writer)"))
    return 0


def report_real(best: dict[tuple[str, str], dict[str, Any]], clients: list[str],
                modes: list[str], unavailable: dict[str, str]) -> None:
    headers = ["client", *(MODES[m] for m in modes)]
    rate_rows, cpu_rows, srv_rows, mem_rows, notes = [], [], [], [], []
    for client in clients:
        rows = ([client], [client], [client], [client])
        for mode in modes:
            r = best.get((client, mode))
            if r is None:
                for row in rows:
                    row.append("n/a")
                continue
            if "error" in r:
                for row in rows:
                    row.append("failed")
                notes.append(f"{client} {MODES[mode]}: {r['error']}")
                continue
            base = best.get(("smartnsq", mode), {})
            mark = "" if r["verified"] else " (!)"
            if not r["verified"]:
                notes.append(f"{client} {MODES[mode]}: the nsqd stored {r['stored']}, "
                             f"expected {r['expected']}")
            ratio = fmt_ratio(r["rate"], base.get("rate"))
            rows[0].append(f"{fmt_rate(r['rate'])}{mark} ({ratio})")
            system = r.get("sys_us")
            rows[1].append(f"{r['cpu_us']:.1f}" + ("" if system is None else
                                                    f" ({system:.1f} sys)"))
            rows[2].append(f"{r['server_us']:.1f}")
            rows[3].append(fmt_kib(r["total_kib"]))
        for table_rows, row in zip((rate_rows, cpu_rows, srv_rows, mem_rows), rows,
                                   strict=True):
            table_rows.append(row)
    for client, why in unavailable.items():
        notes.append(f"{client}: not run ({why})")
    print("throughput, msg/s (x smartnsq's rate)\n")
    print(table(headers, rate_rows))
    print("\nclient CPU per message, microseconds (user + system, whole client process; the "
          "system part, the kernel's, in brackets)\n")
    print(table(headers, cpu_rows))
    print("\nnsqd CPU per message, microseconds (the server process's /proc/PID/stat over the "
          "client's whole run, over the messages it stored)\n")
    print(table(headers, srv_rows))
    print("\npeak RSS of the client process (VmHWM; Python: the whole worker, which also "
          "imports bench/_common)\n")
    print(table(headers, mem_rows))
    goal_rows = []
    for mode in modes:
        ref_name, goal = REAL_GOALS[mode]
        for me_name in ("smartnsq", "smartnsq-uvloop"):
            me = best.get((me_name, mode), {})
            if not me or "error" in me:
                continue
            if ref_name == "best Python peer":
                ok = [(p, best[(p, mode)]) for p in PEERS
                      if "error" not in best.get((p, mode), {"error": 1})]
                if not ok:
                    continue
                name, ref = max(ok, key=lambda pr: pr[1]["rate"])
            else:
                name, ref = ref_name, best.get((ref_name, mode), {})
                if not ref or "error" in ref:
                    continue
            ratio = me["rate"] / ref["rate"]
            goal_rows.append([MODES[mode], me_name, f">= {goal:g}x {ref_name}",
                              f"{ratio:.2f}x vs {name}",
                              "met" if ratio >= goal else f"missed ({ratio / goal:.0%})",
                              f"{me['cpu_us']:.1f} vs {ref['cpu_us']:.1f}",
                              f"{me['server_us']:.1f} vs {ref['server_us']:.1f}"])
    peaks = [(m, best[("smartnsq", m)]) for m in modes
             if "error" not in best.get(("smartnsq", m), {"error": 1})]
    if peaks:
        mode, top = max(peaks, key=lambda p: p[1]["total_kib"])
        floor = best.get(("asyncio-floor", mode), {})
        goal_rows.append(["peak RSS", "smartnsq", f"<= {fmt_kib(RSS_GOAL_KIB)}",
                          f"{fmt_kib(top['total_kib'])} ({MODES[mode]}: "
                          f"+{fmt_kib(top['peak_kib'])} over the worker after import"
                          + (f"; asyncio-floor {fmt_kib(floor['total_kib'])}"
                             if floor and "total_kib" in floor else "") + ")",
                          "met" if top["total_kib"] <= RSS_GOAL_KIB else "missed", "-", "-"])
    print("\ngoals (against the real nsqd)\n")
    print(table(["pattern", "client", "goal", "rate ratio", "verdict",
                 "client CPU us/msg (vs ref)", "nsqd CPU us/msg (vs ref)"], goal_rows))
    print("\nhow each figure was taken:")
    for mode in modes:
        print(f"  - {MODES[mode]}: {REAL_HOW[mode]}")
    seen = set()
    for client in clients:
        for mode in modes:
            r = best.get((client, mode), {})
            how = r.get("how")
            if how and (client, how) not in seen:
                seen.add((client, how))
                print(f"  - {client}: {how}")
    print("  - go-bench_writer one at a time is MPUB of 1 message (the tool only sends MPUB), "
          "each acknowledged before the next, over one raw connection")
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
                        help="minimal: bench/_endpoint.py answers OK to everything, so the "
                             "client is measured; devcluster: a dev cluster nsqd; "
                             "nsqd=HOST:PORT: a real server you run (optionally lookupd= "
                             "and http=, default TCP port + 1)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="event loop of the asyncio clients (uvloop: the fast extra; "
                             "implies -O)")
    parser.add_argument("-O", dest="optimize", action="store_true",
                        help="run the workers with python -O (assertions off)")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages per pipelined and MPUB run (default 100k, quick 20k; "
                             "minimal server MPUB: x5)")
    parser.add_argument("--sequential", type=int, default=None,
                        help="messages per sequential run (default messages / 5)")
    parser.add_argument("--window", type=int, default=1024,
                        help="concurrent publishes outstanding per window (pipelined)")
    parser.add_argument("--body", default=None,
                        help="body sizes in bytes, comma-separated (default 100; the performance "
                             "journal's minimal-server tables used 100,1024)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="default 2, quick 1 (the performance journal's tables used 3)")
    parser.add_argument("--clients", default=None,
                        help=f"default: minimal smartnsq + peers + asyncio-floor; devcluster "
                             f"{','.join(CLIENTS)}; a real server both")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cluster", choices=("classic", "youzan"), default="classic",
                        help="devcluster/real server: its flavour (youzan: peers PUB without "
                             "a partition, which a youzan nsqd writes to its default one)")
    parser.add_argument("--via", choices=("auto", "nsqd", "lookupd"), default="auto",
                        help="devcluster/real server: how smartnsq finds the node (auto: "
                             "lookupd when there is one); the minimal server is always nsqd")
    parser.add_argument("--real", default=None, metavar="DIR",
                        help="--server real: the real binaries' folder (default "
                             "$SMARTNSQ_REAL_NSQ)")
    parser.add_argument("--runfor", type=float, default=None,
                        help="--server real: seconds bench_writer runs (default 2, quick 1)")
    parser.add_argument("--go-procs", type=int, default=1,
                        help="--server real: GOMAXPROCS of bench_writer (its connections: one "
                             "per proc; default 1, one connection like the other clients)")
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
    if args.loop == "uvloop":
        args.optimize = True  # see the module docstring: an assertion refuses uvloop's transport
    minimal = args.server == "minimal"
    count = args.messages or (20_000 if args.quick else 100_000)
    seq_count = args.sequential or max(count // 5, 1)
    # against the minimal endpoint MPUB runs are so fast that 100k would be timer noise
    mpub_count = count * 5 if minimal else count
    rounds = args.rounds or (1 if args.quick else 2)  # the default run stays near 2 minutes
    real = isinstance(args.server, ServerSpec)
    if real and not args.server.lookupd:
        if args.via == "lookupd":
            parser.error("--via lookupd needs --server ...,lookupd=HOST:PORT")
        args.via = "nsqd"
    via = "nsqd" if minimal else (
        args.via if args.via != "auto" else ("lookupd" if lookup_landed() else "nsqd"))
    modes = [m for m in args.modes.split(",") if m]
    default_clients = (("smartnsq", *PEERS, "asyncio-floor") if minimal else
                       (*CLIENTS, "asyncio-floor") if real else CLIENTS)
    clients = [c for c in (args.clients or ",".join(default_clients)).split(",") if c]
    bodies = [int(b) for b in (args.body or "100").split(",")]

    unavailable: dict[str, str] = {}
    for peer in [c for c in clients if c in PEERS]:
        why = peer_available(peer)
        if why:
            unavailable[peer] = why
    clients = [c for c in clients if c not in unavailable]
    if args.baseline:
        print(f"baseline (rows CLIENT@base): {set_baseline(args.baseline)}")
        clients = with_baseline(clients)
    if args.pure:
        print("pure path (rows CLIENT@pure): SMARTNSQ_NO_EXTENSIONS=1")
        clients = with_baseline(clients, PURE_SUFFIX)

    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    with server(args.server, args.cluster) as srv:
        where = ("bench/_endpoint.py, separate process, loopback (minimal: OK to every "
                 "publish)" if minimal else srv.cluster.describe())
        print(f"publish: {seq_count:,} sequential, {count:,} pipelined (windows of "
              f"{args.window} outstanding), {mpub_count:,} in MPUB x{BATCH}; bodies of "
              f"{', '.join(map(str, bodies))} bytes; best of {rounds} round(s); smartnsq via "
              f"{via}; asyncio clients on {args.loop}"
              f"{'; workers run with python -O' if args.optimize else ''}; server: {where}\n")
        for rnd in range(rounds):
            for body in bodies:
                for mode in modes:
                    n = {"seq": seq_count, "pipe": count}.get(mode, mpub_count)
                    # rotate who goes first: a shared machine's noise should favour no one
                    shift = rnd % len(clients)
                    for client in clients[shift:] + clients[:shift]:
                        key = (client, mode, body)
                        if (client, mode) in SKIP or "error" in best.get(key, {}):
                            continue
                        topic = f"bench_pub_{topic_part(client)}_{mode}"
                        srv.before(topic)
                        result = run_worker("publish.py", [
                            client, mode, srv.tcp,
                            srv.cluster.lookupd_http[0]
                            if (not minimal and client.startswith("smartnsq")
                                and via == "lookupd") else "",
                            topic, str(n), str(body), str(args.window), args.loop],
                            python_flags=["-O"] if args.optimize else [])
                        if "error" not in result:
                            stored = srv.stored(topic)
                            result["verified"] = stored == n + 1  # + the warm-up message
                            result["stored"] = stored
                        elif not minimal:
                            srv.cluster.drop_topic(topic)
                        best[key] = merge(best.get(key), result)

    for body in bodies:
        # the goals mean something where the server is not the limit: not the dev cluster
        report(best, clients, modes, body, unavailable, minimal or real)
    print("every run's message count was checked on the server side")
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: {where}\n  event loop  {args.loop} (asyncio clients)"
                      f"{', python -O' if args.optimize else ''}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
