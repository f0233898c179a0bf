"""One lookup round with a stuck lookupd beside a healthy one.

``python bench/lookup_hostile.py [--rounds N] [--kind silent|drip]``: a ``LookupManager`` with
two seeds, a healthy fake lookupd and a hostile one (``smartnsq.testing.hostile``), both on
loopback. It times ``start()`` and then N forced rounds (``view(refresh=True)``), printing
median and max per round. The hostile lookupd is in back-off after its first failure, so the
rounds right after start show the steady state; ``--backoff`` 0.01 makes every round ask it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

from smartnsq.discovery.lookup import LookupManager  # noqa: E402
from smartnsq.testing.hostile import DripLookupd, FakeLookupd, SilentLookupd  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", choices=["silent", "drip"], default="silent")
    parser.add_argument("--backoff", type=float, default=0.01,
                        help="lookupd back-off (small: the hostile one is asked every round)")
    args = parser.parse_args()
    hostile = SilentLookupd() if args.kind == "silent" else DripLookupd()
    async with FakeLookupd() as good, hostile as bad:
        lm = LookupManager([bad.address, good.address], poll_interval=300,
                           discover_interval=300, backoff=args.backoff,
                           backoff_max=args.backoff)
        started = time.perf_counter()
        try:
            await asyncio.wait_for(lm.start(), 60)
            start_took = time.perf_counter() - started
            took = []
            for _ in range(args.rounds):
                await asyncio.sleep(args.backoff * 2)  # let the back-off lapse: ask it again
                t0 = time.perf_counter()
                await asyncio.wait_for(lm.view("t", refresh=True), 60)
                took.append(time.perf_counter() - t0)
        finally:
            await asyncio.wait_for(lm.close(), 10)
    print(f"{args.kind} lookupd beside a healthy one: start {start_took * 1000:.1f} ms; "
          f"round median {statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms "
          f"({args.rounds} rounds, the hostile one asked in each)")


if __name__ == "__main__":
    asyncio.run(main())
