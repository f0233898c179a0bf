"""Hot paths do each piece of work once: the producer validates once and encodes ext headers
once (the unchecked encoders produce the very bytes the checked ones do), and a delivered
message parses its ext header once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smartnsq.errors import InvalidArgument
from smartnsq.model.dialect import DEFAULT_POLICY as CLASSIC
from smartnsq.producer import encoding
from smartnsq.protocol import commands, frames
from smartnsq.protocol import validate as v

H = {"app": "billing", "region": "eu-1"}
NODE = ("127.0.0.1", 4150)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of topic regex checks and JSON encodings."""
    counts = {"check_topic": 0, "dumps": 0}
    check_topic, dumps = v.check_topic, json.dumps

    def counting_check_topic(name: str) -> str:
        counts["check_topic"] += 1
        return check_topic(name)

    def counting_dumps(*args: Any, **kwargs: Any) -> str:
        counts["dumps"] += 1
        return dumps(*args, **kwargs)

    monkeypatch.setattr(v, "check_topic", counting_check_topic)
    monkeypatch.setattr(commands.json, "dumps", counting_dumps)
    return counts


def test_producer_encodes_without_validating_again(calls: dict[str, int]) -> None:
    plain = encoding.encode_one(True, NODE, "orders", 3, b"body", None, None, None, False,
                                CLASSIC)
    traced = encoding.encode_one(True, NODE, "orders", 3, b"body", 77, None, None, True,
                                 CLASSIC)
    batch = encoding.encode_batch(True, NODE, "orders", 3, [b"a", b"b"], None, None, False,
                                  v.DEFAULT_MAX_BODY_SIZE, CLASSIC)
    assert calls["check_topic"] == 0
    assert plain[0] == commands.pub("orders", b"body", 3)
    assert traced[0] == commands.pub_trace("orders", b"body", 77, 3)
    assert batch[0] == commands.mpub("orders", [b"a", b"b"], 3)


def test_pub_ext_headers_are_encoded_once(calls: dict[str, int]) -> None:
    ext = encoding.encode_headers(H, 5)
    data, command, traced = encoding.encode_one(True, NODE, "orders", 3, b"body", 5, ext,
                                                None, True, CLASSIC)
    assert calls["dumps"] == 1
    assert command == "PUB_EXT" and traced
    assert data == commands.pub_ext("orders", b"body", {**H, v.TRACE_ID_HEADER: "5"}, 3)


def test_a_shared_mapping_is_encoded_once_per_batch(calls: dict[str, int]) -> None:
    bodies = [b"m%d" % i for i in range(50)]
    exts = encoding.batch_exts(H, None, len(bodies))
    traced_exts = encoding.batch_exts(H, list(range(1, 51)), len(bodies))
    listed = encoding.batch_exts([H, None, H], None, 3)
    assert calls["dumps"] == 3
    data = encoding.encode_batch(True, NODE, "orders", 3, bodies, None, exts, True,
                                 v.DEFAULT_MAX_BODY_SIZE, CLASSIC)[0]
    assert data == commands.mpub_ext("orders", [(H, b) for b in bodies], 3)
    traced = encoding.encode_batch(True, NODE, "orders", 3, bodies, list(range(1, 51)),
                                   traced_exts, True, v.DEFAULT_MAX_BODY_SIZE, CLASSIC)[0]
    assert traced == commands.mpub_ext(
        "orders", [({**H, v.TRACE_ID_HEADER: str(i + 1)}, b) for i, b in enumerate(bodies)], 3)
    assert listed == [commands.encode_headers(H), b"{}", commands.encode_headers(H)]


def test_batch_trace_ids_override_a_mapping_trace_header() -> None:
    own = {**H, v.TRACE_ID_HEADER: "9"}
    assert encoding.batch_exts([own, None], [1, 2], 2) == [
        commands.encode_headers({**H, v.TRACE_ID_HEADER: "1"}),
        commands.encode_headers({v.TRACE_ID_HEADER: "2"})]


def test_ext_with_trace_matches_encoding_the_merged_mapping() -> None:
    for headers in ({}, H, {"k": "ß\"q"}):
        assert commands.ext_with_trace(commands.encode_headers(headers), 2**64 - 1) == \
            commands.encode_headers({**headers, v.TRACE_ID_HEADER: str(2**64 - 1)})
    with pytest.raises(InvalidArgument):
        commands.ext_with_trace(b"{}", -1)
    big = commands.encode_headers({"k": "x" * (v.MAX_EXT_LENGTH - 10)})
    with pytest.raises(InvalidArgument):
        commands.ext_with_trace(big, 1)


def test_public_encoders_still_validate() -> None:
    with pytest.raises(InvalidArgument):
        commands.pub("bad topic", b"x")
    with pytest.raises(InvalidArgument):
        commands.pub("t", b"x", 5000)
    with pytest.raises(InvalidArgument):
        commands.pub_ext("t", b"", H)


def test_message_headers_are_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = frames.MessageFrame(1, 1, b"\x00" * 16, b"body", 4, b'{"a":"1","n":2}')
    loads = json.loads
    parsed = []

    def counting_loads(*args: Any, **kwargs: Any) -> Any:
        parsed.append(args)
        return loads(*args, **kwargs)

    monkeypatch.setattr(frames.json, "loads", counting_loads)
    first = msg.headers
    assert first == {"a": "1", "n": "2"}
    assert msg.headers is first and msg.headers is first
    assert len(parsed) == 1
    assert frames.MessageFrame(1, 1, b"\x00" * 16, b"body").headers == {}
