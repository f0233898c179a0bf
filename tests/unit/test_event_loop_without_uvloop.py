"""``SMARTNSQ_EVENT_LOOP=uvloop`` on a machine without uvloop fails where the loop is made,
with an ``ImportError`` naming the variable and the extra to install, and chained to the
import's own error; ``auto`` then falls back to asyncio's loop. uvloop is hidden from the
import system here, so this holds whether or not it is installed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from smartnsq.transport import event_loop


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError


def test_asking_for_uvloop_without_it_names_the_variable_and_the_extra(no_uvloop: None) -> None:
    with pytest.raises(ImportError, match=r"SMARTNSQ_EVENT_LOOP=uvloop but uvloop is not "
                                          r"installed: pip install 'smartnsq\[fast\]'") as info:
        event_loop.factory("uvloop")
    assert isinstance(info.value.__cause__, ImportError)
    coro = asyncio.sleep(0)
    try:
        with pytest.raises(ImportError, match=r"smartnsq\[fast\]"):
            event_loop.run(coro, "uvloop")
    finally:
        coro.close()  # never started: the loop it was to run on could not be made


def test_the_environment_asking_for_uvloop_fails_the_same_way(
        no_uvloop: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, " UVLOOP ")
    with pytest.raises(ImportError, match=r"smartnsq\[fast\]"):
        event_loop.new_event_loop()


def test_auto_without_uvloop_runs_asyncios_loop(no_uvloop: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.choice() == "asyncio"
    assert event_loop.run(asyncio.sleep(0, "ran")) == "ran"
    loop = event_loop.new_event_loop("auto")
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()
