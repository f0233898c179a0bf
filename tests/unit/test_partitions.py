"""The shared rules of a topic's partitions (``smartnsq.model.partitions``).

The point of the module is that the Producer, the Consumer, the Spark connector and the CLI
ask the same functions; the last tests here check that the Producer's routing and the
Consumer's SUB choice really are these rules (not a copy that could drift).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from smartnsq.consumer.targets import Target, sub_command
from smartnsq.errors import InvalidArgument
from smartnsq.model.dialect import DEFAULT_POLICY
from smartnsq.model.partitions import (
    DEFAULT_MAX_RDY,
    fin_at_once,
    partition_for,
    rdy_ceiling,
    subscription,
)
from smartnsq.model.routes import TopicRoutes
from smartnsq.model.sharding import make_router, murmur3_partition
from smartnsq.producer.routing import choose_target
from smartnsq.protocol import commands
from smartnsq.protocol.commands import StartPosition

MURMUR = make_router("murmur3")
A = ("127.0.0.1", 4150)


@dataclass(frozen=True)
class Shape:
    """The least a caller needs to give (no routes object, as the Protocol allows)."""

    topic: str = "orders"
    partition_num: int = 4
    partitioned: bool = True
    ordered: bool = False


def test_a_key_goes_to_its_hash_partition() -> None:
    for key in ("hello", b"customer-42", 12345):
        assert partition_for(Shape(), MURMUR, sharding_key=key) == murmur3_partition(key, 4)
    java = make_router("java")
    assert partition_for(Shape(), java, sharding_key="hello") == java("hello", 4)


def test_a_partition_wins_over_a_key_and_must_be_in_range() -> None:
    assert partition_for(Shape(), MURMUR, partition=3, sharding_key="hello") == 3
    with pytest.raises(InvalidArgument, match="has 4 partitions"):
        partition_for(Shape(), MURMUR, partition=4)
    with pytest.raises(InvalidArgument, match="no partitions"):
        partition_for(Shape(partition_num=0, partitioned=False), MURMUR, partition=0)


def test_unpinned_and_classic_publishes_have_no_partition() -> None:
    assert partition_for(Shape(), MURMUR) is None  # round-robin: the caller's
    classic = Shape(partition_num=0, partitioned=False)
    assert partition_for(classic, MURMUR, sharding_key="k") is None  # a node, by the dialect
    with pytest.raises(InvalidArgument, match="partition count"):
        partition_for(Shape(partition_num=0), MURMUR, sharding_key="k")  # standalone nodes


def test_ordered_topics_refuse_unpinned_publishes() -> None:
    with pytest.raises(InvalidArgument, match="ordered"):
        partition_for(Shape(ordered=True), MURMUR)
    assert partition_for(Shape(ordered=True), MURMUR, partition=1) == 1


@pytest.mark.parametrize(("kwargs", "name", "data"), [
    ({"youzan": False, "ordered": True, "detail": True}, "SUB", commands.sub("t", "c")),
    ({"youzan": True, "ordered": True, "detail": True}, "SUB_ORDERED",
     commands.sub_ordered("t", "c", 2)),
    ({"youzan": True, "ordered": False, "detail": True}, "SUB_ADVANCED",
     commands.sub_advanced("t", "c", 2)),
    ({"youzan": True, "ordered": False}, "SUB", commands.sub("t", "c", 2)),
    ({"youzan": True, "ordered": False, "start": StartPosition.queue_offset(7)}, "SUB_ADVANCED",
     commands.sub_advanced("t", "c", 2, StartPosition.queue_offset(7))),
])
def test_the_sub_line_for_each_kind_of_topic(kwargs: dict[str, object], name: str,
                                             data: bytes) -> None:
    sub = subscription("t", "c", 2, **kwargs)  # type: ignore[arg-type]
    assert (sub.name, sub.data, sub.set_offset) == (name, data, False)
    assert sub.detail == (name != "SUB")


def test_a_start_past_the_default_partition_is_set_over_http() -> None:
    sub = subscription("t", "c", 2, youzan=True, ordered=False,
                       start=StartPosition.queue_offset(7), inline_start=False)
    assert (sub.name, sub.data, sub.set_offset) == ("SUB_ADVANCED",
                                                    commands.sub_advanced("t", "c", 2), True)


def test_sub_ordered_names_its_partition() -> None:
    with pytest.raises(InvalidArgument, match="partitions="):
        subscription("t", "c", None, youzan=True, ordered=True)


def test_rdy_and_fin_on_ordered_and_plain_channels() -> None:
    assert rdy_ceiling(True, 2500) == 1
    assert rdy_ceiling(False, 200) == 200
    assert rdy_ceiling(False, None) == DEFAULT_MAX_RDY
    assert rdy_ceiling(False, 0, default=64) == 64
    assert fin_at_once(True) and not fin_at_once(False)


def test_the_producer_routes_by_these_rules() -> None:
    routes = TopicRoutes("orders", partition_num=8, youzan=True,
                         leaders={p: A for p in range(8)})
    for i in range(200):
        key = f"customer-{i}"
        assert choose_target(routes, key, None, MURMUR, DEFAULT_POLICY, {})[0] == \
            partition_for(routes, MURMUR, sharding_key=key)


def test_the_consumer_subscribes_by_these_rules() -> None:
    start = StartPosition.queue_offset(7)
    target = Target(A, 2, True, False, False, inline_start=False, http="127.0.0.1:4151")
    for ordered in (False, True):
        for pending in (False, True):
            got = sub_command("t", "c", target, youzan=True, ordered=ordered, start=start,
                              start_pending=pending)
            assert got == subscription("t", "c", 2, youzan=True, ordered=ordered, detail=True,
                                       start=start if pending else None, inline_start=False)
