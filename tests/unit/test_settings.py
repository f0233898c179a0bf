"""One way to declare a setting: every config field carries its Rule, whose text is
the range the reference shows, and every number argument is checked by one helper."""

from __future__ import annotations

import dataclasses
import math

import pytest

from smartnsq.config import ConnectionConfig, one_source
from smartnsq.consumer.config import ConsumerConfig
from smartnsq.discovery.lookup import LookupConfig
from smartnsq.errors import InvalidArgument
from smartnsq.producer.config import ProducerConfig
from smartnsq.protocol.numbers import check_int, check_number

CONFIGS = [ConnectionConfig, LookupConfig, ProducerConfig, ConsumerConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_is_declared_once_with_its_rule(cls: type) -> None:
    for f in dataclasses.fields(cls):
        rule = f.metadata.get("check")
        assert rule is not None, f"{cls.__name__}.{f.name} has no Rule"
        assert f.metadata["range"] == rule.text  # the reference shows what is checked
        assert f.metadata["doc"]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_number_fields_refuse_bools_nan_and_strings(cls: type) -> None:
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING or isinstance(f.default, bool) \
                or not isinstance(f.default, int | float):
            continue
        for bad in (True, math.nan, "1"):
            with pytest.raises(InvalidArgument) as info:
                cls(**{f.name: bad})
            assert info.value.field == f.name


def test_the_number_helper_says_the_range() -> None:
    assert check_int("n", 3, 1, 9) == 3
    with pytest.raises(InvalidArgument, match=r"must be an int in 1\.\.9"):
        check_int("n", 10, 1, 9)
    with pytest.raises(InvalidArgument, match="must be an int >= 0"):
        check_int("n", False, 0)
    assert check_number("t", 0, 0) == 0.0
    with pytest.raises(InvalidArgument, match="must be > 0"):
        check_number("t", 0, low_open=True)
    with pytest.raises(InvalidArgument, match="finite number of seconds"):
        check_number("t", math.inf)
    assert check_number("t", math.inf, finite=False) == math.inf
    with pytest.raises(InvalidArgument, match=r"must be >= initial"):
        check_number("t", 1, "initial", floor=2)


def test_cross_field_bounds_name_the_other_field() -> None:
    with pytest.raises(InvalidArgument, match=">= retry_delay") as info:
        LookupConfig(retry_delay=3.0, retry_delay_max=2.0)
    assert info.value.field == "retry_delay_max"
    with pytest.raises(InvalidArgument, match="needs tls_cert_file"):
        ConnectionConfig(tls_key_file="k.pem")
    with pytest.raises(InvalidArgument) as secret:
        ConnectionConfig(auth_secret="")
    assert "''" not in str(secret.value)


def test_one_source_rule_has_one_wording() -> None:
    assert one_source("Consumer", lookupd=None, nsqd=["127.0.0.1:4150"], lookup=None) == "nsqd"
    for given in ({}, {"lookupd": ["a:1"], "nsqd": ["b:2"]}):
        with pytest.raises(InvalidArgument, match="give exactly one of lookupd=, nsqd= or "
                                                  "lookup="):
            one_source("Consumer", **{"lookupd": None, "nsqd": None, "lookup": None, **given})


def test_every_retry_concept_is_set_somewhere_and_explained() -> None:
    from reference import expand_markers

    from smartnsq.config import RETRY_CONCEPTS

    table = expand_markers("<!-- reference: retries -->")
    for title, why in RETRY_CONCEPTS.values():
        row = next(line for line in table.splitlines() if line.startswith(f"| {title} |"))
        assert "Config." in row and why[:20] in row
    assert "`ConsumerConfig.reconnect_delay_max` = `60.0` s" in table


def test_spark_options_are_declared_once_and_read_through_their_rule() -> None:
    from smartnsq.spark.options import OPTION_TABLES, SINK, SinkOptions

    for options in OPTION_TABLES.values():
        for option in options.values():
            option.rule.check(option.name, option.default, None)  # each default passes
            assert option.doc and option.read({}) == option.default
    assert SINK["batchSize"].read({"batchsize": "7"}) == 7
    for bad in ("0", "x", "100001"):
        with pytest.raises(InvalidArgument) as info:
            SinkOptions.parse({"lookupd": "127.0.0.1:4161", "topic": "t", "batchSize": bad})
        assert info.value.field == "batchSize"


@pytest.mark.parametrize("cls", [ProducerConfig, ConsumerConfig], ids=lambda c: c.__name__)
def test_a_retry_maximum_below_its_first_delay_is_refused_the_same_way(cls: type) -> None:
    with pytest.raises(InvalidArgument, match=">= reconnect_delay") as info:
        cls(reconnect_delay=2.0, reconnect_delay_max=1.0)
    assert info.value.field == "reconnect_delay_max"
