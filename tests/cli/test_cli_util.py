"""The CLI's small pieces: addresses, tables, start positions, the progress line."""

from __future__ import annotations

import io

import pytest

from smartnsq.cli.tables import format_table
from smartnsq.cli.util import CLIError, Progress, bar, one_line, parse_start, split_addresses
from smartnsq.protocol.commands import StartPosition


def test_split_addresses() -> None:
    assert split_addresses(["a:1,b:2", " http://c:3/ "], "lookupd") == ["a:1", "b:2", "c:3"]
    assert split_addresses(None, "nsqd") == []
    assert split_addresses("[::1]:4161", "lookupd") == ["[::1]:4161"]
    for bad in ("nohost", ":4161", "h:0", "h:99999", "h:port"):
        with pytest.raises(CLIError, match="bad lookupd address"):
            split_addresses([bad], "lookupd")


def test_format_table_pads_and_aligns() -> None:
    text = format_table(["p", "node"], [[0, "a:1"], [10, None]], right=(0,))
    assert text.splitlines() == [" p  node", "--  ----", " 0  a:1", "10"]


def test_parse_start() -> None:
    assert parse_start(None) is None and parse_start("latest") is None
    assert parse_start("earliest") == StartPosition.message_count(0)
    assert parse_start("timestamp:1700000000") == StartPosition.timestamp(1700000000)
    assert parse_start("timestamp:2023-11-14T22:13:20") == StartPosition.timestamp(1700000000)
    assert parse_start("ts:2023-11-14T23:13:20+01:00") == StartPosition.timestamp(1700000000)
    assert parse_start("offset:4096") == StartPosition.queue_offset(4096)
    assert parse_start("count:12") == StartPosition.message_count(12)
    for bad in ("yesterday", "offset:x", "offset:-1", "count:", "timestamp:soon"):
        with pytest.raises(CLIError, match="bad --from"):
            parse_start(bad)


def test_progress_rewrites_one_line_and_is_silent_when_disabled() -> None:
    stream = io.StringIO()
    progress = Progress(True, stream=stream, interval=0)
    progress.update("long status text")
    progress.update("short")
    progress.done()
    assert stream.getvalue() == "\rlong status text\rshort           \n"
    quiet = io.StringIO()
    disabled = Progress(None, stream=quiet)  # a StringIO is not a terminal
    disabled.update("x", force=True)
    disabled.done()
    assert quiet.getvalue() == ""
    assert bar(0.5, 4) == "[##--]" and bar(2.0, 2) == "[##]"


def test_one_line() -> None:
    try:
        try:
            raise OSError("refused\nsecond line")
        except OSError as cause:
            raise RuntimeError("connect failed") from cause
    except RuntimeError as exc:
        assert one_line(exc) == "connect failed (refused second line)"


def test_a_lookup_failure_is_said_once() -> None:
    """The library's LookupFailed already starts with "lookup of 't' failed": the CLI's line
    does not say it twice (it printed "lookup of 't' failed: lookup of 't' failed: ...")."""
    from smartnsq.cli.util import lookup_failure
    from smartnsq.errors import LookupFailed

    said = str(lookup_failure(LookupFailed("lookup of 't' failed: no lookupd given is "
                                           "nsqlookupd"), "t", ["127.0.0.1:1"], 5))
    assert said == "lookup of 't' failed: no lookupd given is nsqlookupd"
    other = str(lookup_failure(LookupFailed("no lookupd answered"), "t", ["127.0.0.1:1"], 5))
    assert other == "lookup of 't' failed: no lookupd answered"
