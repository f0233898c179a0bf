"""``python -m smartnsq.devcluster``: run a dev cluster in the foreground and print its addresses.

``main(argv)`` is also what ``smartnsq dev-cluster`` calls. The addresses are printed twice:
for people, and as ``NAME=value`` lines that scripts can ``eval`` or grep.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from .cluster import MODES, DevCluster

log = logging.getLogger("smartnsq.devcluster")


def build_parser(prog: str = "python -m smartnsq.devcluster") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run an embedded NSQ cluster (youzan or classic) on loopback.")
    parser.add_argument("--nodes", type=int, default=3, help="nsqd nodes (default 3)")
    parser.add_argument("--lookupds", type=int, default=2, help="nsqlookupds (default 2)")
    parser.add_argument("--classic-nodes", type=int, default=0,
                        help="classic nsqd registered beside youzan ones (mixed cluster)")
    parser.add_argument("--mode", choices=MODES, default="youzan")
    parser.add_argument("--proxied", action="store_true",
                        help="advertise TCP proxies in front of each nsqd")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lookupd-port", type=int, action="append", default=[],
                        metavar="PORT", help="HTTP port of the next lookupd (repeatable)")
    parser.add_argument("--nsqd-tcp-port", type=int, action="append", default=[],
                        metavar="PORT", help="TCP port of the next nsqd (repeatable)")
    parser.add_argument("--nsqd-http-port", type=int, action="append", default=[],
                        metavar="PORT", help="HTTP port of the next nsqd (repeatable)")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME[:P[:R]]",
                        help="create a topic with P partitions and R replicas (repeatable)")
    parser.add_argument("--channel", action="append", default=[],
                        help="channel(s) created on each --topic (default: 'default')")
    parser.add_argument("-v", "--verbose", action="store_true", help="log server events")
    return parser


def _topic_spec(spec: str) -> tuple[str, int, int]:
    parts = spec.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise ValueError(f"bad --topic {spec!r}: expected NAME[:PARTITIONS[:REPLICAS]]")
    name = parts[0]
    partitions = int(parts[1]) if len(parts) > 1 else 1
    replicas = int(parts[2]) if len(parts) > 2 else 1
    return name, partitions, replicas


async def run(args: argparse.Namespace, stop: asyncio.Event | None = None, *,
              make_cluster: Callable[..., DevCluster] = DevCluster) -> None:
    """Start the cluster, print it, and serve until ``stop`` is set (or SIGINT/SIGTERM)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    cluster = make_cluster(
        nodes=args.nodes, lookupds=args.lookupds, classic_nodes=args.classic_nodes,
        mode=args.mode, proxied=args.proxied, host=args.host,
        lookupd_http_ports=args.lookupd_port, nsqd_tcp_ports=args.nsqd_tcp_port,
        nsqd_http_ports=args.nsqd_http_port)
    async with cluster:
        for spec in args.topic:
            name, partitions, replicas = _topic_spec(spec)
            await cluster.create_topic(name, partitions, replicas,
                                       channels=args.channel or ["default"])
        print(cluster.describe())
        for spec in args.topic:
            print(f"  topic {_topic_spec(spec)[0]}")
        print(f"NSQLOOKUPD_HTTP={','.join(cluster.lookupd_http_addresses)}")
        print(f"NSQD_TCP={','.join(cluster.nsqd_tcp_addresses)}")
        print(f"NSQD_HTTP={','.join(cluster.nsqd_http_addresses)}")
        print("running; Ctrl-C to stop", flush=True)
        await stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(prog) if prog else build_parser()
    args = parser.parse_args(argv)
    try:
        for spec in args.topic:
            _topic_spec(spec)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        pass
    except (OSError, RuntimeError) as exc:
        print(f"dev cluster failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
