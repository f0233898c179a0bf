"""The background loop thread behind the blocking facades (smartnsq.transport.loop_thread)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import AsyncIterator

import pytest
from support import WAIT

from smartnsq.transport import loop_thread
from smartnsq.transport.loop_thread import LoopThread


@pytest.fixture
def lt() -> LoopThread:
    thread = LoopThread("test-loop").start()
    yield thread  # type: ignore[misc]
    thread.stop()


def test_run_returns_results_and_raises_errors(lt: LoopThread) -> None:
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    async def boom() -> None:
        raise KeyError("x")

    assert lt.run(add(1, 2)) == 3
    with pytest.raises(KeyError):
        lt.run(boom())


def test_code_runs_on_the_loop_thread(lt: LoopThread) -> None:
    async def where() -> tuple[str, asyncio.AbstractEventLoop]:
        return threading.current_thread().name, asyncio.get_running_loop()

    name, loop = lt.run(where())
    assert name == "test-loop" and loop is lt.loop
    assert lt.call(lambda: threading.current_thread().name) == "test-loop"


def test_timeout_cancels_the_coroutine(lt: LoopThread) -> None:
    started = threading.Event()
    cancelled = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        lt.run(forever(), timeout=0.05)
    assert started.is_set()
    assert cancelled.wait(WAIT)


def test_many_threads_share_one_loop(lt: LoopThread) -> None:
    results: list[int] = []
    lock = threading.Lock()

    async def work(i: int) -> int:
        await asyncio.sleep(0)
        return i * i

    def worker(base: int) -> None:
        for i in range(base, base + 50):
            value = lt.run(work(i))
            with lock:
                results.append(value)

    threads = [threading.Thread(target=worker, args=(k * 50,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(results) == [i * i for i in range(400)]


def test_blocking_call_from_the_loop_thread_is_refused(lt: LoopThread) -> None:
    async def inner() -> int:
        return 1

    async def outer() -> None:
        lt.run(inner())

    with pytest.raises(RuntimeError, match="own event-loop thread"):
        lt.run(outer())


def test_iterate_drives_an_async_generator_and_closes_it(lt: LoopThread) -> None:
    closed = threading.Event()

    async def numbers() -> AsyncIterator[int]:
        try:
            for i in range(10):
                yield i
        finally:
            closed.set()

    assert list(lt.iterate(numbers())) == list(range(10))
    gen = numbers()
    closed.clear()
    for i in lt.iterate(gen, close=gen.aclose):
        if i == 2:
            break
    assert closed.wait(WAIT)


def test_stop_is_idempotent_and_final() -> None:
    thread = LoopThread("short").start()
    thread.stop()
    thread.stop()
    assert not thread.running

    async def one() -> int:
        return 1

    with pytest.raises(RuntimeError, match="stopped"):
        thread.run(one())


def test_stop_cancels_pending_tasks() -> None:
    thread = LoopThread("cancel").start()
    started = threading.Event()
    cancelled = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    thread.submit(forever())
    assert started.wait(WAIT)
    thread.stop()
    assert cancelled.is_set()


def shared_users() -> int:
    """Users of the shared loop thread right now (0 when none runs)."""
    return loop_thread.shared_users()


def test_shared_is_reference_counted() -> None:
    # relative to what is there already: another test (or a facade still open) may hold it
    before = shared_users()
    a = loop_thread.shared()
    b = loop_thread.shared()
    try:
        assert a is b and a.running
        assert shared_users() == before + 2
    finally:
        loop_thread.release_shared(a)
    assert b.running and shared_users() == before + 1
    loop_thread.release_shared(b)
    assert shared_users() == before
    assert a.running == (before > 0)  # only the last user stops it


def test_the_last_release_stops_the_shared_thread_and_a_new_one_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a clean slate whatever earlier tests left: monkeypatch restores their thread after
    monkeypatch.setattr(loop_thread, "_shared", None)
    monkeypatch.setattr(loop_thread, "_shared_users", 0)
    a = loop_thread.shared()
    b = loop_thread.shared()
    loop_thread.release_shared(a)
    assert b.running
    loop_thread.release_shared(b)
    assert not a.running and loop_thread._shared is None
    c = loop_thread.shared()
    try:
        assert c is not a and c.running
    finally:
        loop_thread.release_shared(c)
    assert not c.running


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="needs fork")
def test_a_forked_child_gets_its_own_loop_thread() -> None:
    parent = loop_thread.shared()
    try:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: the parent's thread does not exist here
            code = 1
            try:
                async def one() -> int:
                    return 1

                try:
                    parent.run(one())
                except RuntimeError:
                    child = loop_thread.shared()
                    if child is not parent and child.run(one()) == 1:
                        code = 0
                    loop_thread.release_shared(child)
            finally:
                os.write(write_fd, bytes([code]))
                os._exit(code)
        os.close(write_fd)
        result = os.read(read_fd, 1)
        os.close(read_fd)
        os.waitpid(pid, 0)
        assert result == b"\x00"
    finally:
        loop_thread.release_shared(parent)
