"""The optional compiled build: mypyc compiles the per-message protocol modules in place.

Everything else about the package is in pyproject.toml. The modules named in
``smartnsq/extensions.py`` are compiled when mypyc, a C compiler and the Python headers are
all there; when any is missing, or ``SMARTNSQ_NO_EXTENSIONS=1`` is set, the build says why
and goes on without them, and the pure-Python modules (always shipped) run instead.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    """The source files of ``extensions.MODULES``, read without importing the package (whose
    ``__init__`` needs the runtime dependencies a build environment does not have)."""
    tree = ast.parse((HERE / "smartnsq" / "extensions.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets):
            names = ast.literal_eval(node.value)
            return [name.replace(".", "/") + ".py" for name in names]
    raise SystemExit("smartnsq/extensions.py defines no MODULES")


def say(why: str) -> None:
    """Tell why nothing is compiled, and take away what an earlier build compiled in place
    (an editable install's extensions would otherwise shadow the sources they were built
    from; smartnsq.extensions would refuse them as stale, but with a warning each import)."""
    print(f"smartnsq: building without the compiled modules ({why}); "
          "the pure-Python ones run instead", file=sys.stderr)
    for source in compiled_modules():
        path = HERE / source
        for pattern in (".*.so", ".*.pyd"):
            for old in path.parent.glob(path.stem + pattern):
                old.unlink()
    for old in (HERE / "smartnsq").glob("_compiled__mypyc.*"):
        old.unlink()


class OptionalBuildExt(build_ext):  # type: ignore[misc]  # (setuptools ships no types here)
    """``build_ext`` whose failure (no compiler, no headers) leaves the pure modules."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # the compiler's own errors are distutils' classes
            say(f"{type(exc).__name__}: {exc}")


def extensions() -> list[Any]:
    if os.environ.get("SMARTNSQ_NO_EXTENSIONS"):
        say("SMARTNSQ_NO_EXTENSIONS is set")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        say("mypyc is not installed")
        return []
    os.chdir(HERE)  # mypycify takes paths relative to the project and writes build/ here
    try:
        return list(mypycify(compiled_modules(), opt_level="3",
                             group_name="smartnsq._compiled"))
    except (Exception, SystemExit) as exc:  # mypy refused the sources
        say(f"mypyc failed: {exc}")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
