"""The dev nsqd's IDENTIFY decoding and value rules, its AUTH table, and its Go-worded errors.

The server side must decide what a malformed IDENTIFY body is as Go's ``json.Unmarshal`` into
nsqd's struct does (wrong types fail the decode, unknown fields and ``null`` are ignored, names
match case-insensitively), apply each flavour's limits with the servers' own texts (youzan:
100 byte / 50 ms buffers, timeouts below 10 ms raised to 10, ``desired_tag``; classic 1.3:
16 KiB / 250 ms, a 25 ms minimum), grant AUTH as nsqd's ``Authorization.IsAllowed`` does, and
word parse failures byte for byte as Go's ``strconv`` and ``%q`` do. Pure functions are tested
directly; the answers a client sees are read off real loopback connections.
"""

from __future__ import annotations

import json
import struct

import pytest
from nsqd_helpers import error_then_close, running

from smartnsq.devcluster.nsqd import identify as ident
from smartnsq.devcluster.nsqd.auth import Authorization, AuthTable, Identity
from smartnsq.devcluster.nsqd.error_frames import (
    ClientError,
    GoParseError,
    as_int64,
    fatal,
    go_atoi,
    go_base10,
    go_bytes,
    go_param_list,
    go_parse_bool,
    go_quote,
    nonfatal,
)
from smartnsq.protocol import commands
from smartnsq.protocol.frames import Response

YOUZAN_LIMITS = ident.IdentifyLimits(max_heartbeat_interval=60_000,
                                     max_output_buffer_size=64 * 1024,
                                     min_output_buffer_timeout=1,
                                     max_output_buffer_timeout=1000,
                                     max_msg_timeout=900_000)
CLASSIC_LIMITS = ident.IdentifyLimits(max_heartbeat_interval=60_000,
                                      max_output_buffer_size=64 * 1024,
                                      min_output_buffer_timeout=25,
                                      max_output_buffer_timeout=30_000,
                                      max_msg_timeout=900_000)


def identify_line(body: bytes) -> bytes:
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body


# -- decoding as Go's json.Unmarshal does ------------------------------------------------------


def test_decode_takes_known_fields_case_insensitively_and_ignores_the_rest() -> None:
    data = ident.decode_identify(json.dumps({
        "Client_ID": "c", "HOSTNAME": "h", "user_agent": "ua/1", "heartbeat_interval": 5000,
        "feature_negotiation": True, "Snappy": True, "sample_rate": 7, "msg_timeout": 2000,
        "unknown": [1, {"x": None}], "output_buffer_size": None}).encode(), youzan=False)
    assert (data.client_id, data.hostname, data.user_agent) == ("c", "h", "ua/1")
    assert (data.heartbeat_interval, data.sample_rate, data.msg_timeout) == (5000, 7, 2000)
    assert data.feature_negotiation and data.snappy and not data.deflate
    assert data.output_buffer_size == 0  # null leaves the zero value


def test_decode_falls_back_to_the_deprecated_short_and_long_ids() -> None:
    data = ident.decode_identify(b'{"short_id": "s", "long_id": "l"}', youzan=True)
    assert (data.client_id, data.hostname) == ("s", "l")
    data = ident.decode_identify(b'{"short_id": "s", "client_id": "c"}', youzan=True)
    assert data.client_id == "c"


def test_null_body_is_all_defaults() -> None:
    assert ident.decode_identify(b"null", youzan=True) == ident.IdentifyData()


def test_youzan_fields_are_read_only_by_youzan() -> None:
    body = b'{"desired_tag": "blue", "extend_support": true, "ext_filter": {"type": 1}}'
    data = ident.decode_identify(body, youzan=True)
    assert (data.desired_tag, data.extend_support, data.ext_filter) == ("blue", True,
                                                                        {"type": 1})
    classic = ident.decode_identify(body, youzan=False)
    assert (classic.desired_tag, classic.extend_support, classic.ext_filter) == ("", False, {})
    # unknown to classic, so not even type-checked there
    assert ident.decode_identify(b'{"desired_tag": 5}', youzan=False).desired_tag == ""
    with pytest.raises(ValueError, match="desired_tag is not a string"):
        ident.decode_identify(b'{"desired_tag": 5}', youzan=True)


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "invalid JSON"),
    (b'{"a": 1} trailing', "invalid JSON"),
    (b"[1, 2]", "not an object"),
    (b'"text"', "not an object"),
    (b'{"client_id": 5}', "client_id is not a string"),
    (b'{"snappy": 1}', "snappy is not a bool"),
    (b'{"heartbeat_interval": "1000"}', "heartbeat_interval is not an integer"),
    (b'{"heartbeat_interval": 1.5}', "heartbeat_interval is not an integer"),
    (b'{"msg_timeout": true}', "msg_timeout is not an integer"),
    (b'{"msg_timeout": 9223372036854775808}', "msg_timeout overflows int64"),
    (b'{"sample_rate": 2147483648}', "sample_rate overflows int32"),
    (b'{"ext_filter": [1]}', "ext_filter is not an object"),
])
def test_decode_failures(body: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        ident.decode_identify(body, youzan=True)


def test_int_bounds_are_the_go_types() -> None:
    data = ident.decode_identify(b'{"msg_timeout": -9223372036854775808, '
                                 b'"sample_rate": 2147483647}', youzan=True)
    assert (data.msg_timeout, data.sample_rate) == (-(1 << 63), (1 << 31) - 1)


@pytest.mark.xfail(strict=True, reason="Go's json.Unmarshal replaces invalid UTF-8 in a "
                                       "string with U+FFFD and succeeds; decode_identify "
                                       "fails the whole body")
def test_invalid_utf8_in_a_string_is_replaced_as_go_does() -> None:
    data = ident.decode_identify(b'{"hostname": "caf\xe9"}', youzan=True)
    assert data.hostname == "caf\ufffd"


@pytest.mark.xfail(strict=True, reason="Go's JSON decoder refuses NaN/Infinity anywhere; "
                                       "Python's json.loads accepts them, so an unknown "
                                       "field holding NaN passes decode_identify")
def test_nan_anywhere_fails_the_decode_as_in_go() -> None:
    with pytest.raises(ValueError):
        ident.decode_identify(b'{"client_id": "a", "future_field": NaN}', youzan=True)


# -- value rules --------------------------------------------------------------------------------


def test_heartbeat_rules() -> None:
    assert ident.heartbeat(-1, 30_000, YOUZAN_LIMITS) == 0  # disabled
    assert ident.heartbeat(0, 30_000, YOUZAN_LIMITS) == 30_000  # keep
    assert ident.heartbeat(1000, 30_000, YOUZAN_LIMITS) == 1000
    assert ident.heartbeat(60_000, 30_000, YOUZAN_LIMITS) == 60_000
    for bad in (999, 60_001, -2):
        with pytest.raises(ValueError, match=rf"^heartbeat interval \({bad}\) is invalid$"):
            ident.heartbeat(bad, 30_000, YOUZAN_LIMITS)


def test_youzan_output_buffer_rules() -> None:
    size = ident.youzan_output_buffer_size
    assert size(-1, 100, YOUZAN_LIMITS) == 1
    assert size(0, 100, YOUZAN_LIMITS) == 100
    assert size(64, 100, YOUZAN_LIMITS) == 64
    assert size(10**9, 100, YOUZAN_LIMITS) == 64 * 1024  # capped, not refused
    with pytest.raises(ValueError, match=r"^output buffer size \(63\) is invalid$"):
        size(63, 100, YOUZAN_LIMITS)
    timeout = ident.youzan_output_buffer_timeout
    assert timeout(-1, 50, YOUZAN_LIMITS) == 0
    assert timeout(0, 50, YOUZAN_LIMITS) == 50
    assert [timeout(v, 50, YOUZAN_LIMITS) for v in (1, 9, 10, 11, 1000)] == [10, 10, 10, 11,
                                                                               1000]
    for bad in (1001, -5):
        with pytest.raises(ValueError, match=rf"^output buffer timeout \({bad}\) is invalid$"):
            timeout(bad, 50, YOUZAN_LIMITS)


def test_classic_output_buffer_rules() -> None:
    rule = ident.classic_output_buffer
    assert rule(0, 0, 16384, 250, CLASSIC_LIMITS) == (16384, 250)
    assert rule(-1, 100, 16384, 250, CLASSIC_LIMITS) == (1, 0)  # no buffering at all
    assert rule(0, -1, 16384, 250, CLASSIC_LIMITS) == (16384, 0)
    assert rule(64, 25, 16384, 250, CLASSIC_LIMITS) == (64, 25)
    assert rule(65536, 30_000, 16384, 250, CLASSIC_LIMITS) == (65536, 30_000)
    with pytest.raises(ValueError, match=r"^output buffer timeout \(24\) is invalid$"):
        rule(0, 24, 16384, 250, CLASSIC_LIMITS)
    with pytest.raises(ValueError, match=r"^output buffer size \(65537\) is invalid$"):
        rule(65537, 0, 16384, 250, CLASSIC_LIMITS)  # classic refuses, youzan caps
    with pytest.raises(ValueError, match=r"^output buffer size \(10\) is invalid$"):
        rule(10, 0, 16384, 250, CLASSIC_LIMITS)


def test_sample_rate_msg_timeout_and_tag_rules() -> None:
    assert [ident.sample_rate(v) for v in (0, 99)] == [0, 99]
    for bad in (-1, 100):
        with pytest.raises(ValueError, match=rf"^sample rate \({bad}\) is invalid$"):
            ident.sample_rate(bad)
    assert ident.msg_timeout(0, 60_000, YOUZAN_LIMITS) == 60_000
    assert ident.msg_timeout(1000, 60_000, YOUZAN_LIMITS) == 1000
    with pytest.raises(ValueError, match=r"^msg timeout \(999\) is invalid$"):
        ident.msg_timeout(999, 60_000, YOUZAN_LIMITS)
    assert ident.desired_tag("Tag_1-x") == "Tag_1-x"
    assert ident.desired_tag("a" * 100) == "a" * 100
    with pytest.raises(ValueError, match=r"^invalid tag len 101, exceed limit 100$"):
        ident.desired_tag("a" * 101)
    with pytest.raises(ValueError, match=r"^invalid tag len 102, exceed limit 100$"):
        ident.desired_tag("é" * 51)  # bytes count, not characters
    with pytest.raises(ValueError, match=r"^invalid tag bad tag$"):
        ident.desired_tag("bad tag")


def test_a_tag_with_a_trailing_newline_is_invalid() -> None:
    # Go's regexp (youzan's ext.ValidateTag) has no "$ before a final newline"
    with pytest.raises(ValueError, match="invalid tag"):
        ident.desired_tag("blue\n")


# -- what a client sees over the wire -----------------------------------------------------------


async def test_youzan_identify_answers_its_own_buffer_defaults_and_tag() -> None:
    async with running(1) as yz:
        node = yz.nodes[0]
        client = await yz.raw(node)
        answer = await client.call(commands.identify({"feature_negotiation": True,
                                                      "desired_tag": "blue"}))
        assert isinstance(answer, Response)
        got = json.loads(answer.data)
        assert (got["output_buffer_size"], got["output_buffer_timeout"]) == (100, 50)
        assert got["desired_tag"] == "blue" and got["auth_required"] is False
        client = await yz.raw(node)
        got = json.loads((await client.call(commands.identify({
            "feature_negotiation": True, "output_buffer_timeout": 3,
            "output_buffer_size": 10**7}))).data)
        assert (got["output_buffer_size"], got["output_buffer_timeout"]) == (65536, 10)
        assert "desired_tag" not in got
        # without feature negotiation the answer is a bare OK
        client = await yz.raw(node)
        assert await client.call(commands.identify({"client_id": "x"})) == Response(b"OK")
        for body, text in (
                (b'{"output_buffer_size": 10}',
                 b"E_BAD_BODY IDENTIFY output buffer size (10) is invalid"),
                (b'{"desired_tag": "no spaces"}',
                 b"E_BAD_BODY IDENTIFY invalid tag no spaces"),
                (b'{"sample_rate": 100}', b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
                (b'{"heartbeat_interval": "30000"}',
                 b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
                (b"[]", b"E_BAD_BODY IDENTIFY failed to decode JSON body")):
            bad = await yz.raw(node)
            assert await error_then_close(bad, identify_line(body)) == text, body


async def test_classic_identify_without_buffering() -> None:
    async with running(1, classic=True) as cl:
        client = await cl.raw(cl.nodes[0])
        got = json.loads((await client.call(commands.identify({
            "feature_negotiation": True, "output_buffer_size": -1,
            "output_buffer_timeout": 500}))).data)
        assert (got["output_buffer_size"], got["output_buffer_timeout"]) == (1, 0)
        assert "desired_tag" not in got
        bad = await cl.raw(cl.nodes[0])
        assert await error_then_close(bad, identify_line(b'{"output_buffer_size": 70000}')) \
            == b"E_BAD_BODY IDENTIFY output buffer size (70000) is invalid"


# -- AUTH table ----------------------------------------------------------------------------------


def test_authorization_checks_permission_topic_and_channels_as_nsqd() -> None:
    grant = Authorization("^orders", ("^billing$", "audit"), ("subscribe",))
    assert grant.allows("orders_eu", "billing")
    assert grant.allows("orders", "x_audit_y")  # unanchored patterns search, as Go's
    assert not grant.allows("orders", "billing2")
    assert not grant.allows("eu_orders", "billing")
    assert not grant.allows("orders", "")  # a PUB needs "publish"
    publish = Authorization(".*", (".*",), ("publish",))
    assert publish.allows("t", "") and not publish.allows("t", "ch")
    who = Identity("svc", (grant, publish))
    assert who.allows("orders", "billing") and who.allows("other", "")
    assert not Identity("nobody").allows("t", "")


def test_auth_table_is_built_from_the_auth_servers_answer_format() -> None:
    assert AuthTable.build(None) is None
    table = AuthTable.build({
        "good": {"identity": "x", "identity_url": "http://who/x",
                 "authorizations": [{"topic": "^allowed_", "channels": [".*"],
                                     "permissions": ["subscribe", "publish"]},
                                    Authorization("^audit$", ("^ro$",), ("subscribe",))]},
        "empty": {"identity": "y", "authorizations": None},
        "partial": {"authorizations": [{"topic": "t"}]},
        7: Identity("seven"),
    })
    assert table is not None and AuthTable.build(table) is table
    good = table.lookup("good")
    assert good is not None
    assert (good.identity, good.identity_url, len(good.authorizations)) == ("x", "http://who/x",
                                                                           2)
    assert good.allows("allowed_t", "") and good.allows("audit", "ro")
    assert not good.allows("audit", "")
    empty = table.lookup("empty")
    assert empty is not None and empty.authorizations == ()
    partial = table.lookup("partial")
    assert partial is not None and partial.identity == ""
    # a grant without channels or permissions allows nothing, as nsqd's nil lists do
    assert partial.authorizations == (Authorization("t", (), ()),)
    assert not partial.allows("t", "")
    assert table.lookup("7") == Identity("seven")
    assert table.lookup("missing") is None


def test_auth_table_refuses_values_of_other_types() -> None:
    with pytest.raises(TypeError, match="auth table values are Identity or mappings"):
        AuthTable.build({"s": ["not", "a", "mapping"]})
    with pytest.raises(TypeError, match="authorizations are Authorization or mappings"):
        AuthTable.build({"s": {"authorizations": ["^t$"]}})


async def test_auth_answer_and_refusals_on_the_wire() -> None:
    table = {"ro": {"identity": "reader", "identity_url": "http://id/reader",
                    "authorizations": [{"topic": "^t$", "channels": ["^c$"],
                                        "permissions": ["subscribe"]}]}}
    async with running(1, auth=table) as yz:
        yz.topic("t", channels=["c"])
        client = await yz.client(yz.nodes[0])
        assert await client.call(commands.auth("ro")) == Response(
            b'{"identity":"reader","identity_url":"http://id/reader","permission_count":1}')
        assert await error_then_close(client, commands.pub("t", b"x", 0)) == \
            b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""'
        client = await yz.client(yz.nodes[0])
        assert isinstance(await client.call(commands.auth("ro")), Response)
        assert await error_then_close(client, commands.sub("t", "other", 0)) == \
            b'E_UNAUTHORIZED AUTH failed for SUB on "t" "other"'
        client = await yz.client(yz.nodes[0])
        assert isinstance(await client.call(commands.auth("ro")), Response)
        assert await client.call(commands.sub("t", "c", 0)) == Response(b"OK")


# -- Go-worded errors ------------------------------------------------------------------------


def test_client_error_payloads() -> None:
    err = fatal("E_INVALID", "bad thing")
    assert (err.fatal, err.payload, str(err)) == (True, b"E_INVALID bad thing",
                                                  "E_INVALID bad thing")
    quiet = nonfatal("E_FIN_FAILED", b"\xff")
    assert not quiet.fatal and quiet.payload == b"E_FIN_FAILED \xff"
    assert str(quiet) == "E_FIN_FAILED \ufffd"
    assert ClientError("E_X").payload == b"E_X "  # the space stays, as in Go


def test_go_quote_escapes_as_strconv_quote() -> None:
    assert go_quote("plain") == '"plain"'
    assert go_quote(b'tab\there "q" back\\') == '"tab\\there \\"q\\" back\\\\"'
    assert go_quote(b"\x07\x08\x0c\n\r\x0b") == '"\\a\\b\\f\\n\\r\\v"'
    assert go_quote(b"\x00\x1f\x7f") == '"\\x00\\x1f\\x7f"'
    assert go_quote(b"a\xffb\xc3") == '"a\\xffb\\xc3"'  # bytes that are not UTF-8
    assert go_quote("caf\u00e9 \U0001f600") == '"caf\u00e9 \U0001f600"'  # printable kept
    assert go_quote("\u00ad\u200b") == '"\\u00ad\\u200b"'  # format characters escaped
    assert go_quote("\U000e0001") == '"\\U000e0001"'


def test_go_bytes_and_param_lists() -> None:
    assert go_bytes(b"") == "[]"
    assert go_bytes(b"\x01AB") == "[1 65 66]"
    assert go_param_list([b"FIN", b"\x00"]) == "[[70 73 78] [0]]"
    assert go_param_list([]) == "[]"


def test_go_atoi_and_parse_bool() -> None:
    assert [go_atoi(v) for v in (b"0", b"-12", b"+7", b"007")] == [0, -12, 7, 7]
    assert go_atoi(b"9223372036854775807") == (1 << 63) - 1
    for bad in (b"", b" 1", b"1.0", b"0x10", b"--1"):
        with pytest.raises(GoParseError) as caught:
            go_atoi(bad)
        assert str(caught.value) == f"strconv.Atoi: parsing {go_quote(bad)}: invalid syntax"
    with pytest.raises(GoParseError, match=r'^strconv\.Atoi: parsing "-9223372036854775809": '
                                           r'value out of range$'):
        go_atoi(b"-9223372036854775809")
    assert all(go_parse_bool(v) for v in (b"1", b"t", b"T", b"TRUE", b"true", b"True"))
    assert not any(go_parse_bool(v) for v in (b"0", b"f", b"F", b"FALSE", b"false", b"False"))
    for bad in (b"yes", b"tRUE", b""):
        with pytest.raises(GoParseError) as caught:
            go_parse_bool(bad)
        assert str(caught.value) == \
            f"strconv.ParseBool: parsing {go_quote(bad)}: invalid syntax"


def test_go_base10_wraps_like_uint64_and_as_int64_reinterprets() -> None:
    assert go_base10(b"") == 0
    assert go_base10(b"1234") == 1234
    assert go_base10(b"18446744073709551616") == 0  # 2**64 wraps
    assert go_base10(b"18446744073709551617") == 1
    for bad in (b"-1", b"1a", b" 1"):
        with pytest.raises(GoParseError, match=r"^failed to convert to Base10$"):
            go_base10(bad)
    assert as_int64(5) == 5
    assert as_int64((1 << 63) - 1) == (1 << 63) - 1
    assert as_int64(1 << 63) == -(1 << 63)
    assert as_int64(go_base10(b"18446744073709551615")) == -1
