"""The publishers' route book paces the probes of a partition that refuses writes (issue 33
item 9): turns further apart per refusal, up to one a second, per partition; a success starts
the pace again. Before, a turn every ``retry_delay`` (50 ms) for as long as the partition
refused. Written against the route book alone, so it runs (and failed) on the code before."""

from __future__ import annotations

import pytest

from smartnsq.discovery.route_book import RouteBook
from smartnsq.model.routes import RoutesCallback, TopicRoutes

A = ("127.0.0.1", 4150)
B = ("127.0.0.1", 4151)
MOST = 1.0  # s: the longest gap between two probes of a refusing partition (PROBE_PERIOD_MAX)


class PushSource:
    """A route source the test pushes routes through."""

    def __init__(self) -> None:
        self.callbacks: list[RoutesCallback] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def routes(self, topic: str) -> TopicRoutes:
        raise AssertionError("not looked up in these tests")

    def refresh(self, topic: str, *, now: bool = False) -> None:
        return None

    def subscribe(self, callback: RoutesCallback) -> None:
        self.callbacks.append(callback)

    def push(self, leaders: dict[int, tuple[str, int]]) -> None:
        for callback in self.callbacks:
            callback(TopicRoutes("t", partition_num=2, youzan=True, leaders=leaders))


async def test_the_route_book_backs_off_the_probes_of_a_refusing_partition() -> None:
    source = PushSource()
    book = RouteBook(source, wait_refresh=0.0, answering={A, B}.__contains__,
                     connected={A, B}.__contains__, fresh=lambda addresses: None)
    source.push({0: A, 1: B})
    delays = [book.after_failure("t", 0, 30.0, refresh=False, refused_by=None, code=None,
                                 no_leader=False, probe=True, probe_period=0.05).delay
              for _ in range(12)]
    gaps = [b - a for a, b in zip([0.0, *delays], delays, strict=False)]
    assert gaps[-1] == pytest.approx(MOST, abs=0.01), gaps
    book.writable("t", 0)  # a probe went through: the pace starts again from the base
    again = book.after_failure("t", 0, 30.0, refresh=False, refused_by=None, code=None,
                               no_leader=False, probe=True, probe_period=0.05)
    assert again.delay == pytest.approx(0.05, abs=0.01)
    other = book.after_failure("t", 1, 30.0, refresh=False, refused_by=None, code=None,
                               no_leader=False, probe=True, probe_period=0.05)
    assert other.delay == pytest.approx(0.05, abs=0.01)  # per partition
    await book.close()
