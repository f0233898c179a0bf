"""``RunReader.feed_runs`` against ``FrameReader.feed``, its per-message reference.

A run is the columns of consecutive message frames; spread back into messages
(``MessageRun.frames``) the runs of any split of any stream must be exactly the messages
``feed`` decodes, every other frame in the same place, and garbage must raise the same
``ProtocolError`` at the same point.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import FAST, LAYOUTS, splits, streams

from smartnsq.errors import ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    MessageFrame,
    MessageLayout,
    encode_message,
    encode_response,
    youzan_message_id,
)
from smartnsq.protocol.runs import MessageRun, RunReader

RUN_LAYOUTS = [layout for layout in LAYOUTS if layout.youzan and layout.detail]


def _plain(frame: Any) -> Any:
    """A frame as comparable values (messages have no ``__eq__``)."""
    if isinstance(frame, MessageFrame):
        return ("msg", frame.timestamp, frame.attempts, frame.id, frame.body, frame.ext_version,
                frame.ext, frame.queue_offset, frame.raw_size, frame.youzan)
    return frame


def _spread(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        out.extend(item.frames() if isinstance(item, MessageRun) else [item])
    return out


def _decode(layout: MessageLayout, pieces: list[bytes], runs: bool) -> tuple[list[Any], str]:
    reader = RunReader(layout)
    out: list[Any] = []
    error = ""
    try:
        for piece in pieces:
            out += reader.feed_runs(piece) if runs else reader.feed(piece)
    except ProtocolError as exc:
        error = str(exc)
    return out, error


@FAST
@given(streams(), st.lists(st.integers(0, 10**6), max_size=40))
def test_runs_spread_to_the_frames_of_any_split(stream: tuple[MessageLayout, bytes, list[Any]],
                                                cuts: list[int]) -> None:
    layout, data, _ = stream
    pieces = splits(data, cuts)
    frames, error = _decode(layout, pieces, runs=False)
    items, run_error = _decode(layout, pieces, runs=True)
    assert not error and not run_error
    assert [_plain(f) for f in _spread(items)] == [_plain(f) for f in frames]
    if layout not in RUN_LAYOUTS:
        assert not any(isinstance(i, MessageRun) for i in items)
        return
    # consecutive messages of one read: one run, and a message alone stays a message
    whole = RunReader(layout).feed_runs(data)
    messages = (MessageRun, MessageFrame)
    assert not any(isinstance(a, messages) and isinstance(b, messages)
                   for a, b in itertools.pairwise(whole))
    assert all(len(i) >= 2 for i in whole if isinstance(i, MessageRun))


@FAST
@given(st.sampled_from(RUN_LAYOUTS), st.lists(st.binary(max_size=600), max_size=12),
       st.data())
def test_garbage_fails_alike(layout: MessageLayout, chunks: list[bytes], data: Any) -> None:
    good = data.draw(streams())[1] if data.draw(st.booleans()) else b""
    pieces = [good, *chunks]
    frames, error = _decode(layout, pieces, runs=False)
    items, run_error = _decode(layout, pieces, runs=True)
    assert run_error == error
    assert [_plain(f) for f in _spread(items)] == [_plain(f) for f in frames]


def _messages(layout: MessageLayout, n: int, start: int = 0) -> list[bytes]:
    return [encode_message(i, 1, youzan_message_id((2 << 50) + i, 7), b"b%d" % i, layout,
                           queue_offset=start + 40 * i, raw_size=40) for i in range(n)]


def test_a_run_holds_the_columns_and_is_cut_by_other_frames() -> None:
    layout = MessageLayout(detail=True)
    data = b"".join([*_messages(layout, 3), encode_response(b"OK"), *_messages(layout, 2, 120)])
    first, ok, second = RunReader(layout).feed_runs(data)
    assert isinstance(first, MessageRun) and isinstance(second, MessageRun)
    assert ok.data == b"OK"  # type: ignore[union-attr]
    assert (len(first), first.offsets, first.raw_sizes, first.end_offset) == \
        (3, [0, 40, 80], [40, 40, 40], 120)
    assert first.bodies == [b"b0", b"b1", b"b2"] and first.exts is None
    assert first.contiguous() and second.contiguous()
    assert first.body_bytes() == 6
    joined = MessageRun.join([first, second.frame(0), second])
    assert joined.offsets == [0, 40, 80, 120, 120, 160]
    assert not joined.contiguous()
    assert [_plain(m) for m in MessageRun.of(first.frames()).frames()] == \
        [_plain(m) for m in first.frames()]
    assert len(MessageRun.join([])) == 0


def test_fins_of_a_run_are_the_fins_one_by_one() -> None:
    layout = MessageLayout(ext=True, detail=True)
    run = RunReader(layout).feed_runs(b"".join(_messages(layout, 5)))[0]
    assert isinstance(run, MessageRun)
    assert commands.fins(run.ids) == b"".join(commands.fin(i) for i in run.ids)
    assert commands.fins([]) == b""
    with pytest.raises(ValueError):
        MessageRun.of([MessageFrame(1, 1, b"0123456789abcdef", b"", youzan=False)])
