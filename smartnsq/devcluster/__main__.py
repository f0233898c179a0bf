"""``python -m smartnsq.devcluster``: run a dev cluster in the foreground and print its addresses.

``main(argv)`` is also what ``smartnsq dev-cluster`` calls. The addresses are printed twice:
for people, and as ``NAME=value`` lines that scripts can ``eval`` or grep
(``DEVCLUSTER_ADMIN`` is the loopback admin endpoint). ``main(["fault", ...])`` is the client of
that endpoint: ``smartnsq dev-cluster fault kill 1`` injects a fault into a running cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .admin import AdminServer, check_loopback
from .cluster import MODES, DevCluster
from .profile import PROFILES, profile_named

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
    parser.add_argument("--topic", action="append", default=[],
                        metavar="NAME[:P[:R[:ordered][:ext]]]",
                        help="create a topic with P partitions and R replicas, ordered and/or "
                             "ext (repeatable)")
    parser.add_argument("--channel", action="append", default=[],
                        help="channel(s) created on each --topic (default: 'default')")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="off",
                        help="fault durations: off (instant, default) or realistic (the real "
                             "cluster's, docs/devcluster.md)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                        help="multiply every fault duration by X (0.05: 20x faster)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault durations")
    parser.add_argument("--admin-port", type=int, default=0, metavar="PORT",
                        help="loopback port of the admin endpoint (default: any free port)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log server events")
    return parser


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replicas: int = 1
    ordered: bool = False
    ext: bool = False


def _topic_spec(spec: str) -> TopicSpec:
    """``NAME[:P[:R[:ordered][:ext]]]``; a ValueError says what is wrong."""
    expected = "expected NAME[:PARTITIONS[:REPLICAS]] then :ordered and/or :ext"
    parts = spec.split(":")
    if not parts[0]:
        raise ValueError(f"bad --topic {spec!r}: {expected}")
    numbers = [p for p in parts[1:3] if p.isdigit()]
    flags = parts[1 + len(numbers):]
    if any(f not in ("ordered", "ext") for f in flags) or len(set(flags)) != len(flags):
        raise ValueError(f"bad --topic {spec!r}: {expected}")
    try:
        partitions = int(numbers[0]) if numbers else 1
        replicas = int(numbers[1]) if len(numbers) > 1 else 1
    except ValueError:
        raise ValueError(f"bad --topic {spec!r}: {expected}") from None
    if partitions < 1 or replicas < 1:
        raise ValueError(f"bad --topic {spec!r}: partitions and replicas must be >= 1")
    return TopicSpec(parts[0], partitions, replicas, "ordered" in flags, "ext" in flags)


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
        nsqd_http_ports=args.nsqd_http_port,
        profile=profile_named(args.profile, args.time_scale, args.seed))
    async with cluster, AdminServer(cluster, args.host, args.admin_port) as admin:
        for spec in map(_topic_spec, args.topic):
            await cluster.create_topic(spec.name, spec.partitions, spec.replicas,
                                       ordered=spec.ordered, ext=spec.ext,
                                       channels=args.channel or ["default"])
        print(cluster.describe())
        for spec in map(_topic_spec, args.topic):
            flags = "".join(f" {f}" for f in ("ordered", "ext") if getattr(spec, f))
            print(f"  topic {spec.name} ({spec.partitions} partitions, {spec.replicas} "
                  f"replicas{flags})")
        print(f"  profile {args.profile} x{args.time_scale}")
        print(f"  admin http://{admin.address}")
        print(f"DEVCLUSTER_ADMIN={admin.address}")
        print(f"NSQLOOKUPD_HTTP={','.join(cluster.lookupd_http_addresses)}")
        print(f"NSQD_TCP={','.join(cluster.nsqd_tcp_addresses)}")
        print(f"NSQD_HTTP={','.join(cluster.nsqd_http_addresses)}")
        print("running; Ctrl-C to stop", flush=True)
        await stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)


ADMIN_ENV = "DEVCLUSTER_ADMIN"
NODE_ACTIONS = ("kill", "leave", "stop", "start")
CONNECTION_ACTIONS = ("cut", "stall", "resume")


def build_fault_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{prog} fault",
        description="Inject a fault into a running dev cluster through its admin endpoint.")
    parser.add_argument("--admin", default=os.environ.get(ADMIN_ENV, ""), metavar="HOST:PORT",
                        help=f"the cluster's admin endpoint (default: ${ADMIN_ENV})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for the answer (default 30)")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, what in (("kill", "kill an nsqd (SIGKILL, on the profile's clock)"),
                       ("leave", "stop an nsqd gracefully (SIGTERM)"),
                       ("stop", "stop an nsqd, no failover"), ("start", "restart an nsqd")):
        sub.add_parser(name, help=what).add_argument("node", help="node index or id")
    p = sub.add_parser("move-leader", help="hand a partition to another node")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("--to", default="", help="node index or id (default: next replica)")
    p = sub.add_parser("writable", help="disable or enable writes on a partition")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("writable", choices=("true", "false"))
    for name in ("stop-lookupd", "start-lookupd"):
        sub.add_parser(name).add_argument("lookupd", type=int, help="lookupd index")
    for name in CONNECTION_ACTIONS:
        sub.add_parser(name, help="connection fault (proxied cluster)").add_argument(
            "node", nargs="?", default="", help="node index or id (default: all)")
    p = sub.add_parser("settle", help="wait until every fault sequence has ended")
    p.add_argument("--within", type=int, default=60, help="seconds (default 60)")
    p = sub.add_parser("create-topic", help="create a topic: NAME[:P[:R[:ordered][:ext]]]")
    p.add_argument("spec")
    p.add_argument("--channel", action="append", default=[])
    sub.add_parser("status", help="print nodes, topics and the fault timeline")
    return parser


def _fault_request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    action = args.action
    if action in NODE_ACTIONS:
        return "POST", f"/fault/{action}", {"node": args.node}
    if action == "move-leader":
        return "POST", "/fault/move_leader", {"topic": args.topic, "partition": args.partition,
                                              "to": args.to}
    if action == "writable":
        return "POST", "/fault/writable", {"topic": args.topic, "partition": args.partition,
                                           "writable": args.writable}
    if action in ("stop-lookupd", "start-lookupd"):
        return "POST", f"/fault/{action.replace('-', '_')}", {"lookupd": args.lookupd}
    if action in CONNECTION_ACTIONS:
        return "POST", f"/fault/{action}", {"node": args.node}
    if action == "settle":
        return "POST", "/fault/settle", {"timeout": args.within}
    if action == "create-topic":
        spec = _topic_spec(args.spec)
        return "POST", "/topic/create", {
            "topic": spec.name, "partitions": spec.partitions, "replicas": spec.replicas,
            "ordered": str(spec.ordered).lower(), "ext": str(spec.ext).lower(),
            "channel": args.channel or ["default"]}
    return "GET", "/status", {}


def fault_main(argv: Sequence[str], prog: str) -> int:
    """``fault ACTION ...``: one request to a running cluster's admin endpoint."""
    parser = build_fault_parser(prog)
    args = parser.parse_args(argv)
    if not args.admin:
        parser.error(f"--admin HOST:PORT is required (or set ${ADMIN_ENV})")
    host, _, port = args.admin.rpartition(":")
    try:
        check_loopback(host)
        method, path, params = _fault_request(args)
    except ValueError as exc:
        parser.error(str(exc))
    params = {k: v for k, v in params.items() if v != ""}
    try:
        resp = httpx.request(method, f"http://{host}:{port}{path}", params=params,
                             timeout=args.timeout)
    except httpx.HTTPError as exc:
        print(f"admin endpoint {args.admin}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    try:
        body = resp.json()
    except ValueError:
        body = {"message": resp.text}
    if resp.status_code != 200:
        print(f"fault {args.action}: {body.get('message', body)}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=2 if args.action == "status" else None))
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fault":
        return fault_main(argv[1:], prog or "python -m smartnsq.devcluster")
    parser = build_parser(prog) if prog else build_parser()
    args = parser.parse_args(argv)
    try:
        for spec in args.topic:
            _topic_spec(spec)
        profile_named(args.profile, args.time_scale, args.seed)
        check_loopback(args.host)
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
