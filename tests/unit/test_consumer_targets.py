"""Which SUB for which target, and which targets a lookup view gives: plain functions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from smartnsq.consumer.targets import (
    Starts,
    Target,
    missing_leaders,
    static_targets,
    sub_command,
    view_targets,
)
from smartnsq.errors import InvalidArgument
from smartnsq.protocol.commands import StartPosition

A = ("127.0.0.1", 4150)
B = ("127.0.0.2", 4150)


def sub(target: Target, *, youzan: bool = True, ordered: bool = False,
        start: StartPosition | None = None, pending: bool = True) -> tuple[str, bytes, bool]:
    command = sub_command("t", "c", target, youzan=youzan, ordered=ordered, start=start,
                          start_pending=pending)
    return command.name, command.data, command.set_offset


def test_classic_gets_plain_sub_without_partition() -> None:
    assert sub(Target(A, None), youzan=False) == ("SUB", b"SUB t c\n", False)


def test_youzan_partition_and_ordered() -> None:
    assert sub(Target(A, 2)) == ("SUB", b"SUB t c 2\n", False)
    assert sub(Target(A, 2), ordered=True) == ("SUB_ORDERED", b"SUB_ORDERED t c 2\n", False)


def test_ordered_without_partition_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="partitions"):
        sub(Target(A, None), ordered=True)


def test_start_inline_on_the_default_partition_over_http_elsewhere() -> None:
    start = StartPosition.message_count(5)
    name, data, http = sub(Target(A, 0, inline_start=True), start=start)
    assert name == "SUB_ADVANCED" and not http and data.endswith(b" msgcount:5\n")
    name, data, http = sub(Target(A, 1, inline_start=False, http="127.0.0.1:4151"),
                           start=start)
    assert name == "SUB_ADVANCED" and http


def test_a_resubscription_keeps_the_detail_block_without_rewinding() -> None:
    start = StartPosition.message_count(5)
    name, data, http = sub(Target(A, 0), start=start, pending=False)
    assert name == "SUB_ADVANCED" and data == b"SUB_ADVANCED t c 0\n" and not http


def test_ordered_ignores_the_start() -> None:
    assert sub(Target(A, 0), ordered=True, start=StartPosition.end())[0] == "SUB_ORDERED"


def test_starts_by_partition_or_by_node() -> None:
    starts = Starts(StartPosition.end(), by_node=False)
    starts.applied(Target(A, 1))
    assert not starts.pending(Target(B, 1)) and starts.pending(Target(A, 2))
    by_node = Starts(StartPosition.end(), by_node=True)
    by_node.applied(Target(A, None))
    assert by_node.pending(Target(B, None)) and not by_node.pending(Target(A, None))
    assert not Starts(None, by_node=False).pending(Target(A, 1))


def _view(partitions: dict[int, object], producers: list[object] = ()) -> SimpleNamespace:
    return SimpleNamespace(meta=SimpleNamespace(ordered=True, extend_support=False),
                           youzan=True, partitions=partitions, producers=list(producers),
                           partition_num=3)


def _part(address: tuple[str, int] | None) -> SimpleNamespace:
    leader = None if address is None else SimpleNamespace(address=address,
                                                          http_address="127.0.0.1:4151")
    return SimpleNamespace(leader=leader)


def test_view_targets_read_each_partition_on_its_leader() -> None:
    view = _view({0: _part(A), 1: _part(B), 2: _part(A), 3: _part(None)})
    targets = view_targets(view, None)
    assert [(t.address, t.partition, t.inline_start, t.ordered) for t in targets] == [
        (A, 0, True, True), (B, 1, True, True), (A, 2, False, True)]
    assert [t.partition for t in view_targets(view, frozenset({1}))] == [1]
    assert missing_leaders(_view({0: _part(A), 1: _part(None)}), None) == [1, 2]


def test_static_targets() -> None:
    assert static_targets([A, B], None) == [Target(A, None), Target(B, None)]
    assert [t.key for t in static_targets([A], frozenset({2, 0}))] == [(A, 0), (A, 2)]
