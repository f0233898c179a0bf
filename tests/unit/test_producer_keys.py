"""Sharding keys a producer refuses or hashes (a lone-surrogate key is refused by validation; it
once escaped as UnicodeEncodeError)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import InvalidArgument
from smartnsq.model import sharding
from smartnsq.model.sharding import java_hash_code, key_bytes, murmur3_partition
from smartnsq.producer.validation import Checks


@pytest.mark.parametrize("key", ["\ud800", "ok\udfff", "\udc00\ud800"])
def test_a_lone_surrogate_has_no_bytes_to_hash(key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        key_bytes(key)
    assert caught.value.field == "sharding_key"
    with pytest.raises(InvalidArgument, match="sharding_key"):
        murmur3_partition(key, 4)
    with pytest.raises(InvalidArgument, match="sharding_key"):
        Checks(100, 100, True).target(key, None)


def test_java_hashes_utf16_code_units_as_java_does() -> None:
    assert java_hash_code("\ud800") == 0xD800  # a one-char String's hashCode is the char
    assert java_hash_code("a\ud800") == 31 * ord("a") + 0xD800
    assert java_hash_code("\U0001f600") == 31 * 0xD83D + 0xDE00  # a surrogate pair


def test_valid_keys_still_hash() -> None:
    assert key_bytes("héllo") == "héllo".encode()
    assert key_bytes(42) == b"42"
    Checks(100, 100, False).target("\ud800", None)  # a user scheme judges its own keys


def test_common_keys_are_checked_without_building_their_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish checks its key once and hashes it once: ASCII text, bytes and ints need no
    bytes built to be known hashable; other text is encoded to find lone surrogates."""
    built: list[object] = []
    real = sharding.key_bytes

    def counting(key: sharding.ShardingKey) -> bytes:
        built.append(key)
        return real(key)

    monkeypatch.setattr(sharding, "key_bytes", counting)
    checks = Checks(100, 100, True)
    for key in ("order-1", b"raw", 42):
        checks.target(key, None)
    assert built == []
    checks.target("caf\u00e9", None)
    assert built == ["caf\u00e9"]
    with pytest.raises(InvalidArgument, match="sharding_key"):
        checks.target(1.5, None)  # type: ignore[arg-type]


keys = st.one_of(st.text(), st.binary(), st.integers(), st.booleans(), st.floats(),
                 st.none(), st.builds(bytearray, st.binary()), st.tuples(st.integers()))


@given(key=keys, key_check=st.booleans())
def test_a_publish_refuses_exactly_the_keys_check_key_refuses(key: object,
                                                              key_check: bool) -> None:
    """``Checks.one`` lets the common keys through without calling ``check_key`` (once a
    publish); what it accepts and refuses must be what the full check does."""
    checks = Checks(100, 100, key_check)

    def refused(check: Callable[[], object]) -> bool:
        try:
            check()
        except InvalidArgument:
            return True
        return False

    sharding_key: Any = key
    full = refused(lambda: checks.target(sharding_key, None))
    one = refused(lambda: checks.one("t", b"x", sharding_key, None, None, None, None))
    assert one == full
