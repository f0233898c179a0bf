"""Which per-message modules run compiled, and the switch that forces their pure source.

The modules in ``MODULES`` are plain typed Python; an install with a C compiler also builds
each of them as a mypyc extension (``setup.py``), which Python then imports in place of the
source. The source stays the reference: it runs where nothing was compiled, and
``SMARTNSQ_NO_EXTENSIONS=1`` (aiohttp's convention) makes it run anyway, to compare the two or
to rule the extensions out. A compiled module older than its source (the source was edited or
checked out after the build) is not used either: running yesterday's code under today's tests
would be worse than running slowly, so the pure path runs and a warning says to rebuild.
"Older" allows ``_WRITTEN_TOGETHER``: an installer writes a wheel's files in one pass with
the time of writing (pip keeps no timestamps), so a module's source can be a fraction of a
second younger than the extension written just before it.

``install()`` runs first thing in ``smartnsq/__init__.py``, before any of ``MODULES`` can be
imported; ``compiled()`` and ``describe()`` say which path runs (the CLI's ``--version``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["MODULES", "compiled", "describe", "install"]

log = logging.getLogger("smartnsq")  # (at import, before any other logger exists)

# what setup.py compiles, as one mypyc group (they call each other natively, so they are
# used all together or not at all); setup.py reads this literal without importing smartnsq
MODULES = ("smartnsq.protocol.frames", "smartnsq.protocol.runs")

_PACKAGE_DIR = Path(__file__).resolve().parent
_WRITTEN_TOGETHER = 2.0  # seconds: an install's files, not a later edit
_why_pure: str | None = None  # set by install(): why the source runs (None: compiled runs)


def _paths(name: str) -> tuple[Path, list[Path]]:
    """The source of module ``name`` and the compiled extensions beside it."""
    rel = Path(*name.split(".")[1:])
    source = _PACKAGE_DIR / rel.with_suffix(".py")
    built = [source.with_name(rel.name + suffix)
             for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return source, [path for path in built if path.exists()]


def _reason_for_pure() -> str | None:
    if os.environ.get("SMARTNSQ_NO_EXTENSIONS"):
        return "SMARTNSQ_NO_EXTENSIONS is set"
    for name in MODULES:
        source, built = _paths(name)
        if not built:
            return "not compiled at install"
        allowed = min(path.stat().st_mtime for path in built) + _WRITTEN_TOGETHER
        if source.stat().st_mtime > allowed:
            return f"the compiled {name} is older than its source: rebuild with pip install -e ."
    return None


class _SourceFinder:
    """Imports ``MODULES`` from their ``.py`` files even where an extension sits beside them."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names:
            return None
        source, _ = _paths(fullname)
        return importlib.util.spec_from_file_location(fullname, source)


def install() -> None:
    """Decide once, before any of ``MODULES`` is imported, which path runs."""
    global _why_pure
    _why_pure = _reason_for_pure()
    if _why_pure is None:
        return
    if any(name in sys.modules for name in MODULES):  # pragma: no cover - imported too early
        raise RuntimeError("smartnsq.extensions.install() ran after its modules were imported")
    if any(_paths(name)[1] for name in MODULES):  # compiled ones are there: step around them
        if _why_pure.startswith("the compiled"):
            log.warning("using the pure-Python modules: %s", _why_pure)
        sys.meta_path.insert(0, _SourceFinder(MODULES))


def compiled() -> bool:
    """True when the compiled modules run (False: their pure-Python source does)."""
    return _why_pure is None


def describe() -> str:
    """Which path runs, and why, in a few words (``smartnsq --version``)."""
    if _why_pure is None:
        names = ", ".join(name.removeprefix("smartnsq.") for name in MODULES)
        return f"compiled: {names}"
    return f"pure Python: {_why_pure}"
