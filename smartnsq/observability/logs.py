"""The library's logging: what a program that configures nothing sees, and repeats held back.

Every logger is a child of ``"smartnsq"`` (docs/logging.md lists them and what each level
says). Two things are installed when ``smartnsq`` is imported (:func:`install`):

* **A fallback handler on "smartnsq"** (:class:`Fallback`). A program that configures no
  logging at all sees the library's WARNING and ERROR records on stderr, each line naming its
  logger (``WARNING smartnsq.consumer: ...``), and nothing below WARNING. Python's own last
  resort would print the bare message, without saying who spoke. As soon as the program
  configures logging (a handler on the root logger, ``logging.basicConfig``, pytest's
  ``caplog``, or any handler on a ``smartnsq`` logger) the fallback stays silent and records go
  where the program sends them, at the levels it chose.
* **A repeat filter on each library logger** (:class:`RepeatFilter`): an identical WARNING
  or ERROR (same logger, level, text and arguments) logged again within ``window`` seconds
  (10) is held back and counted; the next one after the window carries the count
  (``... [and 41 more like this in the last 10.0 s]``). Loops that fail the same way many
  times a second (a dead node retried, a lookupd down) cost one line per window, not a flood.
  Lower levels are never held back, and neither are records whose text differs.

``logging.getLogger("smartnsq").removeHandler(smartnsq.observability.logs.FALLBACK)`` turns the
fallback off; :func:`reset` forgets the repeats seen so far (tests).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

__all__ = ["FALLBACK", "LOGGERS", "Fallback", "RepeatFilter", "install", "reset", "summary"]

LOGGERS = (
    "smartnsq",
    "smartnsq.admin",
    "smartnsq.cli",
    "smartnsq.compat",
    "smartnsq.compat.pynsq",
    "smartnsq.connection",
    "smartnsq.consumer",
    "smartnsq.devcluster",
    "smartnsq.devcluster.admin",
    "smartnsq.devcluster.channels",
    "smartnsq.devcluster.chaos",
    "smartnsq.devcluster.cluster",
    "smartnsq.devcluster.faults",
    "smartnsq.devcluster.httpserver",
    "smartnsq.devcluster.lookupd",
    "smartnsq.devcluster.nsqd",
    "smartnsq.devcluster.proxy",
    "smartnsq.http",
    "smartnsq.lookup",
    "smartnsq.otel",
    "smartnsq.pool",
    "smartnsq.producer",
    "smartnsq.prometheus",
    "smartnsq.rdy",
    "smartnsq.realcluster",
    "smartnsq.spark",
    "smartnsq.sync",
    "smartnsq.trace",
)
"""Every logger the library uses (``getLogger("smartnsq...")`` in its sources; a test keeps
this list and docs/logging.md in step with them)."""

FORMAT = "%(levelname)s %(name)s: %(message)s"

clock = time.monotonic
"""The repeat filter's clock (tests replace it)."""


def summary(exc: BaseException) -> str:
    """An exception in one line: ``Type: first line of its message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


class RepeatFilter(logging.Filter):
    """Holds back a WARNING/ERROR identical to one let through less than ``window`` seconds
    ago, and counts it; the next one let through says how many were held back."""

    def __init__(self, window: float = 10.0, max_keys: int = 2048) -> None:
        super().__init__()
        self.window = window
        self.max_keys = max_keys
        self._seen: dict[tuple[Any, ...], list[float]] = {}  # key -> [passed at, held back]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        try:
            key = (record.name, record.levelno, str(record.msg), repr(record.args))
        except Exception:  # an argument whose repr fails: never hold that back
            return True
        now = clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window:
                seen[1] += 1
                return False
            held = int(seen[1]) if seen is not None else 0
            if len(self._seen) >= self.max_keys:
                self._forget(now)
            self._seen[key] = [now, 0]
        if held:
            record.msg = (f"{record.getMessage()} [and {held} more like this in the last "
                          f"{now - seen[0]:.1f} s]")  # type: ignore[index]
            record.args = None
        return True

    def _forget(self, now: float) -> None:
        stale = [k for k, (at, _) in self._seen.items() if now - at >= self.window]
        for key in stale:
            del self._seen[key]
        if len(self._seen) >= self.max_keys:  # all recent: drop the oldest half
            for key in sorted(self._seen, key=lambda k: self._seen[k][0])[:self.max_keys // 2]:
                del self._seen[key]

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()


class Fallback(logging.Handler):
    """WARNING and above on stderr, naming the logger, only while nothing else is configured
    to handle the record (no root handler, no other handler on its way up to "smartnsq")."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(FORMAT))

    def _configured(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers:
            return True
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return True
            if not logger.propagate or logger.name == "smartnsq":
                return False
            logger = logger.parent
        return False

    def handle(self, record: logging.LogRecord) -> bool:
        if self._configured(record):
            return False
        return bool(super().handle(record))

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr  # looked up now: a program (or pytest) may have replaced it
        if stream is None:
            return
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


FALLBACK = Fallback()
REPEATS = RepeatFilter()
_installed = False


def install() -> None:
    """Put the fallback handler on "smartnsq" and the repeat filter on every library logger
    (once; ``import smartnsq`` does it)."""
    global _installed
    if _installed:
        return
    _installed = True
    root = logging.getLogger("smartnsq")
    if FALLBACK not in root.handlers:
        root.addHandler(FALLBACK)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if REPEATS not in logger.filters:
            logger.addFilter(REPEATS)


def reset() -> None:
    """Forget the repeats seen so far."""
    REPEATS.reset()
