"""Publish throughput: smartnsq's Producer against the Python peers, same endpoint, same run.

    python bench/publish.py [--quick] [--messages N] [--sequential N] [--window W]
                            [--rounds R] [--clients smartnsq,pynsq,...] [--via nsqd|lookupd]

Clients: ``smartnsq`` (``smartnsq.producer.Producer``, asyncio), ``smartnsq-sync`` (the
blocking ``smartnsq.sync.Producer``, calls cross to a background event loop thread; it has no
pipelined row), pynsq (``nsq.Writer``, tornado callbacks), gnsq (``gnsq.Producer``, gevent),
ansq (``open_connection``), asyncnsq (``create_writer``).

Three ways of publishing 100-byte messages to one classic nsqd of the dev cluster (its own
process, loopback; ``--cluster youzan``: one youzan nsqd and a one-partition topic, which the
peers write without naming the partition):

* sequential: one publish at a time, each awaited (acknowledged) before the next;
* pipelined: windows of W concurrent publishes on one connection, each window awaited;
* MPUB x100: batches of 100 messages, each batch awaited before the next.

Each client runs in its own interpreter (gevent's monkeypatching stays with gnsq) after a
one-message warm-up that opens its connection; the clock covers the publishes only. Two
figures per run: msg/s (wall clock) and the client's CPU time per message (every thread of
its interpreter), the library's own cost, which the server's speed and the machine's other
load disturb much less than a rate. Every
run gets a fresh topic, and the server's message count is checked afterwards (``ok``).
With ``--rounds R`` the clients take turns R times (the order rotates each round) and the
best rate and lowest CPU cost of each are kept, which evens out the noise of a shared
machine. Ratios are each client's figure over smartnsq's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
from typing import Any

from _common import (
    PEERS,
    Span,
    command_line,
    dev_cluster,
    emit,
    environment,
    fmt_rate,
    fmt_ratio,
    peer_available,
    run_worker,
    table,
)

MODES = {"seq": "sequential", "pipe": "pipelined", "mpub": "MPUB x100"}
CLIENTS = ("smartnsq", "smartnsq-sync", *PEERS)
SKIP = {("smartnsq-sync", "pipe")}  # a blocking facade has no pipelining of its own
BATCH = 100


def _batches(count: int) -> list[int]:
    return [min(BATCH, count - i) for i in range(0, count, BATCH)]


def _windows(count: int, window: int) -> list[int]:
    return [min(window, count - i) for i in range(0, count, window)]


# -- workers: each runs in its own interpreter -------------------------------------------------

def work_smartnsq(mode: str, addr: str, lookupd: str, topic: str, count: int, body: bytes,
                  window: int) -> Span:
    from smartnsq.producer import Producer

    async def run() -> Span:
        where: dict[str, Any] = {"lookupd": [lookupd]} if lookupd else {"nsqd": [addr]}
        async with Producer(**where) as producer:
            publish = producer.publish
            await publish(topic, body)  # warm-up: connection and routes
            start = Span.begin()
            if mode == "seq":
                for _ in range(count):
                    await publish(topic, body)
            elif mode == "pipe":
                for n in _windows(count, window):
                    await asyncio.gather(*[publish(topic, body) for _ in range(n)])
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
        else:
            raise ValueError(f"{mode}: not a blocking pattern")
        return start.end()


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


def worker(argv: list[str]) -> int:
    client, mode, addr, lookupd, topic, count_s, body_s, window_s = argv
    count, body, window = int(count_s), b"x" * int(body_s), int(window_s)
    if client == "smartnsq":
        span = work_smartnsq(mode, addr, lookupd, topic, count, body, window)
    elif client == "smartnsq-sync":
        span = work_smartnsq_sync(mode, addr, lookupd, topic, count, body, window)
    else:
        fn = {"pynsq": work_pynsq, "gnsq": work_gnsq, "ansq": work_ansq,
              "asyncnsq": work_asyncnsq}[client]
        span = fn(mode, addr, topic, count, body, window)
    emit({"count": count, "seconds": span.wall, "rate": count / span.wall,
          "cpu_us": span.cpu / count * 1e6})
    return 0


# -- the orchestrator -----------------------------------------------------------------------

def lookup_landed() -> bool:
    return importlib.util.find_spec("smartnsq.lookup") is not None


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages per pipelined and MPUB run (default 100k, quick 20k)")
    parser.add_argument("--sequential", type=int, default=None,
                        help="messages per sequential run (default messages / 5)")
    parser.add_argument("--window", type=int, default=1000, help="pipelined window")
    parser.add_argument("--body", type=int, default=100, help="body size in bytes")
    parser.add_argument("--rounds", type=int, default=None, help="default 3, quick 1")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cluster", choices=("classic", "youzan"), default="classic",
                        help="the dev cluster's flavour (youzan: peers PUB without a "
                             "partition, which a youzan nsqd writes to its default one)")
    parser.add_argument("--via", choices=("auto", "nsqd", "lookupd"), default="auto",
                        help="how smartnsq finds the node (auto: lookupd once "
                             "smartnsq.lookup exists)")
    args = parser.parse_args()
    count = args.messages or (20_000 if args.quick else 100_000)
    seq_count = args.sequential or max(count // 5, 1)
    rounds = args.rounds or (1 if args.quick else 3)
    via = args.via if args.via != "auto" else ("lookupd" if lookup_landed() else "nsqd")
    modes = [m for m in args.modes.split(",") if m]
    clients = [c for c in args.clients.split(",") if c]

    unavailable: dict[str, str] = {}
    for peer in [c for c in clients if c in PEERS]:
        why = peer_available(peer)
        if why:
            unavailable[peer] = why
    clients = [c for c in clients if c not in unavailable]

    print(f"publish: {count:,} messages pipelined (window {args.window}) and in MPUB x{BATCH}, "
          f"{seq_count:,} sequential; {args.body}-byte bodies; best of {rounds} round(s); "
          f"smartnsq via {via}; {args.cluster} nsqd\n")
    best: dict[tuple[str, str], dict[str, Any]] = {}
    with dev_cluster(args.cluster) as cluster:
        for rnd in range(rounds):
            for mode in modes:
                n = seq_count if mode == "seq" else count
                # rotate who goes first: a shared machine's noise should not favour anyone
                shift = rnd % len(clients)
                for client in clients[shift:] + clients[:shift]:
                    if (client, mode) in SKIP or "error" in best.get((client, mode), {}):
                        continue
                    topic = f"bench_pub_{client.replace('-', '_')}_{mode}"
                    cluster.fresh_topic(topic, channel=None)
                    result = run_worker("publish.py", [
                        client, mode, cluster.tcp,
                        cluster.lookupd_http[0] if (client.startswith("smartnsq")
                                                    and via == "lookupd")
                        else "", topic, str(n), str(args.body), str(args.window)])
                    if "error" not in result:
                        stored = cluster.message_count(topic)
                        result["verified"] = stored == n + 1  # + the warm-up message
                        result["stored"] = stored
                    cluster.drop_topic(topic)
                    prev = best.get((client, mode))
                    if prev is None or "error" in prev:
                        best[(client, mode)] = result
                    elif "error" not in result:
                        # keep the best rate and, separately, the lowest CPU cost
                        cpu = min(prev["cpu_us"], result["cpu_us"])
                        if result["rate"] > prev["rate"]:
                            best[(client, mode)] = result
                        best[(client, mode)]["cpu_us"] = cpu

    rows = []
    cpu_rows = []
    notes = []
    for client in clients:
        row = [client]
        cpu_row = [client]
        for mode in modes:
            if (client, mode) in SKIP:
                row.append("n/a")
                cpu_row.append("n/a")
                continue
            r = best[(client, mode)]
            base = best.get(("smartnsq", mode), {})
            if "error" in r:
                row.append("failed")
                cpu_row.append("failed")
                notes.append(f"{client} {MODES[mode]}: {r['error']}")
                continue
            mark = "" if r["verified"] else " (!)"
            if not r["verified"]:
                notes.append(f"{client} {MODES[mode]}: server stored {r['stored']} messages, "
                             f"expected {r['count'] + 1}")
            row.append(f"{fmt_rate(r['rate'])}{mark} ({fmt_ratio(r['rate'], base.get('rate'))})")
            cpu_row.append(f"{r['cpu_us']:.1f} ({fmt_ratio(r['cpu_us'], base.get('cpu_us'))})")
        rows.append(row)
        cpu_rows.append(cpu_row)
    for peer, why in unavailable.items():
        rows.append([peer] + ["not importable"] * len(modes))
        cpu_rows.append([peer] + ["-"] * len(modes))
        notes.append(f"{peer}: {why}")
    print("throughput, msg/s (x smartnsq's rate; higher is faster)\n")
    print(table(["client", *(MODES[m] for m in modes)], rows))
    print("\nclient CPU per message, microseconds (x smartnsq's cost; lower is cheaper)\n")
    print(table(["client", *(MODES[m] for m in modes)], cpu_rows))
    print("\nevery run's message count was checked on the server" +
          ("" if not notes else "; notes:"))
    for note in notes:
        print(f"  - {note}")
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: smartnsq.devcluster --mode {args.cluster}, 1 nsqd, separate "
                      "process, loopback"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
