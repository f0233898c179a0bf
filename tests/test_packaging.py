"""The built wheel holds ``smartnsq`` and nothing else.

The project is copied to a temporary directory and built there, so the checkout gets no
``build/`` or ``*.egg-info`` from this test. Without network the build runs without isolation,
which needs setuptools >= 68 and wheel installed; with neither that nor a way to fetch them the
test is skipped, never passed.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPY = ("pyproject.toml", "README.md", "LICENSE", "smartnsq", "compat")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
# what a failed build says when it could not get its build dependencies (offline machine)
UNAVAILABLE = ("No matching distribution", "Could not find a version", "Failed to establish",
               "Temporary failure in name resolution", "Network is unreachable",
               "ConnectionError", "ProxyError", "invalid command 'bdist_wheel'")


def _can_build_offline() -> bool:
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except metadata.PackageNotFoundError:
        return False
    return major >= 68 and find_spec("wheel") is not None


def _build_command(src: Path, out: Path) -> list[str]:
    offline = _can_build_offline()
    if find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)]
        return [*cmd, "--no-isolation"] if offline else cmd
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    return [*cmd, "--no-build-isolation"] if offline else cmd


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "out"
    src.mkdir()
    for name in COPY:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORE)
        elif path.exists():
            shutil.copy2(path, src / name)
    proc = subprocess.run(_build_command(src, out), capture_output=True, text=True, timeout=300,
                          check=False)
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        if any(marker in output for marker in UNAVAILABLE):
            pytest.skip("cannot build a wheel here (no build dependencies, no network): "
                        + output.strip().splitlines()[-1][:200])
        pytest.fail(f"wheel build failed:\n{output[-3000:]}")
    (path,) = out.glob("smartnsq-*.whl")
    return zipfile.ZipFile(path)


def _names(wheel: zipfile.ZipFile) -> list[str]:
    return [n for n in wheel.namelist() if not n.endswith("/")]


def test_only_smartnsq_at_top_level(wheel: zipfile.ZipFile) -> None:
    tops = {n.split("/")[0] for n in _names(wheel)}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert tops - dist_info == {"smartnsq"}
    (info,) = dist_info
    top_level = f"{info}/top_level.txt"
    if top_level in wheel.namelist():
        assert wheel.read(top_level).decode().split() == ["smartnsq"]


def test_typed_marker(wheel: zipfile.ZipFile) -> None:
    assert "smartnsq/py.typed" in _names(wheel)


def test_compat_ships_inside_smartnsq(wheel: zipfile.ZipFile) -> None:
    names = set(_names(wheel))
    sources = sorted(p.name for p in (ROOT / "compat").glob("*.py"))
    assert "__init__.py" in sources
    for name in sources:
        assert f"smartnsq/compat/{name}" in names
    assert not any(n.startswith("compat/") for n in names)


def test_every_package_of_the_tree_is_shipped(wheel: zipfile.ZipFile) -> None:
    """A subpackage missing from pyproject's ``packages`` list would vanish from the wheel."""
    names = set(_names(wheel))
    for init in sorted((ROOT / "smartnsq").rglob("__init__.py")):
        package = init.parent
        for module in package.glob("*.py"):
            rel = module.relative_to(ROOT).as_posix()
            assert rel in names, f"{rel} is not in the wheel (list its package in pyproject)"
    assert "smartnsq/devcluster/__init__.py" in names
    assert "smartnsq/protocol/frames.py" in names


def test_no_tests_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    for name in _names(wheel):
        parts = name.split("/")
        assert "tests" not in parts and "fixtures" not in parts, name
        assert not parts[-1].startswith("test_") and parts[-1] != "conftest.py", name


def test_metadata(wheel: zipfile.ZipFile) -> None:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    msg = email.message_from_bytes(wheel.read(meta))
    assert msg["Name"] == "smartnsq"
    assert msg["Requires-Python"] == ">=3.10"
    requires = " ".join(msg.get_all("Requires-Dist") or [])
    for dep in ("python-snappy", "mmh3", "h11"):
        assert dep in requires
    base = " ".join(r for r in msg.get_all("Requires-Dist") or [] if "extra ==" not in r)
    for unused in ("tenacity", "httpx"):  # imported by nothing (docs/architecture.md)
        assert unused not in base, unused
    import smartnsq

    assert msg["Version"] == smartnsq.__version__
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    entry_points = wheel.read(entry).decode()
    assert "smartnsq.testing.pytest_plugin" in entry_points
    module = "smartnsq/testing/pytest_plugin.py"
    assert module in _names(wheel)


# what a plain client must not load: the HTTP client and its parser (only a lookupd client or
# the admin API needs them), and the optional dependencies (httpx, tenacity: the dev cluster's
# tooling; snappy: only when the server negotiates it; opentelemetry: only with a tracer or
# meter provider). Importing them once cost a plain process 14.7 MiB and 138 modules.
_NOT_FOR_A_PLAIN_CLIENT = ("httpx", "tenacity", "snappy", "cramjam", "tornado", "click", "h11",
                           "smartnsq.discovery.lookup", "smartnsq.admin",
                           "smartnsq.transport.http",
                           "smartnsq.protocol.http", "opentelemetry")
_PLAIN_CLIENT = """
import sys
from smartnsq import Producer, Consumer
Producer(nsqd=["127.0.0.1:4150"])
Consumer("t", "c", handler=lambda message: None, nsqd=["127.0.0.1:4150"])
print(" ".join(m for m in {names!r} if m in sys.modules))
"""


def test_a_plain_client_imports_no_http_and_no_optional_dependency() -> None:
    code = _PLAIN_CLIENT.format(names=_NOT_FOR_A_PLAIN_CLIENT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.split() == []


def test_the_lookup_client_imports_no_httpx_or_tenacity() -> None:
    code = ("import sys\nimport smartnsq.discovery.lookup, smartnsq.admin\n"
            "print(' '.join(m for m in ('httpx', 'tenacity', 'snappy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.split() == []


def test_snappy_is_loaded_when_negotiated_and_its_absence_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from smartnsq.errors import ProtocolError
    from smartnsq.protocol.compression import stream_for

    monkeypatch.setitem(sys.modules, "snappy", None)  # as if python-snappy were not installed
    with pytest.raises(ProtocolError, match="needs the python-snappy package"):
        stream_for("snappy")
    assert stream_for("deflate") is not None  # the other compression does not need it
