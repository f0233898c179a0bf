"""Which loop smartnsq creates for itself (the sync facade's thread, the command line)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from smartnsq.transport import event_loop
from smartnsq.transport.loop_thread import LoopThread


def test_auto_takes_uvloop_only_when_installed() -> None:
    assert event_loop.choice("auto", uvloop_installed=True) == "uvloop"
    assert event_loop.choice("auto", uvloop_installed=False) == "asyncio"
    assert event_loop.choice("", uvloop_installed=True) == "uvloop"


def test_an_explicit_setting_wins() -> None:
    assert event_loop.choice("asyncio", uvloop_installed=True) == "asyncio"
    assert event_loop.choice(" UVLOOP ", uvloop_installed=False) == "uvloop"


def test_a_bad_setting_names_the_variable() -> None:
    with pytest.raises(ValueError, match="SMARTNSQ_EVENT_LOOP='tokio'"):
        event_loop.choice("tokio")


def test_the_environment_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert event_loop.choice() == "asyncio"
    loop = event_loop.new_event_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_run_runs_a_coroutine_on_the_chosen_loop() -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert event_loop.run(which(), "asyncio").startswith("asyncio")


uvloop_missing = importlib.util.find_spec("uvloop") is None


@pytest.mark.skipif(uvloop_missing, reason="uvloop is not installed (the fast extra)")
def test_the_loop_thread_runs_uvloop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    thread = LoopThread("test-uvloop").start()
    try:
        assert type(thread.loop).__module__.startswith("uvloop")
    finally:
        thread.stop()


@pytest.mark.skipif(not uvloop_missing, reason="uvloop is installed")
def test_asking_for_uvloop_without_it_says_how_to_install() -> None:
    with pytest.raises(ImportError, match=r"smartnsq\[fast\]"):
        event_loop.new_event_loop("uvloop")
