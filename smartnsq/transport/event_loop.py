"""Which event loop smartnsq creates itself: uvloop when it is installed, asyncio's otherwise.

smartnsq creates a loop in two places only: the sync facade's loop thread
(:class:`smartnsq.transport.loop_thread.LoopThread`) and the command line. Code that runs its own
loop (``asyncio.run``, ``uvloop.run``, a framework) keeps whatever loop it chose; smartnsq works on
either.

Why uvloop by default when present: measured on smartnsq's hot paths it cuts the user-space
instructions of a one-at-a-time publish or an ordered message to about 0.6 to 0.7 times and the CPU
per message by 12 to 35% (docs/performance.md, "uvloop"), and the sync facade, whose loop thread
wakes for every call, gains the most. It is an optional extra (``pip install smartnsq[fast]``),
so a plain install never imports it.

``SMARTNSQ_EVENT_LOOP`` overrides the choice: ``asyncio`` (always asyncio's loop), ``uvloop``
(uvloop or an ``ImportError`` saying how to install it), ``auto`` (the default).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["ENV", "choice", "factory", "new_event_loop", "run", "warn_if_blocking_a_loop"]

ENV = "SMARTNSQ_EVENT_LOOP"
_CHOICES = ("auto", "asyncio", "uvloop")


def choice(setting: str | None = None, *, uvloop_installed: bool | None = None) -> str:
    """The loop to create, ``"uvloop"`` or ``"asyncio"``, for a setting (default: the environment).

    A plain function of its inputs so that every branch is tested without installing or hiding
    uvloop.
    """
    if setting is None:
        setting = os.environ.get(ENV, "auto")
    setting = setting.strip().lower() or "auto"
    if setting not in _CHOICES:
        raise ValueError(f"{ENV}={setting!r}: expected one of {', '.join(_CHOICES)}")
    if setting != "auto":
        return setting
    if uvloop_installed is None:
        uvloop_installed = importlib.util.find_spec("uvloop") is not None
    return "uvloop" if uvloop_installed else "asyncio"


def factory(setting: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """The loop factory for ``setting``: for ``asyncio.Runner(loop_factory=...)`` and threads."""
    if choice(setting) == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ImportError(f"{ENV}=uvloop but uvloop is not installed: "
                          "pip install 'smartnsq[fast]'") from exc
    return uvloop.new_event_loop


def new_event_loop(setting: str | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop of the chosen kind (not set as the thread's current loop)."""
    return factory(setting)()


def run(coro: Coroutine[Any, Any, T], setting: str | None = None) -> T:
    """``asyncio.run(coro)`` on a loop of the chosen kind (the command line's entry point)."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory(setting)) as runner:
            return runner.run(coro)
    loop = new_event_loop(setting)  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def warn_if_blocking_a_loop(what: str, instead: str, frames: int = 1) -> None:
    """Warn (``RuntimeWarning``, once per calling line by Python's default filter) when a
    blocking facade is called on a thread that runs an event loop: the call works, but that
    loop stands still until it returns (0 ticks during 200 blocking publishes), which nothing
    else would show. Not an error: a notebook's cells run inside its kernel's loop, where
    blocking is what the user wants. ``instead``: the asynchronous call to use there;
    ``frames``: the facade's own frames between the user's line and this call."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # (the usual case: no loop on this thread)
    warnings.warn(f"{what} blocks the event loop running on this thread until it returns; "
                  f"in async code, {instead}", RuntimeWarning, stacklevel=2 + frames)
