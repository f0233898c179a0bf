"""Which answers show a lookupd address is the wrong kind of server (a configuration error,
failed at once) and which may be a lookupd having a bad moment (retried)."""

from __future__ import annotations

import json

import pytest

from smartnsq.errors import LookupdRequestFailed, LookupFailed
from smartnsq.protocol.diagnose import not_lookupd

PAGE = b"<!DOCTYPE html><html><body>hi</body></html>"


@pytest.mark.parametrize(("status", "body", "path"), [
    (404, json.dumps({"message": "NOT_FOUND"}).encode(), "/lookup"),  # nsqd's HTTP API
    (404, b"NOT_FOUND", "/lookup"),
    (404, json.dumps({"status_code": 404, "status_txt": "NOT_FOUND", "data": None}).encode(),
     "/lookup"),
    (200, PAGE, "/lookup"),  # some web server
    (404, PAGE, "/listlookup"),
    (403, PAGE, "/lookup"),
])
def test_wrong_kind(status: int, body: bytes, path: str) -> None:
    assert not_lookupd(status, body, path)


@pytest.mark.parametrize(("status", "body", "path"), [
    (502, PAGE, "/lookup"),  # a proxy's error page: the lookupd behind it may come back
    (503, b"", "/lookup"),
    (404, json.dumps({"message": "TOPIC_NOT_FOUND"}).encode(), "/lookup"),
    (404, json.dumps({"message": "NOT_FOUND"}).encode(), "/listlookup"),  # a classic lookupd
    (200, b'{"producers": []}', "/lookup"),
    (200, b"not json", "/lookup"),
])
def test_maybe_a_lookupd(status: int, body: bytes, path: str) -> None:
    assert not not_lookupd(status, body, path)


def test_flags() -> None:
    assert LookupdRequestFailed("h:1", "refused", "x").retriable
    assert not LookupdRequestFailed("h:1", "malformed", "x", retriable=False).retriable
    assert LookupFailed("x").retriable
    assert not LookupFailed("x", retriable=False).retriable
