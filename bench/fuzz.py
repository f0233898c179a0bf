"""The long stateful fuzz of the public API: the CI test's world, driven for minutes.

    python bench/fuzz.py [--seconds S] [--seed N] [--steps-per-world K]

Drives the world of ``tests/fuzz/world.py`` (a proxied dev cluster, hostile peers, Producer,
Consumer and the ``smartnsq.sync`` facade) with a seeded random walk over the same operations
the CI state machine (``tests/fuzz/test_api_statemachine.py``) draws from: publishes of every
kind, pin, topic and deadline, routes, consumer starts and closes with handlers that succeed,
raise or hang, faults, and fresh clients against hostile peers. Every ``--steps-per-world``
steps the world ends (heal, close, drain, leak checks) and a fresh one starts, so the
end-of-run invariants are checked many times. Prints steps, calls, faults fired, documented
errors by type, and the violations by kind: undocumented exceptions, errors naming nothing,
deadline overruns past the slack, FINs before the handler succeeded, lost messages, broken
per-key order, leaks, hangs. Exit status 1 when any violation was seen. The figures are in
docs/reliability.md ("Stateful fuzz of the public API").
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path

from _common import ROOT, command_line, environment

sys.path.insert(0, str(Path(ROOT) / "tests" / "fuzz"))

import world as fz

# how often each operation is drawn: mostly publishes, then the rest
WEIGHTS = {"publish": 10, "routes": 1, "fault": 3, "hostile": 2, "consumer_start": 2,
           "consumer_close": 1, "bad_input": 1, "publish_unwritable": 1}


def step(w: fz.World, r: random.Random) -> None:
    """One operation, drawn with :data:`WEIGHTS`, arguments uniformly from the world's lists."""
    op = r.choices(list(WEIGHTS), list(WEIGHTS.values()))[0]
    if op == "publish":
        w.publish(r.choice(fz.PUBLISH_KINDS), r.choice(fz.TOPICS), r.choice(fz.PINS),
                  r.choice(fz.KEYS), r.randrange(fz.PARTITIONS), r.random() < 0.3,
                  r.choice(fz.HEADERS), r.choice(fz.TIMEOUTS))
    elif op == "routes":
        w.routes(r.choice(fz.TOPICS), r.choice(fz.TIMEOUTS), r.random() < 0.5)
    elif op == "fault":
        w.fault(r.choice(fz.FAULTS), r.randrange(3), r.choice(fz.TOPICS),
                r.randrange(fz.PARTITIONS))
    elif op == "hostile":
        w.hostile(r.choice(fz.HOSTILE), r.choice(fz.HOSTILE_CALLS), r.choice((0.05, 0.5, 1.0)))
    elif op == "consumer_start":
        w.consumer_start(r.choice(fz.TOPICS), r.choice(fz.HANDLERS), r.random() < 0.5)
    elif op == "publish_unwritable":
        w.publish_unwritable(r.choice(fz.TOPICS), r.randrange(fz.PARTITIONS), r.random() < 0.5)
    elif op == "bad_input":
        w.bad_input(r.choice(fz.BAD_INPUTS))
    else:
        w.consumer_close(r.randrange(2), r.choice((0.5, 2.0)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long to keep going")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps-per-world", type=int, default=80)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the client's own warnings are expected here
    r = random.Random(args.seed)
    started = time.monotonic()
    total = fz.Counts()
    violations: list[str] = []
    worlds = 0
    while time.monotonic() - started < args.seconds:
        w = fz.World()
        worlds += 1
        for _ in range(args.steps_per_world):
            step(w, r)
            if time.monotonic() - started >= args.seconds:
                break
        violations += w.finish()
        c = w.counts
        total.steps += c.steps
        total.calls += c.calls
        total.faults += c.faults
        total.acked += c.acked
        total.handled += c.handled
        for k, v in c.errors.items():
            total.errors[k] += v
        for k, v in c.fault_kinds.items():
            total.fault_kinds[k] += v
        for k, v in c.samples.items():
            total.samples.setdefault(k, v)
        print(f"world {worlds}: {c.format()}; violations so far {len(violations)}",
              flush=True)
    kinds = Counter(v.split(":", 1)[0] for v in violations)
    print()
    print(command_line())
    print(f"seed {args.seed}, {time.monotonic() - started:.0f} s, {worlds} worlds, "
          f"slack {fz.SLACK} s")
    print(total.format())
    for kind in ("undocumented", "unnamed", "overrun", "FIN before the handler succeeded",
                 "lost", "order", "hang"):
        print(f"  {kind:34} {kinds.get(kind, 0)}")
    leaks = sum(n for k, n in kinds.items() if "left after close" in k)
    print(f"  {'left after close (task/socket/thread)':34} {leaks}")
    others = {k: n for k, n in kinds.items() if "left after close" not in k and k not in (
        "undocumented", "unnamed", "overrun", "FIN before the handler succeeded", "lost",
        "order", "hang")}
    for kind, n in others.items():
        print(f"  {kind:34} {n}")
    for v in violations[:40]:
        print("  !", v)
    for sample in total.samples.values():
        print("  e.g.", sample)
    print(environment())
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
