"""One trace-line format (``smartnsq.observability.trace``) for producer and consumer; one name for
the trace id header; the lookup Accept header from the protocol package."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import smartnsq
from smartnsq.errors import InvalidArgument
from smartnsq.observability import trace
from smartnsq.protocol import validate as v

PACKAGE = Path(smartnsq.__file__).parent


def test_line_shape() -> None:
    assert trace.format_line("PUB", topic="t", partition=0, node="h:1", internal_id=2,
                             trace_id=7, queue_offset=0, raw_size=46, count=1) == (
        "PUB topic=t partition=0 node=h:1 internal_id=2 trace_id=7 queue_offset=0 "
        "raw_size=46 count=1")
    assert trace.format_line("PUB", "no receipt", topic="t", partition=None, node="h:1",
                             trace_id=7, count=1) == (
        "PUB topic=t partition=None node=h:1 trace_id=7 count=1 (no receipt)")


def test_line_logs_only_when_enabled(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="smartnsq.trace")
    trace.line("CONSUME", topic="t")
    assert not trace.enabled() and caplog.records == []
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    trace.line("CONSUME", topic="t", id="abc", attempts=1)
    assert trace.enabled()
    assert [r.getMessage() for r in caplog.records] == ["CONSUME topic=t id=abc attempts=1"]


def _source(name: str) -> str:
    """A module's source, or a package's (``smartnsq/consumer/``) joined."""
    path = PACKAGE / name
    files = sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return "".join(f.read_text() for f in files)


@pytest.mark.parametrize("module", ["producer", "consumer"])
def test_producer_and_consumer_use_the_one_formatter(module: str) -> None:
    source = _source(module)
    assert "tracing.line(" in source and "trace_log.info(" not in source


def test_one_trace_id_header_name() -> None:
    assert v.TRACE_ID_HEADER == "##trace_id"
    with pytest.raises(InvalidArgument):
        v.check_headers({v.TRACE_ID_HEADER: "x"})
    for module in ("producer/encoding.py", "protocol/validate.py"):
        source = (PACKAGE / module).read_text()
        assert source.count('"##trace_id"') == (1 if module.startswith("protocol") else 0)


def test_consumer_uses_the_protocol_accept_header() -> None:
    assert "version=1.0" not in _source("consumer")
