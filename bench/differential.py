"""The differential's score: every exchange of ``tests/differential.py`` played on the dev
cluster and on the real servers, without pytest.

    SMARTNSQ_REAL_NSQ=/path/to/realnsq python bench/differential.py [--mode youzan|classic]
        [-k SUBSTRING] [-v]

For each mode it starts a dev and a real cluster of the same shape (youzan: 3 nsqd, 2
lookupds; classic: 1 and 1), creates the shared topics on both, plays the exchanges in order
and prints one line per exchange that differs (``-v``: every exchange, and the differing
fields), then the score: exchanges compared, equal, equal after a fix of the dev cluster,
documented deviations (docs/devcluster.md, "Known deviations from the real servers"),
undocumented differences, and the wall time. The exit status is 1 if an exchange differs
without a documented deviation, or a documented one no longer differs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's smartnsq, and the exchanges

import differential as d  # noqa: E402

from smartnsq.errors import RealNsqdError  # noqa: E402
from smartnsq.testing.realcluster import ENV, find_binaries  # noqa: E402


async def run_mode(mode: str, only: str | None, verbose: bool) -> tuple[d.Score, list[str]]:
    started = time.monotonic()
    dev, real = await d.start_sides(mode)
    score, stale = d.Score(), []
    try:
        for exchange in d.exchanges(mode):
            if only and only not in exchange.name:
                continue
            got_dev, got_real = await d.run_both(dev, real, exchange)
            equal = got_dev == got_real
            score.add(mode, exchange, equal)
            if equal and exchange.deviation:
                stale.append(f"{mode}/{exchange.name}")
            mark = ("equal" if equal else "deviation" if exchange.deviation else "DIFFERS")
            if verbose or mark == "DIFFERS":
                print(f"  {mode}/{exchange.name}: {mark}")
                if (not equal and verbose) or mark == "DIFFERS":
                    for line in d.differences(got_dev, got_real)[:20]:
                        print(f"      {line}")
    finally:
        await d.stop_sides(dev, real)
    score.seconds = time.monotonic() - started
    return score, stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("youzan", "classic"), action="append")
    parser.add_argument("-k", dest="only", help="only exchanges whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    if not os.environ.get(ENV):
        print(f"real NSQ servers: set {ENV} to the folder of their binaries", file=sys.stderr)
        return 2
    print("$ " + " ".join(["python", *sys.argv]))
    failed = False
    total = d.Score()
    for mode in args.mode or ["youzan", "classic"]:
        try:
            find_binaries(None, mode)
        except RealNsqdError as exc:
            print(f"{mode}: skipped ({exc})")
            continue
        score, stale = asyncio.run(run_mode(mode, args.only, args.verbose))
        print(f"{mode} {score.line()}")
        for name in stale:
            print(f"  {name}: documented as a deviation but now equal: update the list")
        failed |= bool(score.different or stale)
        total.compared += score.compared
        total.equal += score.equal
        total.fixed += score.fixed
        total.deviations += score.deviations
        total.different += score.different
        total.seconds += score.seconds
    print(f"total {total.line()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
