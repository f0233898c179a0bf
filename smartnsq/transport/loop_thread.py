"""``LoopThread``: a background thread running one asyncio event loop, for blocking facades.

Public because the blocking facades (:mod:`smartnsq.sync`, :class:`smartnsq.admin.Admin`,
:mod:`smartnsq.compat.pynsq`) take one as ``loop_thread=`` and because code mixing blocking and
async use of smartnsq needs to run its own coroutines on the same loop.

The blocking API is the async one driven from another thread: every call hands a coroutine to
the loop thread and waits for its result, so there is one implementation of the logic and the
loop keeps doing what makes it fast (write coalescing, one timer per connection) for every
calling thread at once. Calls from many threads are safe: the only cross-thread steps are
``asyncio.run_coroutine_threadsafe`` and ``call_soon_threadsafe``.

``shared()`` hands out one process-wide loop thread, reference-counted, so a process with a
sync producer and a sync consumer (or many of each) runs one loop, not one per object. After a
``fork`` (Spark's Python workers, gunicorn's pre-fork model) the child gets a fresh loop thread
on first use: the parent's thread does not exist in the child and its loop state is unusable.

Calling a blocking method from inside the loop thread would wait for itself for ever; it raises
``RuntimeError`` instead (a callback given to the async layer must use the async API).

Hot calls (the sync producer's publish) skip the coroutine and the Task: ``call_future(fn,
...)`` queues a plain function that starts the work and returns an asyncio future, whose
outcome is copied into a ``concurrent.futures.Future``. The queue is drained by one loop
callback per batch (only the enqueue that finds it empty wakes the loop), so many threads
calling at once cost one self-pipe write per loop iteration, not one per call.

The hottest call of all goes further: ``call_slot(fn, ...)`` hands ``fn`` a :class:`Slot`, an
answer slot with the settling side of an asyncio future (``done``, ``set_result``,
``set_exception``, ``cancel``, ``add_done_callback``) over one lock the calling thread blocks
on. The async work settles it directly where the answer is read, so the caller wakes in that
same loop step: no asyncio future, no done callback scheduled for the next loop turn, no
``concurrent.futures.Future`` (whose condition variable allocates a lock per wait).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from functools import partial
from typing import Any, Generic, TypeVar

from ..errors import LoopTimeout
from . import event_loop

_WAIT_MAX = min(threading.TIMEOUT_MAX, 2.0 ** 31)  # seconds: decades, and no overflow

__all__ = ["LoopThread", "Slot", "release_shared", "shared", "shared_users"]

log = logging.getLogger("smartnsq.sync")

T = TypeVar("T")

_STOP_GRACE = 5.0
_forks = 0  # how many fork()s led to this process (counted in the child: register_at_fork)


class _Call(concurrent.futures.Future[T]):
    """One queued ``call_future``: its function and, once started, the future it returned."""

    def __init__(self, fn: Callable[..., asyncio.Future[T]], args: tuple[Any, ...],
                 kwargs: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.loop = loop
        self.source: asyncio.Future[T] | None = None

    def cancel(self) -> bool:
        """Cancel the result and the work (the drain skips a call not started yet)."""
        if not super().cancel():
            return False
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs any more
            self.loop.call_soon_threadsafe(self._cancel_source)
        return True

    def _cancel_source(self) -> None:  # (on the loop: a done future ignores the cancel)
        if self.source is not None:
            self.source.cancel()

    def settle(self, source: asyncio.Future[T]) -> None:
        """Copy the asyncio future's outcome (a done callback, on the loop thread)."""
        # the outcome is read even when nobody waits any more (no "never retrieved" warning)
        error = None if source.cancelled() else source.exception()
        try:
            if source.cancelled():
                concurrent.futures.Future.cancel(self)  # (the work is over: nothing to abandon)
            elif not self.set_running_or_notify_cancel():
                return  # the caller cancelled (gave up) meanwhile
            elif error is not None:
                self.set_exception(error)
            else:
                self.set_result(source.result())
        except (concurrent.futures.InvalidStateError, RuntimeError):
            pass  # failed by stop() meanwhile

    def fail(self, error: BaseException) -> None:
        """Fail from any thread, unless already settled or cancelled."""
        try:
            if self.set_running_or_notify_cancel():
                self.set_exception(error)
        except (concurrent.futures.InvalidStateError, RuntimeError):
            pass  # settled meanwhile


_PENDING, _FINISHED, _CANCELLED = 0, 1, 2


class Slot(Generic[T]):
    """One ``call_slot`` call: the function to start on the loop, and the answer slot it is
    given, settled on the loop thread and waited on by the calling thread.

    The loop side is the part of ``asyncio.Future`` that producing code uses to settle a
    future it was handed: ``done``, ``cancelled``, ``set_result``, ``set_exception``,
    ``cancel``, ``add_done_callback`` (callbacks run at once, on the loop thread, when it
    settles). The calling side is ``LoopThread.wait``. Settling releases the lock the caller
    blocks on, so the caller wakes as soon as the loop settles it.
    """

    __slots__ = ("args", "callbacks", "error", "fn", "lock", "running", "state", "value")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.lock = threading.Lock()
        self.lock.acquire()  # released once, when settled
        self.state = _PENDING
        self.value: T | None = None
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[Slot[T]], object]] | None = None
        self.running: set[Any] | None = None  # the loop thread's started calls, once started

    # -- the loop's side (asyncio.Future's settling API) ---------------------------------

    def done(self) -> bool:
        return self.state != _PENDING

    def cancelled(self) -> bool:
        return self.state == _CANCELLED

    def set_result(self, value: T, /) -> None:
        if self.state:
            raise asyncio.InvalidStateError("the slot is already settled")
        self.value = value
        self._settle(_FINISHED)

    def set_exception(self, error: BaseException | type[BaseException], /) -> None:
        if self.state:
            raise asyncio.InvalidStateError("the slot is already settled")
        self.error = error() if isinstance(error, type) else error
        self._settle(_FINISHED)

    def cancel(self, msg: object = None) -> bool:
        if self.state:
            return False
        self._settle(_CANCELLED)
        return True

    def add_done_callback(self, fn: Callable[[Slot[T]], object], *,
                          context: object = None) -> None:
        if self.state:
            fn(self)
        elif self.callbacks is None:
            self.callbacks = [fn]
        else:
            self.callbacks.append(fn)

    def fail(self, error: BaseException) -> None:
        """Fail unless settled (the loop thread is stopping: nothing else will settle it)."""
        if not self.state:
            self.error = error
            self._settle(_FINISHED)

    def _settle(self, state: int) -> None:
        self.state = state
        running = self.running
        if running is not None:
            running.discard(self)
        self.lock.release()
        callbacks = self.callbacks
        if callbacks:
            self.callbacks = None
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    log.exception("a slot's done callback raised")

    # -- the caller's side ------------------------------------------------------------------

    def outcome(self) -> T:
        """The value, or raise the error (settled slots only)."""
        if self.state == _CANCELLED:
            raise concurrent.futures.CancelledError()
        error = self.error
        if error is not None:
            raise error
        return self.value  # type: ignore[return-value]


class LoopThread:
    """A daemon thread running an event loop; start it with ``start()`` (or use ``shared()``)."""

    def __init__(self, name: str = "smartnsq-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # forks seen in this process line when created: a blocking call compares it, not the
        # pid (os.getpid() is a system call per publish), and a forked child's count differs
        self._forks = _forks
        self._lock = threading.Lock()
        self._stopped = False
        # call_future(): queued calls, whether a drain is scheduled, the started ones not done
        self._queue: deque[_Call[Any] | Slot[Any]] = deque()
        self._drain_scheduled = False
        self._running_calls: set[_Call[Any] | Slot[Any]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> LoopThread:
        """Start the thread (idempotent); returns self once the loop runs."""
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"{self.name}: a stopped LoopThread cannot start again")
            if self._thread is not None:
                return self
            started = threading.Event()
            loop = event_loop.new_event_loop()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                try:
                    loop.run_forever()
                finally:
                    try:
                        self._fail_calls()
                        _cancel_remaining(loop)
                        loop.run_until_complete(loop.shutdown_asyncgens())
                    finally:
                        loop.close()
                        self._fail_calls()

            thread = threading.Thread(target=main, name=self.name, daemon=True)
            thread.start()
            started.wait()
            self._loop = loop
            self._thread = thread
            return self

    def stop(self, timeout: float = _STOP_GRACE) -> None:
        """Cancel what still runs on the loop, stop it and join the thread (idempotent)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None or not self._alive():
            if self._pid == os.getpid():
                self._fail_calls()
            return
        if threading.current_thread() is thread:
            loop.call_soon(loop.stop)  # cannot join ourselves; the thread ends after this step
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # the loop died (SystemExit in a call): its thread is ending
            self._fail_calls()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("%s: loop thread did not stop within %gs", self.name, timeout)

    def _alive(self) -> bool:
        return (self._pid == os.getpid() and self._thread is not None
                and self._thread.is_alive())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started on first access)."""
        if self._loop is None:
            self.start()
        assert self._loop is not None
        return self._loop

    @property
    def running(self) -> bool:
        return not self._stopped and self._alive()

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _check(self) -> asyncio.AbstractEventLoop:
        if self._forks != _forks and self._pid != os.getpid():
            raise RuntimeError(f"{self.name}: this loop thread belongs to the parent process; "
                               "objects created before fork() cannot be used in the child")
        if self._stopped:
            raise RuntimeError(f"{self.name}: the loop thread is stopped")
        loop = self.loop
        if self.in_loop_thread():
            raise RuntimeError("a blocking smartnsq call was made on its own event-loop thread "
                               "(from a callback?); use the async API there")
        return loop

    # -- calls --------------------------------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the returned future is safe to wait on from any thread."""
        try:
            loop = self._check()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes (or ``timeout`` s pass).

        On timeout (:class:`LoopTimeout`), or when the waiting thread is interrupted
        (``KeyboardInterrupt``), the coroutine is cancelled on the loop before the exception
        propagates. What the coroutine raises (its own ``Timeout`` included) is raised as is.
        """
        return self.wait(self.submit(coro), timeout)

    def call_future(self, fn: Callable[..., asyncio.Future[T]], /, *args: Any,
                    **kwargs: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` on the loop (it returns an asyncio future) and return a
        ``concurrent.futures.Future`` of that future's outcome, without a coroutine or a Task.

        What ``fn`` raises fails the returned future with that very exception. Cancelling the
        returned future cancels the asyncio future (or, not started yet, skips ``fn``). When
        the loop thread stops first, the future fails with ``RuntimeError``.
        """
        loop = self._check()
        call: _Call[T] = _Call(fn, args, kwargs, loop)
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"{self.name}: the loop thread is stopped")
            self._queue.append(call)
            if self._drain_scheduled:
                return call
            self._drain_scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed meanwhile (stopped from its own thread)
            self._fail_calls()
        return call

    def call_slot(self, fn: Callable[..., object], /, *args: Any) -> Slot[Any]:
        """Run ``fn(*args, slot)`` on the loop and return the :class:`Slot` it settles; wait
        for it with ``wait(slot, timeout)``. What ``fn`` raises fails the slot. Queued and
        woken like ``call_future`` (one wake-up per batch); a slot still pending when the loop
        thread stops fails with ``RuntimeError``."""
        loop = self._check()
        slot: Slot[Any] = Slot(fn, args)
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"{self.name}: the loop thread is stopped")
            self._queue.append(slot)
            if self._drain_scheduled:
                return slot
            self._drain_scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed meanwhile (stopped from its own thread)
            self._fail_calls()
        return slot

    def wait(self, future: concurrent.futures.Future[T] | Slot[T],
             timeout: float | None = None) -> T:
        """Wait for a ``submit``/``call_future`` result; on timeout or interruption cancel the
        work first. What the call raised is raised as is; :class:`LoopTimeout` only when the
        call did not finish within ``timeout``."""
        # ``result(timeout)`` waits on the future's own condition; ``concurrent.futures.wait``
        # built a waiter and a lock per call, a quarter of the facade's CPU per publish. The
        # call's own errors include timeouts (smartnsq's Timeout is a TimeoutError, as
        # concurrent.futures' is), so a timeout is this wait's only when the future is not done
        if timeout is not None and timeout > _WAIT_MAX:
            timeout = _WAIT_MAX  # (a longer wait overflows the platform's lock timeout)
        if future.__class__ is Slot:
            return self._wait_slot(future, timeout)
        assert isinstance(future, concurrent.futures.Future)
        try:
            return future.result(timeout)
        except (concurrent.futures.TimeoutError, TimeoutError):
            if future.done():
                return future.result()  # the call's own Timeout, raised as is
            self.abandon(future)
            raise LoopTimeout(f"no result within {timeout:g}s") from None
        except BaseException:
            if not future.done():  # interrupted (KeyboardInterrupt): give the work up
                self.abandon(future)
            raise

    def _wait_slot(self, slot: Slot[T], timeout: float | None) -> T:
        try:
            settled = slot.lock.acquire(True, -1 if timeout is None else timeout)
        except BaseException:  # interrupted (KeyboardInterrupt): give the work up
            self.abandon(slot)
            raise
        if not settled:
            self.abandon(slot)
            raise LoopTimeout(f"no result within {timeout:g}s")
        return slot.outcome()

    def abandon(self, future: concurrent.futures.Future[Any] | Slot[Any]) -> None:
        """Give up on a ``call_future`` result: cancel it, and the work on the loop."""
        loop = self._loop
        if future.__class__ is not Slot:  # (a call_future's cancel cancels its work too)
            future.cancel()
        elif loop is not None and self.running:  # settled on the loop only: cancel it there
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(future.cancel)

    def _drain(self) -> None:
        """On the loop: start every queued call (one wake-up served the whole batch)."""
        with self._lock:
            self._drain_scheduled = False
            if not self._queue:
                return
            batch = self._queue
            self._queue = deque()
        running = self._running_calls
        while batch:
            call = batch.popleft()
            if call.cancelled():
                continue
            if isinstance(call, Slot):
                self._start_slot(call, batch)
                continue
            try:
                source = call.fn(*call.args, **call.kwargs)
            except (KeyboardInterrupt, SystemExit) as exc:
                call.fail(exc)
                for rest in batch:  # nothing else runs on this loop now: do not leave waiters
                    rest.fail(RuntimeError(f"{self.name}: the loop thread is stopping"))
                raise
            except BaseException as exc:
                call.fail(exc)
                continue
            call.source = source
            call.fn = _started  # drop the references to the arguments
            call.args = ()
            call.kwargs = {}
            running.add(call)
            source.add_done_callback(partial(_settled, running, call))

    def _start_slot(self, slot: Slot[Any], batch: deque[_Call[Any] | Slot[Any]]) -> None:
        try:
            slot.fn(*slot.args, slot)
        except (KeyboardInterrupt, SystemExit) as exc:
            slot.fail(exc)
            for rest in batch:  # nothing else runs on this loop now: do not leave waiters
                rest.fail(RuntimeError(f"{self.name}: the loop thread is stopping"))
            raise
        except BaseException as exc:
            slot.fail(exc)
        slot.fn = _started  # drop the references to the arguments
        slot.args = ()
        if not slot.state:  # in flight: failed if the loop stops before it settles
            slot.running = self._running_calls
            self._running_calls.add(slot)

    def _fail_calls(self) -> None:
        """Fail every queued or started call (the loop is stopping: nothing will settle them)."""
        with self._lock:
            batch, self._queue = self._queue, deque()
            self._drain_scheduled = False
            started = list(self._running_calls)
            self._running_calls.clear()
        error = RuntimeError(f"{self.name}: the loop thread is stopped")
        for call in (*batch, *started):
            call.fail(error)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run a plain function on the loop thread and return its result (for loop-bound state)."""
        async def wrapper() -> T:
            return fn(*args)

        return self.run(wrapper(), timeout)

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Fire and forget ``fn(*args)`` on the loop thread."""
        self._check().call_soon_threadsafe(fn, *args)

    def iterate(self, aiterator: AsyncIterator[T],
                close: Callable[[], Awaitable[object]] | None = None) -> Iterator[T]:
        """Drive an async iterator from this thread, one ``__anext__`` per item.

        ``close`` (e.g. the async generator's ``aclose``) runs on the loop when the blocking
        iteration ends early (``break``, an exception, garbage collection).
        """
        async def step() -> tuple[bool, T | None]:
            try:
                return True, await aiterator.__anext__()
            except StopAsyncIteration:
                return False, None

        finished = False
        try:
            while True:
                more, item = self.run(step())
                if not more:
                    finished = True
                    return
                yield item  # type: ignore[misc]
        finally:
            if not finished and close is not None and self.running:
                async def closer() -> None:
                    await close()

                try:
                    self.run(closer(), timeout=_STOP_GRACE)
                except Exception:
                    log.debug("%s: closing an async iterator failed", self.name, exc_info=True)


def _started(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a call_future function ran twice")


def _settled(running: set[_Call[Any] | Slot[Any]], call: _Call[Any],
             source: asyncio.Future[Any]) -> None:
    running.discard(call)
    call.settle(source)


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


# -- the process-wide shared loop thread ---------------------------------------------------------

_shared_lock = threading.Lock()
_shared: LoopThread | None = None
_shared_users = 0


def shared() -> LoopThread:
    """The process-wide loop thread, started if needed; pair every call with ``release_shared``."""
    global _shared, _shared_users
    with _shared_lock:
        if _shared is None or not _shared.running:
            _shared = LoopThread("smartnsq-loop").start()
            _shared_users = 0
        _shared_users += 1
        return _shared


def shared_users() -> int:
    """How many users hold the process-wide loop thread (0 when none runs); for leak checks."""
    with _shared_lock:
        if _shared is None or not _shared.running:
            return 0
        return _shared_users


def release_shared(loop_thread: LoopThread) -> None:
    """Give back a ``shared()`` loop thread; the last user stops it."""
    global _shared, _shared_users
    with _shared_lock:
        if loop_thread is not _shared:
            return  # a thread from before a fork, or already replaced
        _shared_users -= 1
        if _shared_users > 0:
            return
        _shared = None
    loop_thread.stop()


def _after_fork_in_child() -> None:
    global _shared, _shared_users, _shared_lock, _forks
    _forks += 1
    _shared_lock = threading.Lock()
    _shared = None
    _shared_users = 0


def _at_exit() -> None:
    with _shared_lock:
        thread = _shared
    if thread is not None:
        thread.stop(timeout=1.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
