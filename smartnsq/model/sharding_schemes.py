"""The names of the built-in sharding schemes (:mod:`smartnsq.model.sharding` implements them).

Kept apart, with no imports, so that ``smartnsq pub --sharding`` can offer the names to its
parser and to shell completion without loading the client (the hash and the error table
would add about 0.15 s to every command's start). There is one list: the library's checks,
its docs and the command line all read this one.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

__all__ = ["DEFAULT_SCHEME", "SCHEMES", "SchemeName"]

SchemeName: TypeAlias = Literal["murmur3", "java"]
SCHEMES: Final[tuple[SchemeName, ...]] = ("murmur3", "java")
DEFAULT_SCHEME: Final[SchemeName] = SCHEMES[0]
