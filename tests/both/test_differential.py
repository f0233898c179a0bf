"""The live differential: each exchange of ``tests/differential.py`` is played on a
dev cluster and on the real servers of the same shape, and the normalised answers must be
equal.

One dev and one real cluster per mode serve the whole module (youzan: 3 nsqd and 2 lookupds
with the shared topics, created once; classic: 1 and 1); they live in a loop thread of
their own, so the cases are plain functions. The real side needs ``$SMARTNSQ_REAL_NSQ``:
without it every case is skipped with one reason. A difference that is known and not fixed
is a ``deviation`` of its exchange: the case is ``xfail(strict=True)`` and the deviation is
listed in docs/devcluster.md ("Known deviations from the real servers"). The score (compared,
equal, fixed, documented deviations) is printed at the end of each mode's cases;
``bench/differential.py`` prints it without pytest.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from differential import (
    CLASSIC,
    YOUZAN,
    Exchange,
    Loop,
    Score,
    differences,
    run_both,
    start_sides,
    stop_sides,
)

from smartnsq.errors import RealNsqdError
from smartnsq.testing.realcluster import ENV, find_binaries

START_TIMEOUT = 240.0   # a youzan real cluster and its five topics: ~10 s when idle
CASE_TIMEOUT = 60.0


def _cases() -> list[Any]:
    cases = []
    for mode, exchanges in (("youzan", YOUZAN), ("classic", CLASSIC)):
        for exchange in exchanges:
            marks: list[Any] = [pytest.mark.real]
            if exchange.deviation is not None:
                marks.append(pytest.mark.xfail(
                    strict=True, reason=f"known deviation: {exchange.deviation}"))
            cases.append(pytest.param(mode, exchange, id=f"{mode}-{exchange.name}",
                                      marks=marks))
    return cases


def _report(request: pytest.FixtureRequest, line: str) -> None:
    """Print the score past pytest's capture (shown with or without ``-s``)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line("")
        reporter.write_line(line)


class Clusters:
    """The dev and real clusters of one mode at a time, started on first use (the cases
    come mode by mode: switching modes stops the previous pair and prints its score)."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.loop = Loop()
        self.mode: str | None = None
        self.sides: Any = None
        self.score = Score()
        self.started = 0.0

    def get(self, mode: str) -> tuple[Any, Score]:
        if mode != self.mode:
            self.close()
            try:
                find_binaries(None, mode)
            except RealNsqdError as exc:
                pytest.skip(str(exc))
            self.mode, self.score, self.started = mode, Score(), time.monotonic()
            self.sides = self.loop.run(start_sides(mode), START_TIMEOUT)
        return self.sides, self.score

    def close(self) -> None:
        if self.sides is not None:
            self.loop.run(stop_sides(*self.sides), 60)
            self.score.seconds = time.monotonic() - self.started
            _report(self.request, f"{self.mode} {self.score.line()}")
        self.sides = self.mode = None


@pytest.fixture(scope="module")
def clusters(request: pytest.FixtureRequest) -> Iterator[Clusters]:
    if not os.environ.get(ENV):
        pytest.skip(f"real NSQ servers: set {ENV} to the folder of their binaries")
    own = Clusters(request)
    try:
        yield own
    finally:
        own.close()
        own.loop.close()


@pytest.mark.parametrize(("mode", "exchange"), _cases())
def test_exchange(clusters: Clusters, mode: str, exchange: Exchange) -> None:
    (dev, real), score = clusters.get(mode)
    got_dev, got_real = clusters.loop.run(run_both(dev, real, exchange), CASE_TIMEOUT)
    score.add(mode, exchange, got_dev == got_real)
    if got_dev != got_real:
        pytest.fail(f"{mode}/{exchange.name}: the dev cluster answers otherwise than the real "
                    f"servers:\n  " + "\n  ".join(differences(got_dev, got_real)),
                    pytrace=False)


@pytest.mark.parametrize("mode", ["youzan", "classic"])
def test_dev_against_dev(mode: str) -> None:
    """The harness itself, without the real servers: two dev clusters answer every exchange
    alike (masking and ordering hide nothing that differs by chance between two runs)."""
    loop = Loop()
    try:
        async def play() -> list[str]:
            one, two = await start_sides(mode, real_servers=False)
            try:
                out = []
                for exchange in (YOUZAN if mode == "youzan" else CLASSIC):
                    a, b = await run_both(one, two, exchange)
                    if a != b:
                        out.append(f"{exchange.name}: " + "; ".join(differences(a, b)[:3]))
                return out
            finally:
                await stop_sides(one, two)

        different = loop.run(play(), START_TIMEOUT)
    finally:
        loop.close()
    assert not different, "two dev clusters differ:\n" + "\n".join(different)
