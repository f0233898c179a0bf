"""One partition limit, ``protocol.validate.MAX_PARTITION``, bounds a lookup answer at parse
time, as it bounds ``publish(partition=)``. With two limits that disagreed, an answer of 4,000
partitions (under a 4,096 answer limit) opened ~4,000 sockets before the consumer died on
"partition 2033: must be 0..1023"."""

from __future__ import annotations

import json

import pytest

from smartnsq.discovery.lookup import LookupConfig
from smartnsq.errors import InvalidArgument, ProtocolError
from smartnsq.protocol import validate
from smartnsq.protocol.lookup import LookupLimits, parse_lookup

NODE = {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151,
        "version": "0.3.7-HA.1.13.0"}


def answer(pids: list[int], partition_num: int | None = None) -> bytes:
    return json.dumps({"partitions": {str(p): NODE for p in pids}, "producers": [NODE],
                       "meta": {"partition_num": len(pids) if partition_num is None
                                else partition_num, "replica": 1}}).encode()


def test_the_answer_limit_is_the_partition_limit() -> None:
    assert LookupLimits().max_partitions == validate.MAX_PARTITION + 1 == 1024
    assert LookupConfig().max_partitions == 1024
    with pytest.raises(InvalidArgument):
        LookupConfig(max_partitions=4096)


def test_four_thousand_partitions_are_refused_at_parse_time() -> None:
    with pytest.raises(ProtocolError, match="4000"):
        parse_lookup("t", "w", 200, answer(list(range(4000))))


@pytest.mark.parametrize("limits", [LookupLimits(), LookupLimits(max_partitions=1024)])
def test_a_partition_id_past_1023_is_refused_whatever_the_count(limits: LookupLimits) -> None:
    with pytest.raises(ProtocolError, match=r"2033 is outside 0\.\.1023"):
        parse_lookup("t", "w", 200, answer([0, 2033], partition_num=2), limits=limits)
    assert set(parse_lookup("t", "w", 200, answer([0, 1023], partition_num=1024),
                            limits=limits).partitions) == {0, 1023}


def test_a_partition_num_past_1024_is_refused() -> None:
    with pytest.raises(ProtocolError, match="partition_num 4000"):
        parse_lookup("t", "w", 200, answer([0], partition_num=4000))
