"""The library's logging at its edges (docs/logging.md): an exception summed up in one
line; the repeat filter never holds back a record whose arguments cannot be shown, and
keeps its table bounded (stale entries first, then the oldest half) without losing the
count of what it still remembers; the fallback prints WARNING and above naming the logger
only while nothing else handles the record, survives a missing or broken stderr, and
installing twice adds nothing twice."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from smartnsq.observability import logs


class Unprintable:
    def __repr__(self) -> str:
        raise ValueError("no repr")


def record(msg: str, *args: Any, level: int = logging.WARNING,
           name: str = "smartnsq.pool") -> logging.LogRecord:
    return logging.makeLogRecord({"name": name, "levelno": level,
                                  "levelname": logging.getLevelName(level), "msg": msg,
                                  "args": args})


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [100.0]
    monkeypatch.setattr(logs, "clock", lambda: clock[0])
    return clock


@pytest.mark.parametrize(("error", "line"), [
    (ValueError("bad value\nsecond line"), "ValueError: bad value"),
    (KeyError(), "KeyError"),
    (RuntimeError("   "), "RuntimeError"),
    (TimeoutError("  padded  "), "TimeoutError: padded"),
])
def test_summary_is_the_type_and_the_first_line(error: BaseException, line: str) -> None:
    assert logs.summary(error) == line


def test_a_record_whose_arguments_cannot_be_shown_is_never_held_back(now: list[float]) -> None:
    repeats = logs.RepeatFilter(window=10.0)
    assert [repeats.filter(record("node %s", Unprintable())) for _ in range(3)] \
        == [True, True, True]
    # below WARNING nothing is held back either, however often
    assert all(repeats.filter(record("x", level=logging.INFO)) for _ in range(3))


def test_a_full_table_forgets_stale_entries_first(now: list[float]) -> None:
    repeats = logs.RepeatFilter(window=10.0, max_keys=3)
    assert repeats.filter(record("old %d", 1))
    now[0] += 20  # "old 1" is stale from here on
    assert repeats.filter(record("recent %d", 2))
    assert repeats.filter(record("recent %d", 3))
    assert not repeats.filter(record("recent %d", 2))  # held back, counted
    assert repeats.filter(record("new %d", 4))  # the table is full: "old 1" goes
    # the recent entries survived, with their count
    assert not repeats.filter(record("recent %d", 3))
    now[0] += 10.5
    again = record("recent %d", 2)
    assert repeats.filter(again)
    assert again.getMessage() == "recent 2 [and 1 more like this in the last 10.5 s]"


def test_a_full_table_of_recent_entries_drops_the_oldest_half(now: list[float]) -> None:
    repeats = logs.RepeatFilter(window=10.0, max_keys=4)
    for i in range(4):
        assert repeats.filter(record("line %d", i))
        now[0] += 0.1
    assert not repeats.filter(record("line %d", 3))
    assert repeats.filter(record("line %d", 4))  # full, none stale: lines 0 and 1 go
    # the dropped ones pass at once, the kept ones are still held back
    assert repeats.filter(record("line %d", 0))
    assert not repeats.filter(record("line %d", 2))
    assert not repeats.filter(record("line %d", 3))
    repeats.reset()
    assert repeats.filter(record("line %d", 3))


def bare(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """A program that configured no logging (pytest's own root handlers taken away, which
    it adds as each test phase starts: call this in the test), with stderr captured."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    logs.reset()
    return stderr


def test_the_fallback_prints_warnings_naming_the_logger_when_nothing_is_configured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = bare(monkeypatch)
    logging.getLogger("smartnsq.consumer").warning("lost %d messages", 3)
    logging.getLogger("smartnsq.consumer").info("not shown")
    logging.getLogger("smartnsq.lookup").error("lookupd down")
    assert stderr.getvalue().splitlines() == ["WARNING smartnsq.consumer: lost 3 messages",
                                            "ERROR smartnsq.lookup: lookupd down"]


def test_a_handler_on_the_way_up_silences_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = bare(monkeypatch)
    caught = io.StringIO()
    handler = logging.StreamHandler(caught)
    pool = logging.getLogger("smartnsq.pool")
    pool.addHandler(handler)
    try:
        pool.warning("pool: configured")
        logging.getLogger("smartnsq.consumer").warning("consumer: not configured")
    finally:
        pool.removeHandler(handler)
    assert caught.getvalue() == "pool: configured\n"
    assert stderr.getvalue() == "WARNING smartnsq.consumer: consumer: not configured\n"
    # a handler on the root logger (logging.basicConfig...) takes everything over
    root = io.StringIO()
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.StreamHandler(root)])
    logging.getLogger("smartnsq.consumer").warning("consumer: configured now")
    assert root.getvalue() == "consumer: configured now\n"
    assert "configured now" not in stderr.getvalue()


def test_the_fallback_survives_a_missing_or_broken_stderr(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bare(monkeypatch)
    monkeypatch.setattr("sys.stderr", None)
    logging.getLogger("smartnsq.consumer").warning("nowhere to go")  # no error

    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("stderr closed")

    failures: list[logging.LogRecord] = []
    monkeypatch.setattr("sys.stderr", Broken())
    monkeypatch.setattr(logs.FALLBACK, "handleError", failures.append)
    logging.getLogger("smartnsq.consumer").warning("cannot be written")
    assert [r.getMessage() for r in failures] == ["cannot be written"]


def test_installing_again_adds_nothing_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    def counts() -> tuple[int, list[int]]:
        return (logging.getLogger("smartnsq").handlers.count(logs.FALLBACK),
                [logging.getLogger(name).filters.count(logs.REPEATS) for name in logs.LOGGERS])

    before = counts()
    assert before == (1, [1] * len(logs.LOGGERS))
    logs.install()  # once per process: a no-op
    monkeypatch.setattr(logs, "_installed", False)
    logs.install()  # even a second real run finds everything in place
    assert counts() == before
