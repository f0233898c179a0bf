"""The event loops pynsq's handlers and callbacks run on (part of :mod:`smartnsq.compat.pynsq`).

Which loop a Reader or Writer binds to (the thread's current one when it is built, as pynsq
binds to ``IOLoop.current()``), how the last user of a loop the layer created closes it, the
mailboxes that hand calls from the network thread to a loop in one wake-up per batch, and the
wake-up that lets a signal end an idle ``run()``. ``run()``, ``stop()`` and the objects using
these are in :mod:`smartnsq.compat.pynsq`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "Mailbox", "UserLoop", "loops", "loops_lock", "mailbox", "mailboxes", "release_user_loop",
    "running_loops", "set_loop", "signals_wake", "stopping_loops", "user_entry", "user_loop",
]

log = logging.getLogger("smartnsq.compat.pynsq")


class UserLoop:
    """A loop Readers/Writers of one thread were built on, and how many of them (and run()
    calls) use it.

    The last one to let go drops it from ``loops``; a loop this module created is then
    closed and, on its own thread, unset as the thread's event loop (a loop the thread had
    already, e.g. tornado's, is left as it was).
    """

    __slots__ = ("ident", "loop", "owned", "users")

    def __init__(self, ident: int, loop: asyncio.AbstractEventLoop, owned: bool) -> None:
        self.ident = ident
        self.loop = loop
        self.owned = owned
        self.users = 0


# the loops in use, by thread then loop: a thread may have several over time (tornado's
# AsyncTestCase makes a new one current for each test), each object keeps the one it was
# built on
loops: dict[int, dict[asyncio.AbstractEventLoop, UserLoop]] = {}
loops_lock = threading.RLock()
# loops asked to stop by stop(): their mailboxes hand nothing more to handlers until the next
# run(), so a handler calling stop() is the last one to run (the rest waits, or goes back to
# the server on close())
stopping_loops: set[asyncio.AbstractEventLoop] = set()
running_loops: set[asyncio.AbstractEventLoop] = set()  # loops inside run()


class _NoSetLoop(Exception):
    """Raised by the probe in :func:`set_loop` instead of creating a loop."""


_probe_lock = threading.Lock()


def set_loop() -> asyncio.AbstractEventLoop | None:
    """The calling thread's set event loop, without creating one.

    The policy's ``get_event_loop()`` answers it, except that on the main thread it creates
    and sets a new loop when none was ever set (Python 3.10-3.13; later versions raise). So
    for the duration of the question, the policy's ``new_event_loop`` refuses on this thread
    (other threads calling it meanwhile get the policy's own): only public policy methods
    are used, whatever the policy (asyncio's, uvloop's, tornado's).
    """
    policy = asyncio.get_event_loop_policy()
    me = threading.get_ident()
    with _probe_lock:
        original = policy.new_event_loop
        own = vars(policy).get("new_event_loop")  # someone's instance attribute: kept

        def new_event_loop() -> asyncio.AbstractEventLoop:
            if threading.get_ident() == me:
                raise _NoSetLoop
            return original()

        policy.new_event_loop = new_event_loop  # type: ignore[method-assign]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return policy.get_event_loop()
        except (_NoSetLoop, RuntimeError):
            return None
        finally:
            if own is None:
                del policy.new_event_loop  # the class's method again
            else:
                policy.new_event_loop = own  # type: ignore[method-assign]


def user_entry(acquire: bool = False) -> UserLoop:
    """The calling thread's current loop, asked anew each time, as pynsq asks
    ``IOLoop.current()`` for each Reader/Writer: the running one, else the thread's set one,
    else a new one this module owns (and sets as the thread's, so the next object shares it).

    Never a loop remembered from an earlier call: a program (a test case) that makes another
    loop current expects what it builds next to run there."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    ident = threading.get_ident()
    with loops_lock:
        owned = False
        loop = running or set_loop()
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            owned = True
        entries = loops.setdefault(ident, {})
        entry = entries.get(loop)
        if entry is None:
            entry = entries[loop] = UserLoop(ident, loop, owned)
        if acquire:
            entry.users += 1
        return entry


def user_loop() -> asyncio.AbstractEventLoop:
    return user_entry().loop


def release_user_loop(entry: UserLoop) -> None:
    """One user less; the last one cleans the loop up (see :class:`UserLoop`)."""
    with loops_lock:
        entry.users -= 1
        if entry.users > 0:
            return
        entries = loops.get(entry.ident)
        if entries is not None and entries.get(entry.loop) is entry:
            del entries[entry.loop]
            if not entries:
                del loops[entry.ident]
        mailboxes.pop(entry.loop, None)
        stopping_loops.discard(entry.loop)
        loop = entry.loop
        if not entry.owned or loop.is_running() or loop.is_closed():
            return  # running: the run() around it holds a use and releases it on return
        if threading.get_ident() == entry.ident and set_loop() is loop:
            asyncio.set_event_loop(None)
        loop.close()  # under the lock: a new user of this thread gets a fresh loop


@contextlib.contextmanager
def signals_wake(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Wake ``loop``'s selector when a signal arrives, wherever the OS delivers it.

    Python runs a signal's handler on the main thread once that thread executes bytecode
    again; an idle ``run()`` sits in ``select()`` with nothing due, and if the kernel gave the
    signal to another thread (the network loop's, say) nothing interrupts that ``select()``:
    SIGINT would be handled only when a message happened to arrive. A wake-up fd read by the
    loop is the C-level answer asyncio's own ``add_signal_handler`` uses. A wake-up fd someone
    installed already (asyncio's or tornado's signal handling) is left in place: only one can
    be set per process, and theirs wakes a loop too.
    """
    try:
        reader, writer = socket.socketpair()
    except OSError:
        yield
        return
    try:
        reader.setblocking(False)
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            yield
            return

        def drain() -> None:
            with contextlib.suppress(OSError):
                while reader.recv(4096):
                    pass

        try:
            loop.add_reader(reader.fileno(), drain)
        except NotImplementedError:  # a loop without add_reader (Windows' proactor)
            signal.set_wakeup_fd(-1)
            yield
            return
        try:
            yield
        finally:
            if not loop.is_closed():
                loop.remove_reader(reader.fileno())
            current = signal.set_wakeup_fd(-1)
            if current != writer.fileno():  # installed by someone during run(): theirs
                signal.set_wakeup_fd(current)
    finally:
        reader.close()
        writer.close()


class Mailbox:
    """Calls handed to one event loop from other threads, one wake-up per batch.

    ``call_soon_threadsafe`` per call writes to the loop's wake-up pipe every time; a burst
    of deliveries (or publishes, or FINs) crossing threads then costs a syscall and a loop
    iteration each. Here only the call that finds the mailbox empty wakes the loop, which then
    runs everything queued meanwhile (up to ``BATCH`` per iteration, to stay fair).
    """

    BATCH = 2048

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._armed = False
        self._lock = threading.Lock()

    def post(self, fn: Callable[..., object], *args: Any) -> bool:
        """Queue ``fn(*args)`` for the loop; False when the loop is closed (it will never
        run): the caller must then answer whoever waits for that call."""
        if self._loop.is_closed():
            return False
        self._items.append((fn, args))
        if self._armed:
            return True
        with self._lock:
            if self._armed:
                return True
            self._armed = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # closed meanwhile: nothing will run there any more
            with contextlib.suppress(ValueError):
                self._items.remove((fn, args))
            return False
        return True

    def _drain(self) -> None:
        with self._lock:
            self._armed = False
        items = self._items
        loop = self._loop
        for _ in range(min(len(items), self.BATCH)):
            if loop in stopping_loops:
                break  # stop() was called: the rest waits for the next run()
            fn, args = items.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("uncaught exception in %r", fn)
        if items and not self._armed:
            with self._lock:
                if self._armed:
                    return
                self._armed = True
            self._loop.call_soon(self._drain)


mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = \
    weakref.WeakKeyDictionary()


def mailbox(loop: asyncio.AbstractEventLoop) -> Mailbox:
    with loops_lock:
        box = mailboxes.get(loop)
        if box is None:
            box = mailboxes[loop] = Mailbox(loop)
        return box
