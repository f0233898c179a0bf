"""Plain-text tables, for every program that prints one (the ``smartnsq`` commands, the dev
cluster's status): one function below both, so neither imports the other for it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["format_table"]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]],
                 right: Iterable[int] = ()) -> str:
    """A plain-text table: columns padded to their widest cell, ``right`` columns aligned right."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align_right = set(right)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(widths[i]) if i in align_right else c.ljust(widths[i])
                 for i, c in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
