"""``ConsumerConfig`` and the Consumer's keywords: one configuration, validated at once."""

from __future__ import annotations

import pytest

from smartnsq import Consumer
from smartnsq.config import ConnectionConfig
from smartnsq.consumer.config import ConsumerConfig
from smartnsq.errors import InvalidArgument
from smartnsq.model.backoff import BackoffPolicy

NSQD = ["127.0.0.1:4150"]


def test_keywords_build_the_config_and_connection_fields_go_to_the_connection() -> None:
    consumer = Consumer("t", "c", nsqd=NSQD, max_in_flight=7, msg_timeout=30,
                        partitions=[1, 0])
    assert consumer.config.max_in_flight == 7 and consumer.max_in_flight == 7
    assert consumer.config.connection.msg_timeout == 30
    assert consumer.config.partitions == frozenset({0, 1})


def test_config_objects_and_keywords_combine() -> None:
    base = ConsumerConfig(max_in_flight=3, drain_timeout=5)
    consumer = Consumer("t", "c", nsqd=NSQD, config=base, drain_timeout=9)
    assert consumer.config.max_in_flight == 3 and consumer.drain_timeout == 9
    conn = ConnectionConfig(msg_timeout=20)
    assert Consumer("t", "c", nsqd=NSQD, config=conn).config.connection is conn


def test_none_still_means_the_default_policy() -> None:
    consumer = Consumer("t", "c", nsqd=NSQD, backoff_policy=None, requeue_policy=None)
    assert consumer.config.backoff_policy == BackoffPolicy()


@pytest.mark.parametrize(("option", "value"), [
    ("max_in_flight", -1), ("concurrency", 0), ("ordered", "yes"), ("desired_tag", "x" * 101),
    ("drain_timeout", 0), ("reconnect_delay", float("nan")), ("partitions", []),
    ("on_give_up", 3), ("auto_finish", None), ("msg_timeout", 0.1), ("start", 5),
])
def test_a_bad_option_names_itself(option: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        Consumer("t", "c", nsqd=NSQD, **{option: value})
    assert info.value.field == option


def test_unknown_options_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="unknown option"):
        Consumer("t", "c", nsqd=NSQD, max_in_fligth=3)
