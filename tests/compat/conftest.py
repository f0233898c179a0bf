"""Fixtures of the compat suites: every pynsq Reader/Writer a test builds is closed after it.

A test that fails half-way would otherwise leave its Readers/Writers open: their users of the
shared loop thread, connections and run() loops would then leak into every later test.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from smartnsq.compat import pynsq as nsq

log = logging.getLogger("tests.compat")


class Built(list[Any]):
    """The Readers/Writers a test built, in order."""

    def close_all(self) -> None:
        """Close (idempotently) what the test built, newest first; never raises."""
        while self:
            obj = self.pop()
            try:
                result = obj.close()
                if isinstance(result, concurrent.futures.Future):
                    result.result(60)
            except Exception:
                log.exception("closing %r after the test failed", obj)


@pytest.fixture(autouse=True)
def pynsq_objects(monkeypatch: pytest.MonkeyPatch) -> Iterator[Built]:
    """Every ``nsq.Reader`` / ``nsq.Writer`` (and subclass) built during the test."""
    built = Built()
    for cls in (nsq.Reader, nsq.Writer):
        original = cls.__init__

        def recording(self: Any, *args: Any, __init: Any = original, **kwargs: Any) -> None:
            __init(self, *args, **kwargs)
            built.append(self)  # only what was built: a failed constructor took nothing

        monkeypatch.setattr(cls, "__init__", recording)
    yield built
    built.close_all()
