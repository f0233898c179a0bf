"""``smartnsq dev-cluster``: run a dev cluster in the foreground and print its addresses.

The addresses are printed twice:
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
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..devcluster.admin import AdminServer, check_loopback, cluster_status, replicas_error
from ..devcluster.cluster import MODES, DevCluster
from ..devcluster.profile import PROFILES, profile_named
from ..errors import NSQError, Timeout
from ..transport.http import HttpClient

log = logging.getLogger("smartnsq.devcluster")

PROG = "smartnsq dev-cluster"
EXIT_USAGE = 2


FAULT_EPILOG = """\
faults, from another shell while the cluster runs (docs/devcluster.md):
  {prog} fault ACTION [--json] [--admin HOST:PORT]
  status                       nodes, lookupds, topics, leaders, the fault timeline
  kill|leave|stop|start N      a node, N its # in the banner
  move-leader TOPIC P [--to N] hand partition P to another replica
  writable TOPIC P true|false  disable or enable writes on a partition
  stop-lookupd|start-lookupd I a lookupd, I its # in the banner
  cut|stall|resume [N]         client connections (needs --proxied)
  settle [--within S]          wait until every fault sequence has ended
  create-topic NAME[:P[:R[:ordered][:ext]]]
--admin defaults to $DEVCLUSTER_ADMIN (the banner prints an export line for it);
--json prints the raw answer. More: {prog} fault --help

exit status: 0 stopped by SIGTERM, 130 stopped by Ctrl-C, 1 failed, 2 usage
"""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run an embedded NSQ cluster (youzan or classic) on loopback, "
                               "print its addresses and serve until Ctrl-C.",
        epilog=FAULT_EPILOG.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3, help="nsqd nodes (default 3)")
    parser.add_argument("--lookupds", type=int, default=2, help="nsqlookupds (default 2)")
    parser.add_argument("--classic-nodes", type=int, default=0,
                        help="classic nsqd registered beside youzan ones (mixed cluster)")
    parser.add_argument("--mode", choices=MODES, default="youzan",
                        help="youzan nodes (partitions, replicas; default), classic NSQ "
                             "nodes, or mixed (youzan and classic side by side)")
    parser.add_argument("--proxied", action="store_true",
                        help="advertise TCP proxies in front of each nsqd")
    parser.add_argument("--host", default="127.0.0.1",
                        help="loopback address every server binds (default 127.0.0.1; the "
                             "cluster never listens beyond this machine)")
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
                        help="channel created on each --topic (repeatable; default: 'default')")
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
              make_cluster: Callable[..., DevCluster] = DevCluster) -> int:
    """Start the cluster, print it, and serve until ``stop`` is set (or SIGINT/SIGTERM).

    Returns the exit status: 130 when SIGINT (Ctrl-C) stopped it, else 0.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    stopped_by: list[int] = []

    def on_signal(sig: int) -> None:
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
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
        print(banner(cluster_status(cluster, timeline=0), admin.address,
                     list(map(_topic_spec, args.topic))), flush=True)
        await stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)
    return EXIT_INTERRUPTED if signal.SIGINT in stopped_by else 0


EXIT_INTERRUPTED = 130


def _table(headers: Sequence[str], rows: list[list[Any]], right: Sequence[int] = (),
           indent: str = "  ") -> str:
    from .tables import format_table

    return "\n".join(indent + line for line in
                     format_table(headers, rows, right=right).splitlines())


def _node_names(status: dict[str, Any]) -> dict[str, str]:
    """node id -> ``#index``, the way the fault commands take nodes."""
    return {n["id"]: f"#{n['index']}" for n in status.get("nodes", [])}


def _node_state(node: dict[str, Any]) -> str:
    state = "alive" if node["alive"] else "down"
    if node.get("exiting"):
        state += ", leaving"
    if node.get("classic"):
        state += ", classic"
    return state


def render_status(status: dict[str, Any], *, timeline: bool = True) -> str:
    """``fault status`` (and the banner's first part) as aligned tables."""
    names = _node_names(status)
    profile = status.get("profile", {})
    head = f"dev cluster: {status.get('mode', 'youzan')}"
    if status.get("proxied"):
        head += ", proxied"
    head += f", profile {profile.get('name', '?')} x{profile.get('scale', 1):g}"
    if status.get("busy"):
        head += " (faults still running: fault settle waits for them)"
    out = [head, "nodes (fault commands take the #)"]
    out.append(_table(["#", "tcp", "http", "state", "id"],
                      [[f"#{n['index']}", n["tcp"], n["http"], _node_state(n), n["id"]]
                       for n in status.get("nodes", [])]))
    out.append("lookupds")
    out.append(_table(["#", "http", "state"],
                      [[f"#{lk['index']}", lk["http"],
                        ("running" if lk["running"] else "stopped")
                        + (", leader" if lk["leader"] else "")]
                       for lk in status.get("lookupds", [])]))
    topics = status.get("topics", {})
    if topics:
        rows = []
        for name in sorted(topics):
            for p in topics[name]:
                state = []
                if not p["writable"]:
                    state.append("not writable")
                if p.get("stalled"):
                    state.append("stalled")
                if p["leader"] and not p.get("leader_ready", True):
                    state.append("leader starting")
                rows.append([name, p["partition"],
                             names.get(p["leader"], p["leader"]) if p["leader"]
                             else "(none)",
                             " ".join(names.get(r, r) for r in p["replicas"]) or "-",
                             ", ".join(state) or "ok"])
        out.append("topics")
        out.append(_table(["topic", "partition", "leader", "replicas", "state"], rows,
                          right=(1,)))
    if timeline:
        events = status.get("timeline", [])
        out.append(f"fault timeline (last {len(events)})" if events
                   else "fault timeline: nothing happened yet")
        if events:
            out.append(_table(["ago", "event", "details"],
                              [[f"{e.get('ago', 0):.2f}s", e["what"], _details(e, names)]
                               for e in events], right=(0,)))
    return "\n".join(out)


def _details(event: dict[str, Any], names: dict[str, str]) -> str:
    parts = []
    for key, value in event.items():
        if key in ("at", "ago", "what"):
            continue
        if isinstance(value, list):
            value = " ".join(names.get(str(v), str(v)) for v in value)
        else:
            value = names.get(str(value), value)
        parts.append(f"{key} {value}")
    return ", ".join(parts)


def banner(status: dict[str, Any], admin: str, topics: Sequence[TopicSpec]) -> str:
    """What ``smartnsq dev-cluster`` prints once it serves: the cluster as tables, the
    ``NAME=value`` lines scripts read, and ``export`` lines to paste into another shell."""
    out = [render_status(status, timeline=False)]
    for spec in topics:
        flags = [f for f in ("ordered", "ext") if getattr(spec, f)]
        out.append(f"  topic {spec.name}: {spec.partitions} partition"
                   f"{'s' if spec.partitions != 1 else ''} x {spec.replicas} replica"
                   f"{'s' if spec.replicas != 1 else ''}" + "".join(f", {f}" for f in flags))
    lookupds = ",".join(lk["http"] for lk in status["lookupds"])
    out += [f"admin endpoint http://{admin}",
            "",
            "# for scripts:",
            f"DEVCLUSTER_ADMIN={admin}",
            f"NSQLOOKUPD_HTTP={lookupds}",
            f"NSQD_TCP={','.join(n['tcp'] for n in status['nodes'])}",
            f"NSQD_HTTP={','.join(n['http'] for n in status['nodes'])}",
            "",
            "# paste into another shell, then: smartnsq lookup TOPIC, smartnsq dev-cluster "
            "fault status",
            f"export SMARTNSQ_LOOKUPD={lookupds}",
            f"export DEVCLUSTER_ADMIN={admin}",
            "",
            "running; Ctrl-C to stop"]
    return "\n".join(out)


ADMIN_ENV = "DEVCLUSTER_ADMIN"
NODE_ACTIONS = ("kill", "leave", "stop", "start")
CONNECTION_ACTIONS = ("cut", "stall", "resume")


def build_fault_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{prog} fault",
        description="Inject a fault into a running dev cluster through its admin endpoint "
                    "(the banner's DEVCLUSTER_ADMIN). Nodes are given by their # in the "
                    "banner or in 'fault status' (or by node id).",
        epilog="exit status: 0 done, 1 the cluster refused (the line says why), 2 usage")
    parser.add_argument("--admin", default=os.environ.get(ADMIN_ENV, ""), metavar="HOST:PORT",
                        help=f"the cluster's admin endpoint (default: ${ADMIN_ENV})")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="seconds to wait for the answer (default 30)")
    parser.add_argument("--json", action="store_true",
                        help="print the admin endpoint's JSON answer (for scripts)")
    # the same options after the action too (`fault status --json`): defaults stay the
    # top parser's
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--admin", default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help=f"the cluster's admin endpoint (default: ${ADMIN_ENV})")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="SECONDS",
                        help="seconds to wait for the answer (default 30)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the admin endpoint's JSON answer (for scripts)")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_parser = sub.add_parser

    def action(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return add_parser(name, parents=[common], **kwargs)

    sub.add_parser = action  # type: ignore[method-assign]
    for name, what in (("kill", "kill an nsqd (SIGKILL; failover on the profile's clock)"),
                       ("leave", "stop an nsqd gracefully (SIGTERM: its partitions move)"),
                       ("stop", "stop an nsqd, no failover"), ("start", "restart an nsqd")):
        sub.add_parser(name, help=what, description=what).add_argument(
            "node", help="node # (as the banner numbers them) or node id")
    p = sub.add_parser("move-leader", help="hand a partition to another node")
    p.add_argument("topic", help="the topic")
    p.add_argument("partition", type=int, help="the partition number")
    p.add_argument("--to", default="", help="node # or id (default: the next replica)")
    p = sub.add_parser("writable", help="disable or enable writes on a partition")
    p.add_argument("topic", help="the topic")
    p.add_argument("partition", type=int, help="the partition number")
    p.add_argument("writable", choices=("true", "false"), help="true: writable, false: not")
    for name, what in (("stop-lookupd", "stop an nsqlookupd"),
                       ("start-lookupd", "restart an nsqlookupd")):
        sub.add_parser(name, help=what).add_argument(
            "lookupd", type=int, help="lookupd # (as the banner numbers them)")
    for name, what in (("cut", "close every client connection (needs --proxied)"),
                       ("stall", "keep connections open, deliver nothing (needs --proxied)"),
                       ("resume", "end a stall (needs --proxied)")):
        sub.add_parser(name, help=what).add_argument(
            "node", nargs="?", default="", help="node # or id (default: all)")
    p = sub.add_parser("settle", help="wait until every fault sequence has ended")
    p.add_argument("--within", type=int, default=60, help="seconds (default 60)")
    p = sub.add_parser("create-topic", help="create a topic: NAME[:P[:R[:ordered][:ext]]]")
    p.add_argument("spec", help="NAME[:PARTITIONS[:REPLICAS]] then :ordered and/or :ext")
    p.add_argument("--channel", action="append", default=[],
                   help="channel to create (repeatable; default: 'default')")
    sub.add_parser("status", help="print nodes, lookupds, topics and the fault timeline")
    return parser


def _fault_request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    action = args.action
    if action in NODE_ACTIONS:
        return "POST", f"/fault/{action}", {"node": args.node.lstrip("#")}
    if action == "move-leader":
        return "POST", "/fault/move_leader", {"topic": args.topic, "partition": args.partition,
                                              "to": args.to.lstrip("#")}
    if action == "writable":
        return "POST", "/fault/writable", {"topic": args.topic, "partition": args.partition,
                                           "writable": args.writable}
    if action in ("stop-lookupd", "start-lookupd"):
        return "POST", f"/fault/{action.replace('-', '_')}", {"lookupd": args.lookupd}
    if action in CONNECTION_ACTIONS:
        return "POST", f"/fault/{action}", {"node": args.node.lstrip("#")}
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
        parser.error(f"--admin HOST:PORT is required (or set ${ADMIN_ENV}, printed by "
                     f"{prog} when it starts)")
    host, _, port = args.admin.rpartition(":")
    try:
        check_loopback(host)
        method, path, params = _fault_request(args)
    except ValueError as exc:
        parser.error(str(exc))
    params = {k: v for k, v in params.items() if v != ""}
    query = urllib.parse.urlencode(params, doseq=True)
    url = f"http://{host}:{port}{path}" + (f"?{query}" if query else "")
    try:  # the library's client: the whole answer within --timeout, however it trickles
        status, text = asyncio.run(_request(method, url, args.timeout))
    except Timeout:
        print(f"fault {args.action}: no answer from the admin endpoint {args.admin} within "
              f"{args.timeout:g} s", file=sys.stderr)
        return 1
    except (NSQError, OSError) as exc:
        print(f"fault {args.action}: cannot reach the admin endpoint {args.admin} "
              f"({' '.join(str(exc).split()) or type(exc).__name__}): is the dev cluster "
              f"running? (its banner prints DEVCLUSTER_ADMIN)", file=sys.stderr)
        return 1
    try:
        body = json.loads(text)
    except ValueError:
        body = {"message": text}
    if status != 200:
        message = body.get("message", body) if isinstance(body, dict) else body
        print(f"fault {args.action}: {message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=2 if args.action == "status" else None))
    elif args.action == "status":
        print(render_status(body))
    else:
        print(_done_line(args, body))
    return 0


async def _request(method: str, url: str, timeout: float) -> tuple[int, str]:
    async with HttpClient(connect_timeout=min(timeout, 5.0)) as client:
        resp = await client.request(method, url, timeout=timeout, max_body=16 * 1024 * 1024)
    return resp.status, resp.body.decode("utf-8", "replace")


def _node_text(index: Any, node: Any = None) -> str:
    if index is None:
        return f"node {node}" if node else "every node"
    return f"node #{index}" + (f" ({node})" if node else "")


def _done_line(args: argparse.Namespace, body: dict[str, Any]) -> str:
    """One sentence for what a fault action did."""
    action = args.action
    node = _node_text(body.get("index"), body.get("node"))
    if action == "kill":
        return f"killed {node}; its partitions fail over on the profile's clock " \
               f"('fault settle' waits for that, 'fault status' shows it)"
    if action == "leave":
        return f"{node} is leaving: its partitions are handed over, then it stops"
    if action == "stop":
        return f"stopped {node} (no failover)"
    if action == "start":
        return f"started {node}"
    if action == "move-leader":
        leader = body.get("leader")
        where = f"{body.get('topic')}/{body.get('partition')}"
        if leader is None:
            return f"{where}: no other replica to move the leader to"
        return f"{where}: leader is now {_node_text(body.get('index'), leader)}"
    if action == "writable":
        state = "writable" if body.get("writable") else "not writable"
        return f"{body.get('topic')}/{body.get('partition')} is {state} now"
    if action in ("stop-lookupd", "start-lookupd"):
        verb = "stopped" if action == "stop-lookupd" else "started"
        return f"{verb} lookupd #{body.get('lookupd')}"
    if action == "cut":
        return f"cut {body.get('cut')} connection(s) to {_node_text(body.get('index'))}"
    if action in ("stall", "resume"):
        verb = "stalled" if action == "stall" else "resumed"
        return f"{verb} connections to {_node_text(body.get('index'))}"
    if action == "settle":
        return "settled: every fault sequence has ended"
    if action == "create-topic":
        return (f"created topic {body.get('topic')} ({body.get('partitions')} partitions x "
                f"{body.get('replicas')} replicas)")
    return json.dumps(body)


def _check_replicas(args: argparse.Namespace) -> None:
    """A topic needing more replicas than the cluster has nodes: say so before starting
    (the server's own answer is ``ErrType:9 ErrCode:1 : No node is available for topic``)."""
    if args.mode == "classic":
        return
    for spec in map(_topic_spec, args.topic):
        message = replicas_error(spec.name, spec.partitions, spec.replicas, args.nodes)
        if message:
            raise ValueError(f"--topic {spec.name}:{spec.partitions}:{spec.replicas}: "
                             f"{message}")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fault":
        return fault_main(argv[1:], prog or PROG)
    parser = build_parser(prog) if prog else build_parser()
    args = parser.parse_args(argv)
    try:
        for spec in args.topic:
            _topic_spec(spec)
        _check_replicas(args)
        profile_named(args.profile, args.time_scale, args.seed)
        check_loopback(args.host)
    except ValueError as exc:  # one line saying what to change (no usage block)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:  # before the signal handlers were in place
        return EXIT_INTERRUPTED
    except (OSError, RuntimeError) as exc:
        print(f"dev cluster failed: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("dev-cluster", "run an embedded dev cluster in the foreground",
                add_help=False, allow_abbrev=False, passthrough=True,
                description="Everything after dev-cluster goes to the dev cluster "
                            "(smartnsq dev-cluster --help).")
    p.set_defaults(handler=run_devcluster, passthrough=True)


def run_devcluster(args: argparse.Namespace) -> int:
    """The ``smartnsq`` parser's handler: everything after ``dev-cluster`` goes to :func:`main`."""
    with contextlib.redirect_stderr(args.err), contextlib.redirect_stdout(args.out):
        try:
            return int(main(args.extra, prog=PROG) or 0)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        except KeyboardInterrupt:  # Ctrl-C during a fault request: as every command
            args.err.write("interrupted\n")
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # `... fault status | head`: the reader went away
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, args.out.fileno())
            return 0
