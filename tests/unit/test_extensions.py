"""Which path runs: the compiled modules, or their source (``smartnsq.extensions``).

The decision is made on a package directory given to it, so each case (nothing compiled, the
switch set, a stale build, a fresh one) is laid out in a temporary directory; the real
process's answer is checked against what it really imported, and the CLI's ``--version``
against a fresh interpreter with the switch set.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smartnsq import extensions
from smartnsq.protocol import frames, runs

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
ROOT = Path(__file__).resolve().parents[2]
_NOT_SOURCES = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package directory holding the sources of ``MODULES`` (and nothing compiled)."""
    for name in extensions.MODULES:
        source = tmp_path.joinpath(*name.split(".")[1:]).with_suffix(".py")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("WHICH = 'source'\n")
    monkeypatch.setattr(extensions, "_PACKAGE_DIR", tmp_path)
    monkeypatch.delenv("SMARTNSQ_NO_EXTENSIONS", raising=False)
    return tmp_path


def _compile_all(package: Path, age: float = 0.0) -> None:
    """Stand-ins for extensions beside each source, ``age`` seconds older than it."""
    for name in extensions.MODULES:
        source = package.joinpath(*name.split(".")[1:]).with_suffix(".py")
        built = source.with_name(source.stem + SUFFIX)
        built.write_bytes(b"")
        mtime = source.stat().st_mtime - age
        os.utime(built, (mtime, mtime))


def test_this_process_says_what_it_imported() -> None:
    loaded = [m.__file__ or "" for m in (frames, runs)]
    assert extensions.compiled() == all(not path.endswith(".py") for path in loaded)
    assert extensions.describe().startswith("compiled: " if extensions.compiled()
                                            else "pure Python: ")


def test_nothing_compiled(package: Path) -> None:
    assert extensions._reason_for_pure() == "not compiled at install"


def test_a_fresh_build_is_used(package: Path) -> None:
    _compile_all(package)
    assert extensions._reason_for_pure() is None


def test_an_install_writing_the_source_just_after_its_build_is_not_stale(
        package: Path) -> None:
    """pip writes a wheel's files with the time of writing, the source after its extension."""
    _compile_all(package, age=0.2)
    assert extensions._reason_for_pure() is None


def test_an_installed_wheel_runs_compiled(tmp_path: Path) -> None:
    """The wheel built from this tree, installed by pip, imports its compiled modules."""
    if not extensions.compiled():
        pytest.skip(f"this install is not compiled ({extensions.describe()})")
    src, built = tmp_path / "src", tmp_path / "wheel"
    shutil.copytree(ROOT / "smartnsq", src / "smartnsq", ignore=_NOT_SOURCES)
    shutil.copytree(ROOT / "compat", src / "compat", ignore=_NOT_SOURCES)
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(built), str(src)], check=True, timeout=600,
                   capture_output=True)
    (wheel,) = built.glob("smartnsq-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True, timeout=300, capture_output=True)
    code = ("import smartnsq, smartnsq.extensions as e; "
            "print(smartnsq.__file__); print(e.describe())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(target)}).stdout.splitlines()
    assert out[0].startswith(str(target)), out
    assert out[1].startswith("compiled: "), out


def test_the_switch_wins_over_a_build(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _compile_all(package)
    monkeypatch.setenv("SMARTNSQ_NO_EXTENSIONS", "1")
    assert extensions._reason_for_pure() == "SMARTNSQ_NO_EXTENSIONS is set"


def test_a_build_older_than_its_source_is_not_used(package: Path) -> None:
    """Yesterday's compiled code must not run under today's source (and its tests)."""
    _compile_all(package, age=60)
    reason = extensions._reason_for_pure()
    assert reason is not None and "older than its source" in reason
    assert "pip install -e ." in reason


def test_the_finder_steps_around_a_build(package: Path) -> None:
    _compile_all(package)
    finder = extensions._SourceFinder(extensions.MODULES)
    name = extensions.MODULES[0]
    spec = finder.find_spec(name)
    assert spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader)
    assert spec.origin == str(package.joinpath(*name.split(".")[1:]).with_suffix(".py"))
    assert finder.find_spec("smartnsq.protocol.commands") is None  # not one of them


def test_the_switch_reaches_a_fresh_interpreter_and_the_version_says_so() -> None:
    env = {**os.environ, "SMARTNSQ_NO_EXTENSIONS": "1"}
    code = ("import smartnsq.extensions as e; from smartnsq.protocol import frames, runs; "
            "print(e.compiled(), frames.__file__.endswith('.py'), runs.__file__.endswith('.py'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.split()
    assert out == ["False", "True", "True"]
    version = subprocess.run([sys.executable, "-m", "smartnsq", "--version"],
                             capture_output=True, text=True, env=env, timeout=60, check=True)
    assert "(pure Python: SMARTNSQ_NO_EXTENSIONS is set)" in version.stdout
