"""The error table (docs/protocol.md §5) and the typed server errors built from error frames.

Fatality is checked against what real servers did: after every error frame in the captures,
the recorder noted whether the server closed the connection.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from capture import load, tcp_capture_names

from smartnsq.errors import (
    ERROR_TABLE,
    Action,
    ConnectionClosed,
    ConnectionFailed,
    ErrorSpec,
    InvalidArgument,
    LookupFailed,
    NonRetriableServerError,
    NSQError,
    ProtocolError,
    RefreshLookupError,
    RetriableServerError,
    ServerError,
    Timeout,
    TopicNotFound,
    error_from_payload,
    parse_error_payload,
)
from smartnsq.protocol import commands

# Every code in docs/protocol.md §5's table, with the action the table recommends.
R, T, G = Action.REFRESH_AND_RETRY, Action.RETRY, Action.GIVE_UP
DOCUMENTED = {
    "E_FAILED_ON_NOT_LEADER": R, "E_FAILED_ON_NOT_WRITABLE": R, "E_TOPIC_NOT_EXIST": R,
    "E_PUB_FAILED": T, "E_MPUB_FAILED": T, "E_PUB_TOO_MUCH_WAITING": T,
    "too much client connections": T,
    "E_BAD_PARTITION": G, "E_SUB_ORDER_IS_MUST": G, "E_SUB_EXTEND_NEED": G,
    "E_SUB_EXTEND_FORBIDDON": G, "E_SUB_CHANNEL_NOT_REGISTERED": G, "E_EXT_NOT_SUPPORT": G,
    "E_INVALID_JSON_HEADER": G, "INVALID_TRACE_ID": G, "E_INVALID": G, "E_BAD_TOPIC": G,
    "E_BAD_CHANNEL": G, "E_BAD_MESSAGE": G, "E_BAD_BODY": G, "E_FIN_FAILED": G,
    "E_REQ_FAILED": G, "E_TOUCH_FAILED": G, "E_IDENTIFY_FAILED": G, "E_BAD_PROTOCOL": G,
    "E_AUTH_FIRST": G, "E_AUTH_FAILED": G, "E_UNAUTHORIZED": G, "E_AUTH_DISABLED": G,
    "E_AUTH_ERROR": G, "E_CREATE_TOPIC_FAILED": G, "E_BAD_EXT": G, "E_TAG_NOT_SUPPORT": G,
    "E_BAD_TAG": G,
}
PROTOCOL_DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
ALL_COMMANDS = ["IDENTIFY", "AUTH", "SUB", "SUB_ORDERED", "SUB_ADVANCED", "RDY", "FIN", "REQ",
                "TOUCH", "NOP", "CLS", "PUB", "MPUB", "DPUB", "PUB_TRACE", "MPUB_TRACE",
                "PUB_EXT", "MPUB_EXT", None]


def test_documented_list_matches_protocol_md() -> None:
    text = PROTOCOL_DOC.read_text()
    start = text.index("\n## 5. Error codes")
    section = text[start:text.index("\n## 6.", start)]
    codes = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            codes.update(re.findall(r"`([^`]+)`", first))
    assert codes == set(DOCUMENTED)


def test_every_documented_code_has_exactly_one_row() -> None:
    assert set(ERROR_TABLE) == set(DOCUMENTED)
    for code, action in DOCUMENTED.items():
        spec = ERROR_TABLE[code]
        assert isinstance(spec, ErrorSpec)
        assert spec.code == code
        assert spec.action is action, code
        assert spec.meaning.strip(), code


@pytest.mark.parametrize(("code", "command", "fatal"), [
    # docs/protocol.md §5: fatal after SUB/FIN, not after publishes
    ("E_FAILED_ON_NOT_LEADER", "PUB", False), ("E_FAILED_ON_NOT_LEADER", "MPUB_EXT", False),
    ("E_FAILED_ON_NOT_LEADER", "SUB", True), ("E_FAILED_ON_NOT_LEADER", "SUB_ORDERED", True),
    ("E_FAILED_ON_NOT_LEADER", "FIN", True), ("E_FAILED_ON_NOT_LEADER", None, False),
    ("E_FAILED_ON_NOT_WRITABLE", "PUB_TRACE", False),
    ("E_FAILED_ON_NOT_WRITABLE", "SUB_ADVANCED", True),
    ("E_FAILED_ON_NOT_WRITABLE", "FIN", True),
    ("E_TOPIC_NOT_EXIST", "PUB", True), ("E_TOPIC_NOT_EXIST", "SUB", True),
    ("E_PUB_FAILED", "PUB", False), ("E_MPUB_FAILED", "MPUB", False),
    ("E_PUB_TOO_MUCH_WAITING", "PUB", True), ("too much client connections", None, True),
    ("E_EXT_NOT_SUPPORT", "PUB_EXT", False), ("E_INVALID_JSON_HEADER", "PUB_EXT", False),
    ("INVALID_TRACE_ID", "PUB_EXT", False),
    ("E_FIN_FAILED", "FIN", False), ("E_REQ_FAILED", "REQ", False),
    ("E_TOUCH_FAILED", "TOUCH", False),
    ("E_INVALID", "RDY", True), ("E_INVALID", "FIN", True), ("E_BAD_BODY", "MPUB", True),
    ("E_CREATE_TOPIC_FAILED", None, False), ("E_BAD_EXT", None, True),
])
def test_fatal_per_command(code: str, command: str | None, fatal: bool) -> None:
    assert ERROR_TABLE[code].is_fatal(command) is fatal


@pytest.mark.parametrize("code", sorted(DOCUMENTED))
def test_is_fatal_is_defined_for_every_command(code: str) -> None:
    spec = ERROR_TABLE[code]
    results = {c: spec.is_fatal(c) for c in ALL_COMMANDS}
    assert all(isinstance(r, bool) for r in results.values())
    if spec.fatal_on is None:
        assert all(results.values())
    else:
        assert {c for c, r in results.items() if r} == set(spec.fatal_on)


def _captured_errors() -> list[tuple[str, bytes, bytes, bool]]:
    out = []
    for name in tcp_capture_names():
        cap = load(name)
        for send, replies in cap.exchanges():
            for reply in replies:
                exp = reply.expected
                if exp is not None and exp.kind == "ERROR" and exp.payload is not None:
                    out.append((name, send.data, exp.payload, cap.closed_after(reply)))
    return out


CAPTURED_ERRORS = _captured_errors()


def test_captures_hold_many_error_codes() -> None:
    codes = {parse_error_payload(p)[0] for _, _, p, _ in CAPTURED_ERRORS}
    assert len(codes) >= 20
    assert codes <= set(ERROR_TABLE)


@pytest.mark.parametrize(("name", "sent", "payload", "closed"), CAPTURED_ERRORS,
                         ids=[f"{n}:{p[:30]!r}" for n, _, p, _ in CAPTURED_ERRORS])
def test_captured_error_fatality(name: str, sent: bytes, payload: bytes, closed: bool) -> None:
    """The table's fatality for (code, command) is what the real server did."""
    command = None if sent[:2] == b"  " else commands.command_name(sent)
    err = error_from_payload(payload, command)
    assert err.code in ERROR_TABLE
    assert err.fatal is closed, (err.code, command)
    assert err.command == command
    assert err.text == payload.decode().partition(" ")[2]


@pytest.mark.parametrize(("payload", "code", "text"), [
    (b"E_TOPIC_NOT_EXIST ", "E_TOPIC_NOT_EXIST", ""),
    (b"E_FAILED_ON_NOT_LEADER ", "E_FAILED_ON_NOT_LEADER", ""),
    (b"E_BAD_PROTOCOL", "E_BAD_PROTOCOL", ""),
    (b"E_INVALID invalid command SUB_ORDERED", "E_INVALID", "invalid command SUB_ORDERED"),
    (b"INVALID_TRACE_ID trace id should be uint64", "INVALID_TRACE_ID",
     "trace id should be uint64"),
    (b"too much client connections", "too much client connections", ""),
    (b"E_PUB_FAILED  two  spaces", "E_PUB_FAILED", " two  spaces"),
    (b"", "", ""),
    (b"E_X \xff\xfe", "E_X", "\ufffd\ufffd"),
])
def test_parse_error_payload(payload: bytes, code: str, text: str) -> None:
    assert parse_error_payload(payload) == (code, text)


@pytest.mark.parametrize(("code", "cls"), [
    ("E_FAILED_ON_NOT_LEADER", RefreshLookupError), ("E_TOPIC_NOT_EXIST", RefreshLookupError),
    ("E_PUB_FAILED", RetriableServerError), ("E_PUB_TOO_MUCH_WAITING", RetriableServerError),
    ("E_BAD_TOPIC", NonRetriableServerError), ("E_FIN_FAILED", NonRetriableServerError),
])
def test_typed_error_class(code: str, cls: type[ServerError]) -> None:
    err = error_from_payload(code.encode() + b" some text", "PUB")
    assert type(err) is cls
    assert err.action is ERROR_TABLE[code].action
    assert err.refresh_lookup is (err.action is Action.REFRESH_AND_RETRY)
    assert err.retriable is (err.action is not Action.GIVE_UP)
    assert err.spec is ERROR_TABLE[code]
    assert str(err) == f"{code} some text (after PUB)"


def test_every_row_builds_the_class_of_its_action() -> None:
    classes = {Action.REFRESH_AND_RETRY: RefreshLookupError, Action.RETRY: RetriableServerError,
               Action.GIVE_UP: NonRetriableServerError}
    for code, spec in ERROR_TABLE.items():
        err = error_from_payload(code.encode() + b" x", "SUB")
        assert type(err) is classes[spec.action], code
        assert err.fatal is spec.is_fatal("SUB")


def test_unknown_code_gets_a_safe_default() -> None:
    err = error_from_payload(b"E_SOMETHING_NEW with text", "PUB")
    assert type(err) is NonRetriableServerError
    assert err.code == "E_SOMETHING_NEW" and err.text == "with text"
    assert err.action is Action.GIVE_UP and not err.retriable and not err.refresh_lookup
    assert err.fatal  # assume the server closes: reconnecting is always safe
    assert "E_SOMETHING_NEW" not in ERROR_TABLE
    plain = ServerError("E_WHATEVER")
    assert plain.fatal and plain.action is Action.GIVE_UP and str(plain) == "E_WHATEVER"


def test_fatal_can_be_overridden() -> None:
    assert not ServerError("E_INVALID", "x", "RDY", fatal=False).fatal
    assert ServerError("E_FIN_FAILED", "x", "FIN", fatal=True).fatal


def test_hierarchy() -> None:
    assert issubclass(InvalidArgument, NSQError) and issubclass(InvalidArgument, ValueError)
    assert issubclass(ProtocolError, NSQError)
    assert issubclass(ConnectionClosed, ConnectionFailed) and ConnectionFailed.retriable
    assert issubclass(Timeout, TimeoutError) and issubclass(Timeout, NSQError)
    assert issubclass(TopicNotFound, LookupFailed) and issubclass(LookupFailed, NSQError)
    for cls in (RefreshLookupError, RetriableServerError, NonRetriableServerError):
        assert issubclass(cls, ServerError) and issubclass(cls, NSQError)
    t = TopicNotFound("orders")
    assert t.topic == "orders" and "orders" in str(t)


def test_invalid_argument_fields() -> None:
    err = InvalidArgument("topic", "must match ^[.a-zA-Z0-9_-]+$", "bad*name")
    assert (err.field, err.rule, err.value) == ("topic", "must match ^[.a-zA-Z0-9_-]+$",
                                                "bad*name")
    assert str(err) == "invalid topic 'bad*name': must match ^[.a-zA-Z0-9_-]+$"
    long = InvalidArgument("body", "too big", "x" * 500)
    assert len(str(long)) < 120 and "..." in str(long)


# -- the three flags on every error class ---------------------------------------------------------

def test_every_error_class_has_the_three_flags() -> None:
    from smartnsq.errors import (
        LookupTimeout,
        PlaintextAuthRefused,
        SecurityError,
        TLSVerificationFailed,
    )

    expected = {  # class: (fatal, retriable, refresh_lookup)
        NSQError: (False, False, False),
        InvalidArgument: (False, False, False),
        ProtocolError: (True, False, False),
        ConnectionFailed: (True, True, False),
        ConnectionClosed: (True, True, False),
        Timeout: (False, True, False),
        SecurityError: (True, False, False),
        TLSVerificationFailed: (True, False, False),
        PlaintextAuthRefused: (True, False, False),
        LookupFailed: (False, True, False),
        LookupTimeout: (False, True, False),
        TopicNotFound: (False, False, False),
    }
    for cls, flags in expected.items():
        assert (cls.fatal, cls.retriable, cls.refresh_lookup) == flags, cls.__name__
    assert (RefreshLookupError.retriable, RefreshLookupError.refresh_lookup) == (True, True)
    assert (RetriableServerError.retriable, RetriableServerError.refresh_lookup) == (True, False)
    assert not NonRetriableServerError.retriable and not NonRetriableServerError.refresh_lookup


def test_security_errors_are_one_line_and_say_how_to_proceed() -> None:
    from smartnsq.errors import PlaintextAuthRefused, SecurityError, TLSVerificationFailed

    tls = TLSVerificationFailed("127.0.0.1:4150", "self-signed certificate in certificate chain")
    assert isinstance(tls, SecurityError) and not isinstance(tls, ConnectionFailed)
    assert tls.fatal and not tls.retriable
    assert "\n" not in str(tls) and "self-signed certificate" in str(tls)
    assert "tls_ca_file" in str(tls) and tls.address == "127.0.0.1:4150"
    auth = PlaintextAuthRefused("127.0.0.1:4150")
    assert auth.fatal and not auth.retriable and "allow_plaintext_auth=True" in str(auth)
    assert "\n" not in str(auth)
