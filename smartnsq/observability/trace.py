"""The client-side trace log: one INFO line per traced publish or delivery on the
``smartnsq.observability.trace`` logger.

Producer and consumer write the same shape, ``EVENT key=value key=value ...``, so a message can
be followed from its publish to its handler with grep: youzan's ``internal_id`` and
``trace_id`` are the join keys (and the server's own trace log uses them too). Values are
formatted by logging only when a handler takes the record, so a disabled logger costs the
``enabled()`` check and nothing else.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Final

__all__ = ["enabled", "format_line", "line", "trace_log"]

trace_log: Final = logging.getLogger("smartnsq.trace")
_INFO: Final = logging.INFO


def enabled() -> bool:
    """Whether trace lines would be emitted (checked before gathering their fields)."""
    return trace_log.isEnabledFor(_INFO)


@lru_cache(maxsize=64)
def _template(names: tuple[str, ...], note: bool) -> str:
    return "%s " + " ".join(f"{name}=%s" for name in names) + (" (%s)" if note else "")


def line(event: str, /, note: str | None = None, **fields: object) -> None:
    """Log ``EVENT key=value ...`` (fields in the given order), ``(note)`` at the end."""
    if not trace_log.isEnabledFor(_INFO):
        return
    args: tuple[object, ...] = (event, *fields.values())
    if note is not None:
        args += (note,)
    trace_log.info(_template(tuple(fields), note is not None), *args)


def format_line(event: str, /, note: str | None = None, **fields: object) -> str:
    """The text ``line()`` logs (for tools that print rather than log)."""
    args: tuple[object, ...] = (event, *fields.values())
    if note is not None:
        args += (note,)
    return _template(tuple(fields), note is not None) % args
