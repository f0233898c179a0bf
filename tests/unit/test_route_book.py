"""The publishers' route book (smartnsq.discovery.route_book.RouteBook) driven through its route
source: holds on a live leader, their release, a stalled leader's partition held again once it
answers, and the wait after a failure asking the book once."""

from __future__ import annotations

import asyncio
import gc

import pytest

from smartnsq.discovery.route_book import RouteBook
from smartnsq.errors import LookupFailed
from smartnsq.model.routes import RoutesCallback, TopicRoutes

A = ("127.0.0.1", 4150)
B = ("127.0.0.1", 4151)


class PushSource:
    """A route source the test pushes routes through; records refreshes."""

    def __init__(self) -> None:
        self.callbacks: list[RoutesCallback] = []
        self.refreshes = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def routes(self, topic: str) -> TopicRoutes:
        raise AssertionError("not looked up in these tests")

    def refresh(self, topic: str, *, now: bool = False) -> None:
        self.refreshes += 1

    def subscribe(self, callback: RoutesCallback) -> None:
        self.callbacks.append(callback)

    def push(self, **leaders: tuple[str, int]) -> None:
        routes = TopicRoutes("t", partition_num=2, youzan=True,
                             leaders={int(p[1:]): a for p, a in leaders.items()})
        for callback in self.callbacks:
            callback(routes)


def book_over(source: PushSource, answering: set[tuple[str, int]],
              connected: set[tuple[str, int]]) -> RouteBook:
    return RouteBook(source, wait_refresh=0.0, answering=answering.__contains__,
                     connected=lambda a: a in connected or a in answering,
                     fresh=lambda addresses: None)


async def test_a_dropped_partition_stays_on_its_answering_leader_until_it_says_no() -> None:
    source = PushSource()
    book = book_over(source, {A}, set())
    source.push(p0=A, p1=B)
    source.push(p1=B)  # lookup hides p0 (not writable); A still answers
    routes = book.get("t")
    assert routes is not None and routes.leaders == {0: A, 1: B} and routes.held == {0}
    assert [p for p, _ in routes.targets] == [1]  # round-robin skips the held partition
    book.leader_failed("t", 0, A, "E_FAILED_ON_NOT_WRITABLE")  # still held: probe again
    assert book.get("t").held == {0}  # type: ignore[union-attr]
    book.leader_failed("t", 0, A, "E_FAILED_ON_NOT_LEADER")  # no place to hold it on
    assert book.get("t").leaders == {1: B}  # type: ignore[union-attr]
    assert source.refreshes == 2
    await book.close()


async def test_a_stalled_leaders_partition_is_held_again_once_it_answers() -> None:
    source = PushSource()
    answering: set[tuple[str, int]] = set()
    book = book_over(source, answering, {A})
    source.push(p0=A, p1=B)
    source.push(p1=B)  # A connected but owes answers: not held, remembered
    assert book.get("t").leaders == {1: B}  # type: ignore[union-attr]
    assert not book.rehold("t", 0)  # still stalled
    answering.add(A)
    changed = book.changed("t", 10.0)
    pause = book.after_failure("t", 0, 5.0, refresh=True, refused_by=None, code=None,
                               no_leader=True, probe=False, probe_period=0.05)
    assert pause.delay == 0.0  # held again: ask it at once, not after the back-off
    assert book.get("t").held == {0} and changed.done()  # type: ignore[union-attr]
    await book.close()


async def test_a_probe_takes_the_partitions_turn_and_a_success_wakes_it() -> None:
    source = PushSource()
    book = book_over(source, {A}, set())
    source.push(p0=A, p1=B)
    first = book.after_failure("t", 0, 1.0, refresh=False, refused_by=None, code=None,
                               no_leader=False, probe=True, probe_period=0.05)
    second = book.after_failure("t", 0, 1.0, refresh=False, refused_by=None, code=None,
                                no_leader=False, probe=True, probe_period=0.05)
    assert 0 < first.delay < second.delay <= 0.1 + 1e-6  # one turn each, a period apart
    assert second.partition == 0  # its wait also ends when a publish to p0 succeeds
    waiting = book.changed("t", 30.0, second.partition)  # (what second.wait() awaits)
    book.writable("t", 0)  # the first probe went through
    assert waiting.done()
    await book.close()


class SlowFailingSource(PushSource):
    """A lookup that answers only when released, and then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def routes(self, topic: str) -> TopicRoutes:
        await self.release.wait()
        raise LookupFailed("no lookupd answered (the test's)")


async def test_a_lookup_failing_after_its_caller_left_leaves_no_unread_error() -> None:
    """A caller whose deadline ends first leaves the shared lookup running for the next one;
    when it then fails, nobody is waiting, and asyncio must not report the failure as
    "Task exception was never retrieved" (the stateful fuzz saw it under load)."""
    loop = asyncio.get_running_loop()
    unread: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: unread.append(str(ctx.get("message"))))
    source = SlowFailingSource()
    book = book_over(source, set(), set())
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(book.load("t"), 0.01)
    source.release.set()
    for _ in range(3):  # the lookup ends, fails and is collected
        await asyncio.sleep(0)
    gc.collect()
    await asyncio.sleep(0)
    assert unread == []
