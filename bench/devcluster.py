"""Capacity of the embedded dev cluster, the endpoint every client benchmark runs against.

    python bench/devcluster.py [--quick] [--messages N] [--body BYTES]

A client figure means something only if the server was not the bottleneck. This measures the
dev cluster (one nsqd, in its own process) with the thinnest client possible: one blocking
socket, commands pre-encoded into one buffer and sent by a thread while the main thread
counts the answers, FINs sent as one write per received chunk. What that client achieves is
a lower bound of what the server can take; the library benchmarks should stay below it.

Both flavours are measured: a classic nsqd (what the peer libraries are compared on) and a
youzan nsqd (PUB/SUB with an explicit partition, binary message ids).
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import (
    Cluster,
    RawClient,
    command_line,
    dev_cluster,
    environment,
    fmt_rate,
    table,
)

from smartnsq.protocol import commands
from smartnsq.protocol.frames import CLASSIC_LAYOUT, YOUZAN_LAYOUT, ErrorFrame, MessageFrame

CHANNEL = "bench"


def pub_pipelined(addr: str, layout: object, topic: str, count: int, body: bytes,
                  partition: int | None) -> float:
    client = RawClient(addr, layout)
    one = commands.pub(topic, body, partition)
    payload = one * count
    start = time.perf_counter()
    client.send_and_count(payload, count)
    elapsed = time.perf_counter() - start
    client.close()
    return count / elapsed


def mpub_pipelined(addr: str, layout: object, topic: str, count: int, body: bytes,
                   partition: int | None, batch: int = 100) -> float:
    client = RawClient(addr, layout)
    one = commands.mpub(topic, [body] * batch, partition)
    batches = count // batch
    start = time.perf_counter()
    client.send_and_count(one * batches, batches)
    elapsed = time.perf_counter() - start
    client.close()
    return batches * batch / elapsed


def consume(addr: str, layout: object, topic: str, count: int, partition: int | None,
            rdy: int = 2500) -> float:
    client = RawClient(addr, layout)
    client.sock.sendall(commands.sub(topic, CHANNEL, partition))
    client.expect(1)
    got = 0
    start = time.perf_counter()
    client.sock.sendall(commands.rdy(rdy))
    fin = commands.fin
    while got < count:
        fins = []
        for frame in client.frames():
            if isinstance(frame, MessageFrame):
                fins.append(fin(frame.id))
            elif isinstance(frame, ErrorFrame):
                raise RuntimeError(frame.payload.decode(errors="replace"))
        if fins:
            got += len(fins)
            client.sock.sendall(b"".join(fins))
    elapsed = time.perf_counter() - start
    client.close()
    return count / elapsed


def measure(cluster: Cluster, count: int, body: bytes,
            rnd: int = 0) -> list[tuple[str, str, float]]:
    youzan = cluster.mode == "youzan"
    layout = YOUZAN_LAYOUT if youzan else CLASSIC_LAYOUT
    partition = 0 if youzan else None
    addr = cluster.tcp
    rows = []

    def topic(name: str) -> str:
        if youzan:
            return f"{name}{rnd}"
        cluster.fresh_topic(name, CHANNEL)
        return name

    t = topic("cap_pub")
    rows.append(("PUB, pipelined", cluster.mode,
                 pub_pipelined(addr, layout, t, count, body, partition)))
    t = topic("cap_mpub")
    rows.append(("MPUB x100, pipelined", cluster.mode,
                 mpub_pipelined(addr, layout, t, count, body, partition)))
    t = topic("cap_sub")
    loader = RawClient(addr, layout)
    loader.preload(t, count, body, partition=partition)
    loader.close()
    rows.append(("consume + FIN (RDY 2500)", cluster.mode,
                 consume(addr, layout, t, count, partition)))
    if not youzan:
        for name in ("cap_pub", "cap_mpub", "cap_sub"):
            cluster.drop_topic(name)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--body", type=int, default=100, help="body size in bytes")
    parser.add_argument("--rounds", type=int, default=None, help="best of R (default 3, "
                        "quick 1)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    count = args.messages or (50_000 if args.quick else 200_000)
    count -= count % 100
    body = b"x" * args.body
    print(f"dev cluster capacity: {count:,} messages of {args.body} bytes per row, one nsqd "
          f"in its own process, raw-socket client; best of {rounds} round(s)\n")
    best: dict[tuple[str, str], float] = {}

    def keep(rows: list[tuple[str, str, float]]) -> None:
        for op, mode, rate in rows:
            best[(op, mode)] = max(rate, best.get((op, mode), 0.0))

    with dev_cluster("classic") as cluster:
        for rnd in range(rounds):
            keep(measure(cluster, count, body, rnd))
    # youzan topics cannot be created over nsqd HTTP: create them at start (partition 0),
    # one set per round so that every round starts from empty topics
    names = [f"{t}{r}:1:1" for r in range(rounds) for t in ("cap_pub", "cap_mpub", "cap_sub")]
    with dev_cluster("youzan", topics=names) as cluster:
        for rnd in range(rounds):
            keep(measure(cluster, count, body, rnd))
    print(table(["operation", "nsqd", "msgs/s"],
                [(op, mode, fmt_rate(rate)) for (op, mode), rate in best.items()]))
    print(f"\ncommand: {command_line()}")
    print(environment("server: smartnsq.devcluster, 1 nsqd + 1 lookupd, separate process, "
                      "loopback"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
