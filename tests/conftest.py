"""Suite-wide checks.

This file also makes ``tests/`` (and ``docs/``, for its reference tooling) importable (pytest puts a
rootless conftest's directory on ``sys.path``), which is how test modules reach the shared helpers
in ``tests/support.py``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

# the docs' tooling (docs/reference.py renders the configuration and error references) is
# tested with the code it reads; it is not part of the installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))

from smartnsq.transport import loop_thread

# the nsq_cluster fixtures: opt-in, as for any project using them (docs/devcluster.md)
pytest_plugins = ["smartnsq.testing.pytest_plugin"]

FAIL_ON_SHARED_LOOP_LEAK = True
"""Flip to True once every suite releases what it takes: a leak then fails the test that
left it instead of only warning (compat's suites still leak; their owner is on it)."""


class SharedLoopLeak(UserWarning):
    """A test returned with more users of the shared loop thread than it started with."""


def shared_loop_users() -> int:
    """Users of the process-wide loop thread, 0 when none is running."""
    return loop_thread.shared_users()


@pytest.fixture(autouse=True)
def _shared_loop_balance(request: pytest.FixtureRequest) -> Iterator[None]:
    """Report a test that takes the shared loop thread (``loop_thread.shared()``) and never
    gives it back: that thread then outlives the test and skews every later count."""
    before = shared_loop_users()
    yield
    after = shared_loop_users()
    if after > before:
        message = (f"{request.node.nodeid} left {after - before} extra user(s) of the shared "
                   f"loop thread ({before} -> {after}): a sync facade was not closed")
        if FAIL_ON_SHARED_LOOP_LEAK:
            pytest.fail(message)
        warnings.warn(SharedLoopLeak(message), stacklevel=1)
