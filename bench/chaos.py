"""The long total-queue check: the Producer and Consumer through the real cluster's faults.

    python bench/chaos.py [--quick] [--seed N] [--seconds S] [--time-scale X]
    python bench/chaos.py --real [DIR] [--seed N] [--seconds S]

Runs :func:`smartnsq.devcluster.chaos.run_chaos` with the ``realistic`` fault profile at
scale 1 by default (leaderless windows of 21-49 s, 12 s replica stalls, ISR shrinks at 22-49 s,
catch-up of a replica-2 partition at 93-139 s, slow topic creation) and prints the report:
acknowledged, lost, phantom, duplicated, per-key order violations and the longest pause per
partition. ``--quick`` is the CI-sized run (scale 0.03, 8 s). The figures and what they mean
are in docs/performance.md ("Reliability").

``--real`` runs the same check on the real servers (binaries in DIR or ``$SMARTNSQ_REAL_NSQ``:
etcd, 2 youzan nsqlookupd, 3 nsqd) with real faults: SIGKILL of an nsqd (no leader until
etcd's session expires, 21-49 s), SIGTERM (a graceful leave) and SIGKILL of a lookupd, each
member started again after its time down.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from _common import command_line, environment

from smartnsq.devcluster.chaos import REAL_FAULTS, ChaosConfig, run_chaos
from smartnsq.devcluster.profile import profile_named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short CI-sized run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=360.0, help="fault injection time")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=100.0, help="publishes/s, both topics")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--publish-timeout", type=float, default=10.0)
    parser.add_argument("--real", nargs="?", const="", default=None, metavar="DIR",
                        help="on the real servers (DIR or $SMARTNSQ_REAL_NSQ)")
    parser.add_argument("--drain-seconds", type=float, default=180.0,
                        help="--real: time to read back what is left after the faults")
    args = parser.parse_args()
    if args.real is not None:
        return run_real(args)
    scale, seconds = (0.03, 8.0) if args.quick else (args.time_scale, args.seconds)
    gaps = (0.5 / 0.03 * scale, 2.0 / 0.03 * scale)
    config = ChaosConfig(seed=args.seed, seconds=seconds,
                         profile=profile_named("realistic", scale, args.seed),
                         rate=args.rate, replicas=args.replicas,
                         fault_gap=gaps, down_for=(gaps[0], gaps[1] * 1.5),
                         publish_timeout=args.publish_timeout,
                         drain_seconds=max(30.0, 150.0 * scale))
    began = time.monotonic()
    report = asyncio.run(run_chaos(config))
    print(report.format())
    print(f"wall time {time.monotonic() - began:.0f} s")
    print(f"command: {command_line()}")
    print(environment())
    return 0 if report.ok else 1


def run_real(args: argparse.Namespace) -> int:
    from smartnsq.testing.realcluster import RealCluster

    config = ChaosConfig(seed=args.seed, seconds=args.seconds, rate=args.rate,
                         replicas=args.replicas, faults=REAL_FAULTS, fault_gap=(3.0, 10.0),
                         down_for=(3.0, 15.0), kill_down_for=(60.0, 75.0),
                         publish_timeout=args.publish_timeout,
                         drain_seconds=args.drain_seconds)

    async def go() -> object:
        async with RealCluster(nodes=config.nodes, lookupds=config.lookupds,
                               binaries=args.real or None) as cluster:
            return await run_chaos(config, cluster)

    began = time.monotonic()
    report = asyncio.run(go())
    print(report.format())  # type: ignore[attr-defined]
    print(f"wall time {time.monotonic() - began:.0f} s (real servers)")
    print(f"command: {command_line()}")
    print(environment())
    return 0 if report.ok else 1  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
