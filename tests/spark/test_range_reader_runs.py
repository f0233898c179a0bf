"""``RangeReader._on_run`` (a received chunk's messages at once) against ``_on_message`` (one
at a time, the reference): fed the same deliveries, two readers end in the same state (rows
taken, where the range ends, done, the error) and FIN the same messages, whatever the
deliveries are (in order, redelivered, past the end, across the limit or the buffer's
bound)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartnsq.protocol.frames import MessageFrame, youzan_message_id
from smartnsq.protocol.runs import MessageRun
from smartnsq.spark.cluster import LeaderInfo
from smartnsq.spark.ranges import RangeReader

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class _Open:
    is_closed = False


def _reader(start: int, end: int, limit: int | None, max_buffered: int,
            fins: list[bytes]) -> RangeReader:
    reader = RangeReader("t", 0, LeaderInfo("127.0.0.1", 1, 2), "c", start, end, ordered=False,
                         ext=False, rdy=10, limit=limit, max_buffered=max_buffered)
    reader._wake = asyncio.Event()
    reader._conn = _Open()  # type: ignore[assignment]
    reader._send_fin = fins.append
    return reader


def _state(reader: RangeReader, fins: list[bytes]) -> Any:
    taken = reader._ready
    sent = b"".join(fins)
    return (taken.offsets, taken.ids, reader.next_end, reader.done, repr(reader._error),
            list(reader._held), reader._count, sent, reader.gap)


@st.composite
def deliveries(draw: st.DrawFn) -> list[list[MessageFrame]]:
    """Chunks of messages of 10 bytes each, mostly in order from 0, with repeats and gaps."""
    chunks: list[list[MessageFrame]] = []
    offset = draw(st.sampled_from([0, 0, 10, 5]))
    for _ in range(draw(st.integers(1, 6))):
        chunk = []
        for _ in range(draw(st.integers(1, 8))):
            step = draw(st.sampled_from([10, 10, 10, 10, 0, -10, 20, 5]))
            offset = max(0, offset + step - 10) if chunk or chunks else offset
            chunk.append(MessageFrame(1, 1, youzan_message_id(offset, 9), b"x" * 3, 0, None,
                                      offset, 10, True))
            offset += 10
        chunks.append(chunk)
    return chunks


@SETTINGS
@given(deliveries(), st.integers(0, 20), st.integers(20, 200),
       st.sampled_from([None, 1, 3, 7, 100]), st.sampled_from([10**6, 1200, 600]))
def test_a_run_ends_where_its_messages_one_by_one_end(chunks: list[list[MessageFrame]],
                                                      start: int, end: int, limit: int | None,
                                                      max_buffered: int) -> None:
    start -= start % 10
    by_run: list[bytes] = []
    by_message: list[bytes] = []
    a = _reader(start, end, limit, max_buffered, by_run)
    b = _reader(start, end, limit, max_buffered, by_message)
    for chunk in chunks:
        a._on_run(MessageRun.of(chunk))
        for message in chunk:
            b._on_message(message)
    assert _state(a, by_run) == _state(b, by_message)


def test_an_in_order_chunk_is_taken_whole_with_one_fin_command() -> None:
    fins: list[bytes] = []
    reader = _reader(0, 1000, None, 10**6, fins)
    first = [MessageFrame(1, 1, youzan_message_id(0, 0), b"a", 0, None, 0, 10, True)]
    rest = [MessageFrame(1, 1, youzan_message_id(i, 0), b"a", 0, None, 10 * i, 10, True)
            for i in range(1, 50)]
    reader._on_run(MessageRun.of(first))
    run = MessageRun.of(rest)
    reader._on_run(run)
    assert len(fins) == 2 and reader.next_end == 500  # not spread into messages
    assert reader._ready.offsets == [10 * i for i in range(50)]

