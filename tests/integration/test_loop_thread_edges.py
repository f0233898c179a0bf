"""The loop thread under the blocking facades, at its edges: a ``Slot`` settles once (a
second answer is refused, a cancel after it is a no-op, callbacks run in order and one that
raises is logged without stopping the others); a caller that gives up on a slot or a
``call_future`` cancels the work on the loop; a call given up before it started never runs;
a ``SystemExit`` in a call stops the loop and fails every call queued with it and after it,
promptly; stopping from the loop's own thread, before starting, or with a wedged loop
returns (the last with a warning), and a stopped thread never starts again; a failing
``close`` of an iterator left early is logged, not raised; a thread that is not the shared
one is not released by ``release_shared``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import WAIT

from smartnsq.errors import LoopTimeout
from smartnsq.transport import loop_thread
from smartnsq.transport.loop_thread import LoopThread, Slot


@pytest.fixture
def lt() -> Iterator[LoopThread]:
    thread = LoopThread("edges").start()
    yield thread
    thread.stop()


def poll(condition: Callable[[], bool], what: str) -> None:
    """Wait for a state nothing signals (a thread ending), within the suites' bound."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {WAIT} s: {what}")
        time.sleep(0.01)


class Blocked:
    """Holds the loop thread in one callback, so calls queued meanwhile meet in one batch."""

    def __init__(self, thread: LoopThread) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

        def hold() -> None:
            self.entered.set()
            self.gate.wait(WAIT)

        thread.call_soon(hold)
        assert self.entered.wait(WAIT)

    def release(self) -> None:
        self.gate.set()


# -- Slot -------------------------------------------------------------------------------------

def test_a_slot_settles_once_and_runs_its_callbacks_in_order(
        lt: LoopThread, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    refusals: list[str] = []

    def first(slot: Slot[Any]) -> None:
        seen.append("first")

    def broken(slot: Slot[Any]) -> None:
        raise ZeroDivisionError("callback broke")

    def last(slot: Slot[Any]) -> None:
        seen.append("last")

    def work(slot: Slot[Any]) -> None:
        for fn in (first, broken, last):
            slot.add_done_callback(fn)
        slot.set_result(42)
        for again in (lambda: slot.set_result(43), lambda: slot.set_exception(KeyError)):
            try:
                again()
            except asyncio.InvalidStateError as exc:
                refusals.append(str(exc))
        refusals.append(f"cancel: {slot.cancel()}")
        slot.add_done_callback(lambda s: seen.append(f"late: {s.done()} {s.cancelled()}"))

    with caplog.at_level(logging.ERROR, "smartnsq.sync"):
        assert lt.wait(lt.call_slot(work), WAIT) == 42
        lt.call(lambda: None)  # the caller wakes first: the callbacks run in that loop step
    assert seen == ["first", "last", "late: True False"]
    assert refusals == ["the slot is already settled"] * 2 + ["cancel: False"]
    [logged] = [r for r in caplog.records if r.name == "smartnsq.sync"]
    assert "done callback raised" in logged.getMessage()
    assert logged.exc_info is not None and isinstance(logged.exc_info[1], ZeroDivisionError)


def test_a_slot_failed_with_an_exception_class_raises_an_instance(lt: LoopThread) -> None:
    with pytest.raises(KeyError):
        lt.wait(lt.call_slot(lambda slot: slot.set_exception(KeyError)), WAIT)
    with pytest.raises(ValueError, match="raised by the work"):
        lt.wait(lt.call_slot(_raise_value_error), WAIT)


def _raise_value_error(slot: Slot[Any]) -> None:
    raise ValueError("raised by the work")


def test_giving_up_on_a_slot_cancels_it_on_the_loop(lt: LoopThread) -> None:
    settled = threading.Event()
    kept: list[Slot[Any]] = []

    def never(slot: Slot[Any]) -> None:  # starts the work, which never answers
        kept.append(slot)
        slot.add_done_callback(lambda s: settled.set())

    slot = lt.call_slot(never)
    with pytest.raises(LoopTimeout, match=r"no result within 0\.05s"):
        lt.wait(slot, 0.05)
    assert settled.wait(WAIT)
    assert kept == [slot] and slot.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        slot.outcome()


# -- call_future --------------------------------------------------------------------------------

def test_giving_up_on_a_call_future_cancels_the_work_on_the_loop(lt: LoopThread) -> None:
    sources: list[asyncio.Future[Any]] = []
    cancelled = threading.Event()

    def start() -> asyncio.Future[Any]:
        source = asyncio.get_running_loop().create_future()
        source.add_done_callback(lambda f: cancelled.set() if f.cancelled() else None)
        sources.append(source)
        return source

    call = lt.call_future(start)
    with pytest.raises(LoopTimeout, match=r"no result within 0\.05s"):
        lt.wait(call, 0.05)
    assert cancelled.wait(WAIT)
    assert call.cancelled() and sources[0].cancelled()


def test_a_call_given_up_before_it_started_never_runs(lt: LoopThread) -> None:
    ran: list[str] = []

    def start(name: str) -> asyncio.Future[Any]:
        ran.append(name)
        future = asyncio.get_running_loop().create_future()
        future.set_result(name)
        return future

    blocked = Blocked(lt)
    try:
        skipped = lt.call_future(start, "skipped")
        kept = lt.call_future(start, "kept")
        assert skipped.cancel()
    finally:
        blocked.release()
    assert lt.wait(kept, WAIT) == "kept"
    assert ran == ["kept"]
    assert skipped.cancelled()


def test_a_call_whose_work_ends_after_the_caller_cancelled_stays_cancelled(
        lt: LoopThread) -> None:
    sources: list[asyncio.Future[Any]] = []

    def start() -> asyncio.Future[Any]:
        sources.append(asyncio.get_running_loop().create_future())
        return sources[0]

    call = lt.call_future(start)
    lt.call(lambda: None)  # a round trip: the work has started
    assert call.cancel()
    # the work ends anyway (unless the cancel reached it first): the caller's answer stands
    lt.call(lambda: sources[0].done() or sources[0].set_result("too late"))
    lt.call(lambda: None)
    assert call.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        call.result(0)


def test_cancelling_a_started_call_future_cancels_its_asyncio_future(lt: LoopThread) -> None:
    sources: list[asyncio.Future[Any]] = []

    def start() -> asyncio.Future[Any]:
        sources.append(asyncio.get_running_loop().create_future())
        return sources[0]

    call = lt.call_future(start)
    lt.call(lambda: None)  # the work has started
    assert call.cancel()
    lt.call(lambda: None)
    lt.call(lambda: None)
    assert lt.call(lambda: sources[0].cancelled())


def test_a_wait_longer_than_the_platform_allows_is_clamped(lt: LoopThread) -> None:
    assert lt.run(asyncio.sleep(0, "done"), timeout=1e300) == "done"
    assert lt.wait(lt.call_slot(lambda slot: slot.set_result(7)), 1e300) == 7


# -- the loop stopping --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["call_future", "call_slot"])
def test_a_system_exit_in_a_call_stops_the_loop_and_fails_every_queued_call(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    died: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_type))
    thread = LoopThread("exiting").start()
    try:
        ran: list[str] = []

        def start(name: str) -> asyncio.Future[Any]:
            ran.append(name)
            return asyncio.get_running_loop().create_future()

        def leave(*slot: Any) -> asyncio.Future[Any]:
            raise SystemExit(3)

        blocked = Blocked(thread)
        try:
            exiting = getattr(thread, kind)(leave)
            queued = thread.call_future(start, "queued")
            slot = thread.call_slot(lambda s: ran.append("slot"))
        finally:
            blocked.release()
        with pytest.raises(SystemExit):
            thread.wait(exiting, WAIT)
        for call in (queued, slot):
            with pytest.raises(RuntimeError, match="exiting: the loop thread is stopping"):
                thread.wait(call, WAIT)
        assert ran == []
        poll(lambda: thread.loop.is_closed() and not thread.running, "the loop thread ended")
        assert died == [SystemExit]
        # later calls fail at once, never wait for the dead loop
        with pytest.raises(RuntimeError, match="exiting: the loop thread is stopped"):
            thread.call_future(start, "later").result(WAIT)
        with pytest.raises(RuntimeError, match="exiting: the loop thread is stopped"):
            thread.wait(thread.call_slot(lambda s: ran.append("later")), WAIT)
        assert ran == []
    finally:
        thread.stop()


def test_stopping_a_thread_whose_loop_just_died_returns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    exiting = threading.Event()
    gate = threading.Event()

    def excepthook(args: Any) -> None:  # the dying thread is still alive in here
        exiting.set()
        gate.wait(WAIT)

    monkeypatch.setattr(threading, "excepthook", excepthook)
    thread = LoopThread("dying").start()
    loop = thread.loop
    try:
        thread.call_soon(_system_exit)
        assert exiting.wait(WAIT)
        assert loop.is_closed()
        thread.stop()
    finally:
        gate.set()
    poll(lambda: not thread.running, "the thread ended")


def _system_exit() -> None:
    raise SystemExit(1)


def test_a_call_futures_error_is_raised_as_is(lt: LoopThread) -> None:
    error = LookupError("the work failed")

    def start() -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(error)
        return future

    with pytest.raises(LookupError) as info:
        lt.wait(lt.call_future(start), WAIT)
    assert info.value is error


def test_stopping_from_the_loops_own_thread_ends_it() -> None:
    thread = LoopThread("self-stop").start()
    loop = thread.loop
    thread.call_soon(thread.stop)
    poll(loop.is_closed, "the loop closed")
    assert not thread.running
    with pytest.raises(RuntimeError, match="self-stop: the loop thread is stopped"):
        thread.call(lambda: None)
    thread.stop()  # idempotent


def test_a_thread_stopped_before_it_started_never_starts() -> None:
    thread = LoopThread("never")
    thread.stop()
    assert not thread.running
    with pytest.raises(RuntimeError, match="never: a stopped LoopThread cannot start again"):
        thread.start()
    with pytest.raises(RuntimeError, match="never: the loop thread is stopped"):
        thread.run(asyncio.sleep(0))


def test_the_loop_starts_on_first_use() -> None:
    thread = LoopThread("lazy")
    try:
        assert not thread.running
        assert thread.loop.is_running() and thread.running
        assert thread.call(lambda: threading.current_thread().name) == "lazy"
    finally:
        thread.stop()


def test_stopping_a_wedged_loop_warns_and_returns(caplog: pytest.LogCaptureFixture) -> None:
    thread = LoopThread("wedged").start()
    loop = thread.loop
    blocked = Blocked(thread)
    try:
        with caplog.at_level(logging.WARNING, "smartnsq.sync"):
            thread.stop(timeout=0.05)
    finally:
        blocked.release()
    assert [r.getMessage() for r in caplog.records if r.name == "smartnsq.sync"] == [
        "wedged: loop thread did not stop within 0.05s"]
    poll(loop.is_closed, "the loop closed once released")


# -- iterate, shared ----------------------------------------------------------------------------

def test_a_failing_close_of_an_iterator_left_early_is_logged_not_raised(
        lt: LoopThread, caplog: pytest.LogCaptureFixture) -> None:
    async def numbers() -> Any:
        for i in range(10):
            yield i

    closes: list[str] = []

    async def close() -> None:
        closes.append("asked")
        raise OSError("cannot close")

    with caplog.at_level(logging.DEBUG, "smartnsq.sync"):
        for item in lt.iterate(numbers(), close):
            if item == 2:
                break
    assert closes == ["asked"]
    [logged] = [r for r in caplog.records if "closing an async iterator failed" in r.getMessage()]
    assert logged.exc_info is not None and isinstance(logged.exc_info[1], OSError)


def test_releasing_a_thread_that_is_not_the_shared_one_changes_nothing() -> None:
    shared = loop_thread.shared()
    other = LoopThread("other").start()
    try:
        users = loop_thread.shared_users()
        loop_thread.release_shared(other)
        assert loop_thread.shared_users() == users
        assert other.running and shared.running
    finally:
        other.stop()
        loop_thread.release_shared(shared)
