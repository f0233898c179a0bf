"""``smartnsq demo``: the arguments; the run itself is :mod:`smartnsq.cli.demo_scenario`, loaded
when the command runs (``smartnsq --help`` does not pay for it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["register", "run_demo"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("demo", "run the partitioned, ordered, traced demo on an embedded cluster",
                description="Publish order events sharded by order id to an ordered topic, "
                            "consume them in order while a partition leader moves, and verify "
                            "that every event arrived once and in order per order id.")
    p.add_argument("--orders", type=int, default=300, help="order ids (default 300)")
    p.add_argument("--events", type=int, default=5,
                   help="events per order, published in order (default 5)")
    p.add_argument("--duration", type=float, default=4.0, metavar="SECONDS",
                   help="spread publishing over about this long (default 4; 0: as fast as "
                        "possible)")
    p.add_argument("--cluster", metavar="LOOKUPD[,LOOKUPD]",
                   help="run against a real cluster (its nsqlookupd HTTP addresses) instead "
                        "of an embedded one; its topics are created if missing, waiting "
                        "until every partition has a leader and is writable")
    p.add_argument("--topic-prefix", default="smartnsq_demo",
                   help="prefix of the demo topics (default smartnsq_demo)")
    p.add_argument("--partitions", type=int, default=4,
                   help="partitions of the ordered topic (default 4)")
    p.add_argument("--create-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long --cluster waits for its topics to become usable "
                        "(default 120)")
    p.add_argument("--no-failover", action="store_true",
                   help="do not move a partition leader mid-stream")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="live progress line on stderr (default: when stderr is a terminal)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the event stream")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object (for scripts)")
    p.set_defaults(handler=run_demo)


async def run_demo(args: argparse.Namespace) -> int:
    from .demo_scenario import run_cli

    return await run_cli(args)
