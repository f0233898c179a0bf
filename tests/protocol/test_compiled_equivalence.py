"""The compiled per-message modules against their pure-Python source, in one process.

``smartnsq.extensions.MODULES`` run as mypyc extensions where the install compiled them; the
same files, loaded from source beside them, are the reference. Both are fed the same random
byte streams (every frame type and layout, youzan's ext and detail blocks, split at every
boundary, corrupted, truncated, garbage) and must give equal frames, equal runs, the same
buffered bytes after every piece and the same errors, word for word. Where nothing was
compiled (or ``SMARTNSQ_NO_EXTENSIONS=1``) there is nothing to compare and these skip; the
rest of the suite then runs on the source.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import FAST, LAYOUTS, headers, message_frames, splits, streams

from smartnsq import extensions
from smartnsq.errors import ProtocolError
from smartnsq.message import Message
from smartnsq.protocol import commands, frames, runs

pytestmark = pytest.mark.skipif(not extensions.compiled(),
                                reason=f"nothing to compare: {extensions.describe()}")


def _load_sources() -> dict[str, ModuleType]:
    """``MODULES`` executed from their ``.py`` files, importing each other (not the compiled
    ones), without replacing what the rest of the process imported."""
    saved = {name: sys.modules[name] for name in extensions.MODULES}
    loaded: dict[str, ModuleType] = {}
    try:
        for name in extensions.MODULES:
            built = saved[name].__file__
            assert built is not None
            # the source beside the extension (a folder of the path may hold dots)
            source = Path(built).with_name(name.rsplit(".", 1)[1] + ".py")
            spec = importlib.util.spec_from_file_location(name, source)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        sys.modules.update(saved)
    return loaded


PURE = _load_sources() if extensions.compiled() else {}
pure_frames: Any = PURE.get("smartnsq.protocol.frames")
pure_runs: Any = PURE.get("smartnsq.protocol.runs")


def test_the_two_are_really_different_code() -> None:
    assert frames.__file__ is not None and not frames.__file__.endswith(".py")
    assert runs.__file__ is not None and not runs.__file__.endswith(".py")
    assert pure_frames.__file__.endswith(".py") and pure_runs.__file__.endswith(".py")
    assert pure_frames.FrameReader is not frames.FrameReader
    assert pure_runs.FrameReader is pure_frames.FrameReader  # the source imports the source


def _plain(frame: Any) -> Any:
    """A frame as comparable values, whichever module's class it is."""
    name = type(frame).__name__
    if name == "MessageRun":
        return ("run", [getattr(frame, column) for column in pure_runs.MessageRun.__slots__],
                [_plain(m) for m in frame.frames()])
    if name == "MessageFrame":
        return ("msg", frame.timestamp, frame.attempts, bytes(frame.id), bytes(frame.body),
                frame.ext_version, frame.ext, frame.queue_offset, frame.raw_size, frame.youzan)
    if name == "Response":
        return ("resp", frame.data)
    if name == "ErrorFrame":
        return ("err", frame.payload)
    return (name, repr(frame))


def _layout(module: Any, layout: frames.MessageLayout) -> Any:
    return module.MessageLayout(youzan=layout.youzan, ext=layout.ext, detail=layout.detail)


def _run(module: Any, layout: frames.MessageLayout, pieces: list[bytes], *,
         feed_runs: bool = False, max_frame_size: int | None = None) -> list[Any]:
    """What a reader of ``module`` makes of ``pieces``: per piece, the frames (as values) and
    the bytes it holds; then the error, if one came, and what it says on the next feed."""
    reader_cls = (pure_runs if module is pure_frames else runs).RunReader if feed_runs \
        else module.FrameReader
    kwargs = {} if max_frame_size is None else {"max_frame_size": max_frame_size}
    reader = reader_cls(_layout(module, layout), **kwargs)
    out: list[Any] = []
    for piece in pieces:
        try:
            got = reader.feed_runs(piece) if feed_runs else reader.feed(piece)
        except ProtocolError as exc:
            out.append(("error", str(exc)))
            try:
                reader.feed(b"\x00" * 8)
            except ProtocolError as again:
                out.append(("then", str(again), reader.buffered))
            return out
        out.append(([_plain(f) for f in got], reader.buffered))
    return out


def _both(layout: frames.MessageLayout, pieces: list[bytes], **kwargs: Any) -> None:
    assert _run(frames, layout, pieces, **kwargs) == _run(pure_frames, layout, pieces, **kwargs)


@FAST
@given(streams(), st.lists(st.integers(0, 10**6), max_size=8))
def test_any_split_of_any_stream(stream: tuple[Any, bytes, Any], cuts: list[int]) -> None:
    layout, data, _ = stream
    _both(layout, splits(data, cuts))


@FAST
@given(streams())
def test_every_boundary(stream: tuple[Any, bytes, Any]) -> None:
    layout, data, _ = stream
    for cut in range(0, len(data) + 1, max(1, len(data) // 40)):
        _both(layout, [data[:cut], data[cut:]])
    _both(layout, [data[i:i + 1] for i in range(min(len(data), 400))])


@FAST
@given(streams(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                           min_size=1, max_size=4), st.lists(st.integers(0, 10**6), max_size=4))
def test_corrupted_streams(stream: tuple[Any, bytes, Any], flips: list[tuple[int, int]],
                           cuts: list[int]) -> None:
    layout, data, _ = stream
    if not data:
        return
    corrupt = bytearray(data)
    for at, value in flips:
        corrupt[at % len(corrupt)] = value
    _both(layout, splits(bytes(corrupt), cuts), max_frame_size=4096)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(LAYOUTS), st.lists(st.binary(max_size=600), max_size=12))
def test_garbage(layout: frames.MessageLayout, chunks: list[bytes]) -> None:
    _both(layout, chunks, max_frame_size=1024)


@st.composite
def doubtful_frames(draw: st.DrawFn) -> bytes:
    """A frame whose header may lie: a size off by a little or by far, an unknown type, a
    message too short for its header or for the blocks its layout expects."""
    payload = draw(st.binary(max_size=80))
    size = draw(st.sampled_from([len(payload) + 4, len(payload) + 3, len(payload) + 5, -1, 0,
                                 3, 4, 17, 29, 30, 2**31 - 1]))
    kind = draw(st.sampled_from([0, 1, 2, 2, 2, 3, -1]))
    return size.to_bytes(4, "big", signed=True) + kind.to_bytes(4, "big", signed=True) + payload


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LAYOUTS), streams(), st.lists(doubtful_frames(), min_size=1, max_size=4),
       st.lists(st.integers(0, 10**6), max_size=4))
def test_frames_that_lie(layout: frames.MessageLayout, stream: tuple[Any, bytes, Any],
                         bad: list[bytes], cuts: list[int]) -> None:
    _, good, _ = stream
    data = good + b"".join(bad)
    _both(layout, splits(data, cuts), max_frame_size=1024)
    if layout.youzan and layout.detail:
        _both(layout, splits(data, cuts), max_frame_size=1024, feed_runs=True)


@FAST
@given(streams(), st.lists(st.integers(0, 10**6), max_size=8))
def test_runs_of_any_split(stream: tuple[Any, bytes, Any], cuts: list[int]) -> None:
    layout, data, _ = stream
    if layout.youzan and layout.detail:
        _both(layout, splits(data, cuts), feed_runs=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@FAST
@given(data=st.data())
def test_a_message_reads_the_same(layout: frames.MessageLayout, data: st.DataObject) -> None:
    """Its derived fields and its errors (classic ids that are not hex, ext that is not a
    JSON object) as well as its slots."""
    frame, _ = data.draw(message_frames(layout))
    if layout.ext and data.draw(st.booleans()):
        ext = commands.encode_headers(data.draw(headers))
        frame = frames.encode_message(1, 2, frames.youzan_message_id(3, 4), b"b", layout,
                                      ext_version=4, ext=ext)

    def derived(module: Any) -> list[Any]:
        (msg,) = module.FrameReader(_layout(module, layout)).feed(frame)
        out: list[Any] = []
        for name in ("internal_id", "trace_id", "partition", "headers"):
            try:
                out.append(getattr(msg, name))
            except ProtocolError as exc:
                out.append(("error", str(exc)))
        return [*out, repr(msg).replace(type(msg).__name__, "")]

    assert derived(frames) == derived(pure_frames)


@FAST
@given(st.sampled_from(LAYOUTS), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**16 - 1),
       st.binary(min_size=16, max_size=16), st.binary(max_size=100), st.sampled_from([0, 4]),
       st.binary(max_size=50), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_encoders_write_the_same_bytes(layout: frames.MessageLayout, ts: int, attempts: int,
                                       msg_id: bytes, body: bytes, version: int, ext: bytes,
                                       offset: int, size: int) -> None:
    def encoded(module: Any) -> Any:
        return (module.encode_message(ts, attempts, msg_id, body, _layout(module, layout),
                                      ext_version=version, ext=ext, queue_offset=offset,
                                      raw_size=size),
                module.encode_response(body), module.encode_error(body),
                module.youzan_message_id(offset, size))

    assert encoded(frames) == encoded(pure_frames)


def test_refusals_are_worded_the_same() -> None:
    for module in (frames, pure_frames):
        with pytest.raises(ValueError, match="classic nodes have neither"):
            module.MessageLayout.for_subscription(youzan=False, extend_support=True,
                                                  command="SUB")
        with pytest.raises(ValueError, match="message ids are 16 bytes"):
            module.encode_message(1, 1, b"short", b"b")


def test_the_consumers_message_class_extends_the_compiled_frame() -> None:
    """``smartnsq.Message`` (interpreted) subclasses the compiled ``MessageFrame``: the reader
    decodes straight into it, with its own slots beside the compiled ones."""
    reader = frames.FrameReader(frames.MessageLayout(detail=True), message_class=Message)
    (msg,) = reader.feed(frames.encode_message(5, 1, frames.youzan_message_id(7), b"hi",
                                               frames.MessageLayout(detail=True),
                                               queue_offset=9, raw_size=2))
    assert type(msg) is Message and isinstance(msg, frames.MessageFrame)
    msg._state = 0
    assert (msg.body, msg.queue_offset, msg.internal_id, msg.has_responded) == \
        (b"hi", 9, 7, False)
