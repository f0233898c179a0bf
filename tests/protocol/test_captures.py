"""Whole captures: every recorded exchange is accounted for, and conversations hang together.

test_commands.py and test_frames.py check each client command and each server frame; this
file checks that nothing in the captures escapes them, and the properties that only show
across an exchange: message ids are echoed back raw, as received, in FIN/REQ/TOUCH.
"""

from __future__ import annotations

import hashlib

import pytest
from capture import FIXTURES, load, tcp_capture_names

from smartnsq.protocol import commands
from smartnsq.protocol.frames import CLASSIC_LAYOUT, FrameReader, MessageFrame, MessageLayout

CAPTURES = tcp_capture_names()
# The captures are what the real servers sent: a test that disagrees with one is fixed, never
# the capture. A new or re-recorded capture changes these on purpose, in the same commit.
FIXTURE_FILES = 131
FIXTURES_SHA256 = "1ab4ec2a837a9f52a9dff9210934499f3ecf7a4d267eff6907f9803b90700be0"

COMMAND_NAMES = {b"IDENTIFY", b"AUTH", b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED", b"RDY", b"FIN",
                 b"REQ", b"TOUCH", b"NOP", b"CLS", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE",
                 b"MPUB_TRACE", b"PUB_EXT"}
# client bytes in the captures that are deliberately not a command we send
NOT_OURS = {b"  V1", b"SUB_ORDER"}


def test_captures_present() -> None:
    assert len([n for n in CAPTURES if n.startswith("classic/tcp_")]) == 30
    assert len([n for n in CAPTURES if n.startswith("youzan/tcp_")]) == 16
    assert len([n for n in CAPTURES if "failover" in n]) == 3


def test_fixtures_are_unchanged_recordings() -> None:
    files = sorted(path for path in FIXTURES.rglob("*") if path.is_file())
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(FIXTURES).as_posix().encode()
        digest.update(name + b"\0" + path.read_bytes() + b"\0")
    assert len(files) == FIXTURE_FILES, [p.relative_to(FIXTURES).as_posix() for p in files]
    assert digest.hexdigest() == FIXTURES_SHA256, "a capture changed: git diff tests/fixtures"


def test_classic_index_lists_every_tcp_capture() -> None:
    index = (FIXTURES / "classic" / "INDEX.md").read_text()
    for name in CAPTURES:
        if name.startswith("classic/"):
            assert name.split("/")[1] in index


@pytest.mark.parametrize("name", CAPTURES)
def test_every_exchange_is_accounted_for(name: str) -> None:
    cap = load(name)
    assert cap.header and cap.events
    for event in cap.events:
        if not event.nsq:
            assert event.transport in ("snappy", "deflate")
            continue
        if event.direction == "recv":
            exp = event.expected
            assert exp is not None, event
            (frame,) = FrameReader(CLASSIC_LAYOUT if cap.flavor == "classic"
                                   else MessageLayout()).feed(event.data)
            assert type(frame).__name__ in {"RESPONSE": ("Response", "Heartbeat"),
                                            "ERROR": ("ErrorFrame",),
                                            "MESSAGE": ("MessageFrame",)}[exp.kind]
        elif event.data != commands.MAGIC_V2:
            word = event.data.split(b"\n")[0].split(b" ")[0]
            assert word in COMMAND_NAMES or event.data[:9] in NOT_OURS or word in NOT_OURS, event
            assert commands.command_name(event.data) == word.decode()


def _layout(name: str) -> MessageLayout:
    if name.startswith("classic/"):
        return CLASSIC_LAYOUT
    return {"youzan/tcp_07_sub_advanced_detail.txt": MessageLayout(detail=True),
            "youzan/tcp_14_ordered_sub_ordered_consume.txt": MessageLayout(detail=True),
            "youzan/tcp_15_ext_topic.txt": MessageLayout(ext=True)}.get(name, MessageLayout())


# FIN/REQ/TOUCH the recorder sent on purpose with an id that was never delivered
DELIBERATELY_UNKNOWN = {b"0123456789abcdef", b"01234567"}


def check_echoes(name: str) -> int:
    """Every FIN/REQ/TOUCH carries the 16 bytes of a message delivered earlier, unchanged,
    and our encoders rebuild the command from the decoded message's ``id``. Returns how many
    commands were checked."""
    cap = load(name)
    reader = FrameReader(_layout(name))
    seen: dict[bytes, MessageFrame] = {}
    checked = 0
    for event in cap.events:
        if not event.nsq:
            continue
        if event.direction == "recv":
            for frame in reader.feed(event.data):
                if isinstance(frame, MessageFrame):
                    seen[frame.id] = frame
            continue
        data = event.data
        if data.startswith((b"FIN ", b"TOUCH ")):
            raw = data[data.index(b" ") + 1:-1]
        elif data.startswith(b"REQ "):
            raw = data[4:20]
        else:
            continue
        if raw in DELIBERATELY_UNKNOWN:
            continue
        assert raw in seen, event  # (tcp_06 re-finishes a finished id: delivered before)
        msg = seen[raw]
        if data.startswith(b"FIN "):
            assert commands.fin(msg.id) == data
        elif data.startswith(b"TOUCH "):
            assert commands.touch(msg.id) == data
        else:
            assert commands.req(msg.id, int(data[21:-1])) == data
        checked += 1
    return checked


@pytest.mark.parametrize("name", CAPTURES)
def test_ids_are_echoed_raw(name: str) -> None:
    check_echoes(name)


def test_ids_echoed_in_many_captures() -> None:
    counts = [check_echoes(name) for name in CAPTURES]
    assert sum(counts) >= 30
    assert sum(1 for n in counts if n) >= 10


def test_requeued_message_keeps_id_and_timestamp() -> None:
    """classic tcp_08 and youzan tcp_06: redelivery after REQ has attempts + 1, same id."""
    for name, layout in (("classic/tcp_08_sub_rdy_fin_req_touch.txt", CLASSIC_LAYOUT),
                         ("youzan/tcp_06_sub_rdy_fin_req_touch.txt", MessageLayout())):
        reader = FrameReader(layout)
        msgs = [f for e in load(name).frames() for f in reader.feed(e.data)
                if isinstance(f, MessageFrame)]
        again = [m for m in msgs if m.attempts == 2]
        assert again
        for m in again:
            first = next(x for x in msgs if x.id == m.id and x.attempts == 1)
            assert first.timestamp == m.timestamp and first.body == m.body
