"""Batch bodies given as ``bytearray`` or ``memoryview`` go into the MPUB without a copy of
their own, and arrive as the bytes they view (whatever the view's item format)."""

from __future__ import annotations

import array
from typing import Any

import pytest

from smartnsq import Producer
from smartnsq.errors import InvalidArgument
from smartnsq.producer.validation import Checks


def test_views_are_kept_and_checked() -> None:
    checks = Checks(16, 1000, True)
    raw = bytearray(b"abcdefgh")
    items, _, _ = checks.batch("t", [raw, memoryview(raw)[2:4], b"plain"], None, None, None,
                               None)
    assert items[0] is raw and isinstance(items[1], memoryview)  # no copy
    assert [bytes(item) for item in items] == [b"abcdefgh", b"cd", b"plain"]
    words = memoryview(array.array("I", [1, 2]))  # 4-byte items: sizes are in bytes
    (item,), _, _ = checks.batch("t", [words], None, None, None, None)
    assert len(item) == 8
    for bad in (bytearray(), memoryview(b"x" * 17), memoryview(b"x" * 40)[::2]):
        with pytest.raises(InvalidArgument, match=r"bodies\[0\]"):
            checks.batch("t", [bad], None, None, None, None)
    stepped = memoryview(b"a1b2c3")[::2]  # not contiguous: copied, as any other body
    (copied,), _, _ = checks.batch("t", [stepped], None, None, None, None)
    assert copied == b"abc"


async def test_view_bodies_are_stored_as_their_bytes(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("views", partitions=2, replicas=1)
    buffer = bytearray(b"".join(b"msg-%03d|" % i for i in range(50)))
    view = memoryview(buffer)
    bodies = [view[i * 8:(i + 1) * 8] for i in range(50)]
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as p:
        plain = await p.publish_many("views", bodies, partition=0)
        traced = await p.publish_many("views", [bytearray(b"t1"), view[:8]], partition=1,
                                      trace_id=[1, 2])
    assert plain.count == 50 and traced.count == 2
    logs = {part.partition: [m.body for m in part.log.messages]
            for part in nsq_cluster.state.topics["views"].partitions}
    assert logs[0] == [b"msg-%03d|" % i for i in range(50)]
    assert logs[1] == [b"t1", b"msg-000|"]
