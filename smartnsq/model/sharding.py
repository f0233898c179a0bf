"""Which partition a sharding key goes to (docs/protocol.md §6.2).

Producers of one topic must agree on this, whatever their language, or the order of a key's
messages is lost: two producers that hash the same key differently write it to two partitions.
So the schemes here reproduce the other clients bit for bit:

``"murmur3"`` (the default)
    youzan's Go client as every youzan example configures it: MurmurHash3 x86_32, seed 0, over
    the key's bytes, taken as unsigned, modulo ``partition_num``. ``str`` keys are hashed as
    UTF-8, ``int`` keys as their decimal text (what Go code gets from ``strconv``).
``"java"``
    youzan's Java client: ``|key.hashCode() % partition_num|`` with Java's truncating ``%``.
    ``str`` keys use ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around), ``int`` keys
    ``Long.hashCode`` (equal to ``Integer.hashCode`` for 0..2**31-1), ``bytes`` are decoded as
    UTF-8 first (Java hashes a ``byte[]`` by identity, so no Java producer can share those).
a callable ``f(key, partition_num) -> int``
    any other scheme; its answer is checked to be in ``0..partition_num-1``.

Go and Java route the same key to different partitions (``"hello"`` with 4 partitions: 3 vs
2); pick one scheme per topic and use it in every producer of that topic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import mmh3

from ..errors import InvalidArgument
from ..protocol.numbers import check_int, is_int
from .sharding_schemes import DEFAULT_SCHEME, SCHEMES, SchemeName

__all__ = [
    "SCHEMES",
    "Router",
    "ShardingKey",
    "ShardingScheme",
    "check_key",
    "java_hash_code",
    "java_partition",
    "key_bytes",
    "make_router",
    "murmur3_hash",
    "murmur3_partition",
]

ShardingKey: TypeAlias = "str | bytes | bytearray | memoryview | int"
Router: TypeAlias = Callable[[ShardingKey, int], int]
ShardingScheme: TypeAlias = "SchemeName | Router"

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_MASK32 = 0xFFFFFFFF


def key_bytes(key: ShardingKey) -> bytes:
    """The bytes the Go client would hash for ``key``."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 (nor Go string) holds it
            raise InvalidArgument("sharding_key", "must be valid Unicode text (it has a lone "
                                  "surrogate, which UTF-8 cannot encode)", key) from None
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    if is_int(key):
        return b"%d" % key
    raise InvalidArgument("sharding_key", "must be str, bytes or int", key)


def check_key(key: ShardingKey) -> None:
    """Refuse a key no scheme can hash (as :func:`key_bytes` would), without building its
    bytes for the common keys: a publish checks its key once and hashes it once."""
    kind = key.__class__
    if kind is bytes or kind is int or (kind is str and key.isascii()):  # type: ignore[union-attr]
        return
    key_bytes(key)


def murmur3_hash(key: ShardingKey) -> int:
    """MurmurHash3 x86_32, seed 0, unsigned: ``b"hello"`` -> ``0x248bfa47``."""
    return mmh3.hash(key_bytes(key), 0, signed=False)


def murmur3_partition(key: ShardingKey, partition_num: int) -> int:
    """The Go client's partition for ``key``: ``murmur3(key) % partition_num``."""
    if key.__class__ is str and key.isascii():
        return mmh3.hash(key, 0, signed=False) % partition_num  # (mmh3 hashes its UTF-8)
    return mmh3.hash(key_bytes(key), 0, signed=False) % partition_num


def _to_int32(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def java_hash_code(key: ShardingKey) -> int:
    """Java's ``hashCode()`` of the value a Java producer would pass for ``key`` (signed int32)."""
    if isinstance(key, bool):
        raise InvalidArgument("sharding_key", "must be str, bytes or int", key)
    if isinstance(key, int):
        if not _INT64_MIN <= key <= _INT64_MAX:
            raise InvalidArgument("sharding_key", "java sharding takes ints that fit a Java long",
                                  key)
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        return _to_int32(unsigned ^ (unsigned >> 32))
    if isinstance(key, bytes | bytearray | memoryview):
        try:
            key = bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument("sharding_key", "java sharding needs UTF-8 text", key) from None
    if not isinstance(key, str):
        raise InvalidArgument("sharding_key", "must be str, bytes or int", key)
    # String.hashCode over UTF-16 code units, i.e. s[0]*31^(n-1) + ... with 32-bit wrap-around
    units = key.encode("utf-16-be", "surrogatepass")  # a Java String may hold a lone one
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & _MASK32
    return _to_int32(h)


def java_partition(key: ShardingKey, partition_num: int) -> int:
    """The Java client's partition: ``|hashCode % partition_num|`` with Java's truncating ``%``."""
    h = java_hash_code(key)
    return abs(h) % partition_num  # |trunc(h % n)| == |h| % n


def _checked(router: Router) -> Router:
    def route(key: ShardingKey, partition_num: int) -> int:
        partition = router(key, partition_num)
        check_int("sharding function result", partition, 0, partition_num - 1)
        return partition

    route.__name__ = getattr(router, "__name__", "sharding")
    route.__doc__ = getattr(router, "__doc__", None)
    return route


def make_router(scheme: ShardingScheme = DEFAULT_SCHEME) -> Router:
    """The routing function for a scheme name or a user callable (validated on each call)."""
    if callable(scheme):
        return _checked(scheme)
    router = _BY_NAME.get(scheme) if isinstance(scheme, str) else None
    if router is None:
        names = ", ".join(repr(name) for name in SCHEMES)
        raise InvalidArgument("sharding", f"must be {names} or a callable "
                              "(key, partition_num) -> partition", scheme)
    return router


_BY_NAME: dict[str, Router] = {"murmur3": murmur3_partition, "java": java_partition}
assert tuple(_BY_NAME) == SCHEMES, "every scheme name has its router, in the same order"
