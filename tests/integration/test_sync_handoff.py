"""The sync producer's cross-thread hand-off: task-free publishes, batched wake-ups, closing.

``sync.Producer.publish`` hands the loop a plain function calling ``publish_nowait`` through
``LoopThread.call_future``; these tests pin what must not change with that: argument errors
reach the caller as the async layer raises them, concurrent publishes are all acknowledged and
stored, and nothing queued or issued after ``close()`` hangs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from support import WAIT, BackgroundCluster

from smartnsq import PublishResult, sync
from smartnsq.errors import InvalidArgument
from smartnsq.transport.loop_thread import LoopThread


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(1, {"handoff": 1, "pair": 2}, WAIT)
    yield background
    background.stop()


def _error_of(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as exc:  # compared by the caller
        return exc
    raise AssertionError("no exception")


def test_invalid_arguments_raise_the_async_layers_invalid_argument(
        bg: BackgroundCluster) -> None:
    bad: list[dict[str, Any]] = [
        {"topic": "bad topic", "body": b"x"},
        {"topic": "handoff", "body": b""},
        {"topic": "handoff", "body": "not bytes"},
        {"topic": "handoff", "body": b"x", "partition": 0, "sharding_key": "k"},
        {"topic": "handoff", "body": b"x", "trace_id": -1},
        {"topic": "handoff", "body": b"x", "timeout": 0},
        {"topic": "handoff", "body": b"x", "timeout": "soon"},
        {"topic": "pair", "body": b"x", "partition": 5},  # known only from the routes
    ]
    with sync.Producer(lookupd=bg.lookupd) as producer:
        producer.publish("pair", b"warm-up")  # routes known: partition=5 fails on the loop
        for kwargs in bad:
            args = dict(kwargs)
            topic, body = args.pop("topic"), args.pop("body")
            got = _error_of(partial(producer.publish, topic, body, **args))

            async def direct(topic: str = topic, body: bytes = body,
                             args: dict[str, Any] = args) -> PublishResult:
                return await producer.async_producer.publish(topic, body, **args)

            expected = _error_of(lambda: producer.loop_thread.run(direct(), WAIT))
            assert isinstance(got, InvalidArgument), kwargs
            assert (type(got), str(got), got.field) == \
                (type(expected), str(expected), expected.field)  # type: ignore[attr-defined]
        assert producer.publish("handoff", b"still fine").partition == 0
    assert [m.body for m in bg.messages("handoff", 0)] == [b"still fine"]
    assert [m.body for m in bg.messages("pair", 0) + bg.messages("pair", 1)] == [b"warm-up"]


def test_eight_threads_publishing_at_once_are_all_acknowledged_and_stored(
        bg: BackgroundCluster) -> None:
    per_thread = 500
    results: list[list[PublishResult]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)
    with sync.Producer(lookupd=bg.lookupd) as producer:
        def work(worker: int) -> None:
            try:
                start.wait(WAIT)
                for i in range(per_thread):
                    results[worker].append(
                        producer.publish("handoff", b"t%d-%d" % (worker, i)))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(3 * WAIT)
        assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert all(len(mine) == per_thread for mine in results)
    stored = bg.messages("handoff", 0)
    assert len(stored) == 8 * per_thread
    for worker, mine in enumerate(results):
        assert all(isinstance(r, PublishResult) and r.partition == 0 for r in mine)
        bodies = [m.body for m in stored if m.body.startswith(b"t%d-" % worker)]
        assert bodies == [b"t%d-%d" % (worker, i) for i in range(per_thread)]


def test_close_fails_the_calls_still_queued_promptly(bg: BackgroundCluster) -> None:
    lt = LoopThread("handoff-close").start()
    try:
        producer = sync.Producer(lookupd=bg.lookupd, loop_thread=lt)
        producer.publish("handoff", b"warm-up")
        n = 6
        queued = threading.Semaphore(0)
        closing = threading.Event()
        release = threading.Event()
        # test hooks on this instance: tell when a call is queued, and when close() reaches
        # the loop (the loop is held meanwhile, so the queued calls cannot start)
        wait, run = lt.wait, lt.run

        def counting_wait(future: Any, timeout: float | None = None) -> Any:
            queued.release()
            return wait(future, timeout)

        def signalling_run(coro: Any, timeout: float | None = None) -> Any:
            closing.set()
            return run(coro, timeout)

        lt.wait = counting_wait  # type: ignore[method-assign]
        lt.run = signalling_run  # type: ignore[method-assign]
        lt.call_soon(release.wait, WAIT)  # hold the loop thread

        outcomes: list[BaseException | PublishResult] = []

        def publish(i: int) -> None:
            try:
                outcomes.append(producer.publish("handoff", b"queued-%d" % i))
            except BaseException as exc:  # checked below
                outcomes.append(exc)

        publishers = [threading.Thread(target=publish, args=(i,)) for i in range(n)]
        for t in publishers:
            t.start()
        for _ in range(n):
            assert queued.acquire(timeout=WAIT)
        assert len(lt._queue) == n  # one wake-up pending for the whole batch
        closer = threading.Thread(target=producer.close)
        closer.start()
        assert closing.wait(WAIT)
        release.set()
        for t in (*publishers, closer):
            t.join(WAIT)
            assert not t.is_alive()
        assert len(outcomes) == n
        for outcome in outcomes:
            assert isinstance(outcome, RuntimeError) and "closed" in str(outcome)
        assert [m.body for m in bg.messages("handoff", 0)] == [b"warm-up"]
    finally:
        lt.stop()


def test_a_call_after_close_fails(bg: BackgroundCluster) -> None:
    producer = sync.Producer(lookupd=bg.lookupd)
    assert producer.publish("handoff", b"before").partition == 0
    producer.close()
    with pytest.raises(RuntimeError, match="closed"):
        producer.publish("handoff", b"after")
    with pytest.raises(RuntimeError, match="closed"):
        producer.publish_many("handoff", [b"after"])
    assert [m.body for m in bg.messages("handoff", 0)] == [b"before"]


def test_a_stopping_loop_thread_fails_queued_and_later_calls() -> None:
    lt = LoopThread("handoff-stop").start()
    release = threading.Event()
    lt.call_soon(release.wait, WAIT)  # hold the loop thread so the call stays queued

    def never() -> asyncio.Future[int]:
        return asyncio.get_running_loop().create_future()

    queued = lt.call_future(never)
    stopper = threading.Thread(target=lt.stop)
    stopper.start()
    release.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    with pytest.raises((RuntimeError, asyncio.CancelledError)):
        queued.result(WAIT)
    with pytest.raises(RuntimeError, match="stopped"):
        lt.call_future(never)


def test_call_future_copies_results_and_errors_and_cancels_on_timeout() -> None:
    lt = LoopThread("handoff-unit").start()
    try:
        def ready(value: int) -> asyncio.Future[int]:
            future = asyncio.get_running_loop().create_future()
            future.set_result(value)
            return future

        def refuse() -> asyncio.Future[int]:
            raise InvalidArgument("x", "refused here")

        pending: list[asyncio.Future[int]] = []
        started = threading.Event()

        def hang() -> asyncio.Future[int]:
            future = asyncio.get_running_loop().create_future()
            pending.append(future)
            started.set()
            return future

        assert lt.wait(lt.call_future(ready, 7), WAIT) == 7
        with pytest.raises(InvalidArgument, match="refused here"):
            lt.wait(lt.call_future(refuse), WAIT)
        hanging = lt.call_future(hang)
        assert started.wait(WAIT)
        with pytest.raises(TimeoutError):
            lt.wait(hanging, 0.01)
        assert hanging.cancelled()
        assert lt.call(lambda: pending[0].cancelled())  # runs after the abandon callback
    finally:
        lt.stop()
