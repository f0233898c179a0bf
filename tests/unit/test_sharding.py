"""Sharding must match the Go and Java clients bit for bit (docs/protocol.md §6.2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import InvalidArgument
from smartnsq.model.sharding import (
    java_hash_code,
    java_partition,
    key_bytes,
    make_router,
    murmur3_hash,
    murmur3_partition,
)

# spaolacci/murmur3's own table (seed 0), as docs/protocol.md §6.2 lists it
MURMUR_VECTORS = [
    (b"", 0x00000000),
    (b"hello", 0x248BFA47),
    (b"hello, world", 0x149BBB7F),
    (b"19 Jan 2038 at 3:14:07 AM", 0xE31E8A70),
    (b"The quick brown fox jumps over the lazy dog.", 0xD5C48BFC),
]


@pytest.mark.parametrize(("key", "expected"), MURMUR_VECTORS)
def test_murmur3_vectors(key: bytes, expected: int) -> None:
    assert murmur3_hash(key) == expected


def test_murmur3_partitions_from_the_protocol_doc() -> None:
    assert murmur3_partition(b"hello", 4) == 3
    assert murmur3_partition(b"hello", 16) == 7
    assert murmur3_partition(b"hello, world", 16) == 15
    assert murmur3_partition(b"", 7) == 0


def test_str_and_int_keys_hash_as_utf8_and_decimal_text() -> None:
    assert murmur3_hash("hello") == murmur3_hash(b"hello")
    assert murmur3_hash("héllo") == murmur3_hash("héllo".encode())
    assert murmur3_hash(12345) == murmur3_hash(b"12345")
    assert murmur3_hash(-7) == murmur3_hash(b"-7")
    assert murmur3_hash(bytearray(b"hello")) == 0x248BFA47
    assert murmur3_hash(memoryview(b"hello")) == 0x248BFA47
    assert key_bytes(0) == b"0"


@pytest.mark.parametrize(("key", "expected"), [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("Aa", 2112),
    ("BB", 2112),
    ("polygenelubricants", -2147483648),  # the classic Integer.MIN_VALUE string
    ("\U0001F600", 1772899),  # a surrogate pair: 0xD83D * 31 + 0xDE00
    ("中文", 646394),  # 0x4E2D * 31 + 0x6587
    (0, 0),
    (42, 42),
    (-1, 0),  # Long.hashCode(-1L)
    (1 << 32, 1),
    ((1 << 63) - 1, -2147483648),
])
def test_java_hash_code(key: str | int, expected: int) -> None:
    assert java_hash_code(key) == expected


def test_java_partition_uses_truncating_remainder_then_abs() -> None:
    assert java_partition("hello", 4) == 2  # docs/protocol.md §6.2: 99162322 % 4
    assert java_partition("polygenelubricants", 3) == 2  # |-2147483648 % 3| = |-2| = 2
    assert java_partition(b"hello", 4) == 2
    assert java_partition(7, 4) == 3


def test_go_and_java_disagree_on_hello() -> None:
    assert murmur3_partition("hello", 4) != java_partition("hello", 4)


@pytest.mark.parametrize("bad", [1.5, None, True, object(), ["a"]])
def test_bad_keys_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        murmur3_hash(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        java_hash_code(bad)  # type: ignore[arg-type]


def test_java_refuses_ints_beyond_long_and_non_utf8_bytes() -> None:
    with pytest.raises(InvalidArgument):
        java_hash_code(1 << 63)
    with pytest.raises(InvalidArgument):
        java_hash_code(b"\xff\xfe")


def test_make_router() -> None:
    assert make_router() is murmur3_partition
    assert make_router("murmur3") is murmur3_partition
    assert make_router("java") is java_partition
    route = make_router(lambda key, n: len(str(key)) % n)
    assert route("abc", 2) == 1
    with pytest.raises(InvalidArgument):
        make_router("crc32")  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [-1, 4, 1.0, None, True])
def test_user_router_answers_are_checked(answer: object) -> None:
    route = make_router(lambda key, n: answer)  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidArgument, match="sharding function result"):
        route("k", 4)


@given(st.binary(), st.integers(min_value=1, max_value=1024))
def test_murmur3_partition_in_range(key: bytes, n: int) -> None:
    assert 0 <= murmur3_partition(key, n) < n


@given(st.text(), st.integers(min_value=1, max_value=1024))
def test_java_string_hash_matches_the_definition(key: str, n: int) -> None:
    units = key.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = h * 31 + int.from_bytes(units[i:i + 2], "big")
    h &= 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    assert java_hash_code(key) == signed
    assert 0 <= java_partition(key, n) < n


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_java_long_hash(value: int) -> None:
    u = value & 0xFFFFFFFFFFFFFFFF
    expected = (u ^ (u >> 32)) & 0xFFFFFFFF
    expected = expected - (1 << 32) if expected >= 1 << 31 else expected
    assert java_hash_code(value) == expected
