"""ProducerConfig: each field's documented range is the rule that checks it."""

from __future__ import annotations

import dataclasses
import math

import pytest
from reference import config_table

from smartnsq import ProducerConfig
from smartnsq.config import ConnectionConfig, describe
from smartnsq.errors import InvalidArgument

BAD: dict[str, list[object]] = {
    "timeout": [0, -1, math.inf, math.nan, True, "1"],
    "sharding": ["md5", None],
    "max_msg_size": [0, 2**31, 1.5, True],
    "max_body_size": [0, -5],
    "retry_delay": [0, math.inf, math.nan],
    "retry_delay_max": [0.01, math.inf],  # below retry_delay (0.05)
    "reconnect_delay": [0, -0.1],
    "reconnect_delay_max": [0.01],
    "drain_timeout": [-1, math.nan, "5"],
    "idle_timeout": [0, math.inf],
    "sharded_receipts": [1, None],
    "trace": [1, "yes"],
    "connection": [None, {}],
}
GOOD: dict[str, list[object]] = {
    "timeout": [0.001, 3, 1e6],
    "sharding": ["java", lambda key, n: 0],
    "retry_delay_max": [0.05, 5],
    "drain_timeout": [0, math.inf],
    "idle_timeout": [None, 0.5],
    "trace": [True, False, None],
    "connection": [ConnectionConfig(request_timeout=2)],
}


def test_every_field_has_one_description_with_its_rule() -> None:
    rows = {row.name: row for row in describe(ProducerConfig)}
    for f in dataclasses.fields(ProducerConfig):
        rule = f.metadata["check"]
        assert f.metadata["doc"], f.name
        assert rule is not None and rows[f.name].range == rule.text, f.name
    table = config_table("smartnsq.ProducerConfig")
    assert "| `retry_delay_max` | `1.0` | s >= retry_delay |" in table


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in BAD.items() for v in vs])
def test_a_bad_value_names_its_field(name: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ProducerConfig(**{name: value})  # type: ignore[arg-type]
    assert caught.value.field == name


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in GOOD.items() for v in vs])
def test_good_values(name: str, value: object) -> None:
    assert getattr(ProducerConfig(**{name: value}), name) is value  # type: ignore[arg-type]


def test_replace_checks_again() -> None:
    with pytest.raises(InvalidArgument, match="retry_delay_max"):
        dataclasses.replace(ProducerConfig(), retry_delay=2.0)
