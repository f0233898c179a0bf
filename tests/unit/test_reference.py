"""The generated references cover every option and every server error code."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
from reference import config_table, errors_table, expand_markers

from smartnsq import Consumer, ProducerConfig
from smartnsq.config import ConnectionConfig, describe
from smartnsq.consumer.config import ConsumerConfig
from smartnsq.errors import ERROR_TABLE, InvalidArgument

_PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_DOCUMENTED = re.findall(r"<!-- reference: config ([\w.]+) -->", _PAGE.read_text())


def _load(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def test_the_reference_page_lists_the_core_configs() -> None:
    for cls in (ConnectionConfig, ProducerConfig, ConsumerConfig):
        assert f"smartnsq.{cls.__qualname__}" in _DOCUMENTED  # the public path


@pytest.mark.parametrize("dotted", _DOCUMENTED)
def test_every_option_is_documented(dotted: str) -> None:
    cls = _load(dotted)
    table = config_table(dotted)
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or not f.init:
            continue
        assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc() text"
        assert f"| `{f.name}` |" in table


def test_every_consumer_option_is_a_documented_config_field() -> None:
    """The Consumer's own parameters are what it reads and from where; every other option
    is a ConsumerConfig field (so it is in the generated table) or a ConnectionConfig one."""
    params = set(inspect.signature(Consumer).parameters)
    options = {f.name for config in (ConsumerConfig, ConnectionConfig)
               for f in dataclasses.fields(config)}
    # (tracer_provider: smartnsq.observability.otel; meter_provider: ...otel_metrics)
    assert params - options == {"topic", "channel", "lookupd", "nsqd", "handler", "lookup",
                                "config", "tracer_provider", "meter_provider"}
    assert options <= params  # the signature lists every option (keyword_options)
    table = config_table("smartnsq.ConsumerConfig")
    for f in dataclasses.fields(ConsumerConfig):
        assert f"| `{f.name}` |" in table
    page = (_PAGE.parent / "consumer.md").read_text()
    for name in ("lookupd", "nsqd", "lookup", "handler", "config", "tracer_provider",
                 "meter_provider"):
        assert f"`{name}" in page, f"docs/consumer.md does not present {name}"


def test_rule_checks_and_range_text_come_from_one_description() -> None:
    rows = {row.name: row for row in describe(ConsumerConfig)}
    assert rows["max_in_flight"].range == ">= 0"
    assert rows["drain_timeout"].range == "> 0"
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        ConsumerConfig(max_in_flight=-1)
    with pytest.raises(InvalidArgument, match="drain_timeout"):
        ConsumerConfig(drain_timeout=float("inf"))


def test_every_error_code_has_a_row() -> None:
    table = errors_table()
    for code in ERROR_TABLE:
        assert f"| `{code}` |" in table


def test_markers_expand_and_unknown_markers_fail() -> None:
    page = "a\n<!-- reference: config smartnsq.ConnectionConfig -->\nb"
    assert "| `connect_timeout` |" in expand_markers(page)
    assert "E_BAD_TOPIC" in expand_markers("<!-- reference: errors -->")
    with pytest.raises(ValueError, match="unknown reference marker"):
        expand_markers("<!-- reference: nonsense -->")
    with pytest.raises(TypeError):
        expand_markers("<!-- reference: config smartnsq.errors.Action -->")
