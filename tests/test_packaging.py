"""What would be published: the sdist and the wheel hold ``smartnsq`` and nothing else, the
build warns of nothing, ``twine check`` passes, and installing smartnsq adds nothing to other
projects' pytest runs (its plugin is opt-in).

The project is copied to a temporary directory and built there (``python -m build``: the sdist,
then the wheel from the sdist, as an index's users would build it), so the checkout gets no
``build/``, ``dist/`` or ``*.egg-info`` from this test. Without network the build runs without
isolation, which needs setuptools >= 77 (SPDX ``license``) and wheel installed; with neither that
nor a way to fetch them the test is skipped, never passed.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest

from smartnsq import extensions

ROOT = Path(__file__).resolve().parents[1]
# the whole checkout is copied (its tests too: a build that picks up a stray test file must be
# seen to), less what git ignores and git itself
IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", "*.egg-info", "build",
                                "dist", "site", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                                ".hypothesis", ".coverage", ".coverage.*", "*.so", "*.pyd")
# what a failed build says when it could not get its build dependencies (offline machine)
UNAVAILABLE = ("No matching distribution", "Could not find a version", "Failed to establish",
               "Temporary failure in name resolution", "Network is unreachable",
               "ConnectionError", "ProxyError", "invalid command 'bdist_wheel'")


def _can_build_offline() -> bool:
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except metadata.PackageNotFoundError:
        return False
    return major >= 77 and find_spec("wheel") is not None


def _build_command(src: Path, out: Path) -> list[str]:
    offline = _can_build_offline()
    if find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--outdir", str(out), str(src)]
        return [*cmd, "--no-isolation"] if offline else cmd
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    return [*cmd, "--no-build-isolation"] if offline else cmd


@dataclass
class Built:
    """The distributions built from a copy of the checkout, and what the build printed."""

    out: Path
    output: str
    sdist: Path | None  # None when only pip was there to build (a wheel, no sdist)
    wheel: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("dist")
    src, out = tmp / "src", tmp / "out"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    # without bytecode, setuptools says "byte-compiling is disabled" as a warning: not the
    # project's (test_the_build_warns_of_nothing)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(_build_command(src, out), capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        if any(marker in output for marker in UNAVAILABLE):
            pytest.skip("cannot build here (no build dependencies, no network): "
                        + output.strip().splitlines()[-1][:200])
        pytest.fail(f"build failed:\n{output[-3000:]}")
    (wheel,) = out.glob("smartnsq-*.whl")
    sdists = list(out.glob("smartnsq-*.tar.gz"))
    return Built(out, output, sdists[0] if sdists else None, wheel)


@pytest.fixture(scope="module")
def wheel(built: Built) -> Iterator[zipfile.ZipFile]:
    with zipfile.ZipFile(built.wheel) as archive:
        yield archive


@pytest.fixture(scope="module")
def sdist(built: Built) -> list[str]:
    """The sdist's member names, less its ``smartnsq-VERSION/`` folder."""
    if built.sdist is None:
        pytest.skip("the sdist needs the 'build' package (pip builds wheels only)")
    with tarfile.open(built.sdist) as tar:
        names = [m.name for m in tar.getmembers() if not m.isdir()]
    prefix = names[0].split("/")[0] + "/"
    assert all(n.startswith(prefix) for n in names)
    return [n[len(prefix):] for n in names]


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
    assert msg["License-Expression"] == "MIT"  # SPDX (PEP 639), not the deprecated table
    assert msg.get_all("License-File") == ["LICENSE"]
    assert "License" not in msg  # the free-text field the table wrote
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    entry_points = wheel.read(entry).decode()
    assert "[console_scripts]" in entry_points
    # the pytest plugin ships, but is not registered for every pytest run (opt-in)
    assert "pytest11" not in entry_points and "pytest_plugin" not in entry_points
    assert "smartnsq/testing/pytest_plugin.py" in _names(wheel)


# what an sdist may hold besides the package: its metadata and the files that build it
_SDIST_FILES = {"PKG-INFO", "pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md",
                "LICENSE", "CHANGELOG.md"}


def test_the_sdist_holds_the_package_and_what_builds_it(sdist: list[str]) -> None:
    stray = [n for n in sdist
             if n not in _SDIST_FILES and n.split("/")[0] not in
             {"smartnsq", "compat", "smartnsq.egg-info"}]
    assert stray == [], f"the sdist ships {stray} (MANIFEST.in prunes what is not the package)"
    for name in sdist:
        parts = name.split("/")
        assert "tests" not in parts and "fixtures" not in parts, name
        assert not parts[-1].startswith("test_") and parts[-1] != "conftest.py", name
    assert "LICENSE" in sdist and "smartnsq/py.typed" in sdist
    sources = {p.relative_to(ROOT).as_posix() for d in ("smartnsq", "compat")
               for p in (ROOT / d).rglob("*.py")}
    assert sources <= set(sdist), f"missing from the sdist: {sorted(sources - set(sdist))}"


def _compiled_members(wheel: zipfile.ZipFile) -> list[str]:
    return [n for n in _names(wheel) if n.endswith((".so", ".pyd"))]


def test_the_wheel_carries_the_compiled_modules_beside_their_sources(
        built: Built, wheel: zipfile.ZipFile) -> None:
    """Built where a compiler is (this process runs compiled: so could the build), the wheel
    holds each of ``extensions.MODULES`` compiled, and always its source (the pure path)."""
    names = _names(wheel)
    stems = [name.replace(".", "/") for name in extensions.MODULES]
    assert all(f"{stem}.py" in names for stem in stems)
    members = _compiled_members(wheel)
    if not members:
        assert not extensions.compiled(), "this machine compiles, the wheel's build did not"
        assert "building without the compiled modules" in built.output
        return
    for stem in stems:
        assert any(m.startswith(stem + ".") for m in members), stem
    assert any(m.startswith("smartnsq/_compiled__mypyc.") for m in members)
    assert len(members) == len(stems) + 1, members


def test_without_a_compiler_the_build_still_succeeds(tmp_path: Path) -> None:
    """``CC=false``: the compile fails, the build says so and ships the pure modules."""
    if not _can_build_offline() or find_spec("build") is None:
        pytest.skip("needs setuptools>=77, wheel and build installed (a build without network)")
    src, out = tmp_path / "src", tmp_path / "out"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    env = {**os.environ, "CC": "false"}
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                           "--outdir", str(out), str(src)],
                          capture_output=True, text=True, timeout=600, check=False, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "building without the compiled modules" in output
    (built_wheel,) = out.glob("smartnsq-*.whl")
    with zipfile.ZipFile(built_wheel) as archive:
        assert _compiled_members(archive) == []
        assert "smartnsq/protocol/frames.py" in _names(archive)


def test_the_build_warns_of_nothing(built: Built) -> None:
    """A setuptools deprecation today is a build that stops working on a date."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    warned = [line for line in built.output.splitlines()
              if ("warning" in line.lower() or "deprecat" in line.lower())
              and line.split()[0] != compiler]  # (a compile command's -Wno-...-warning-... flags)
    assert warned == [], "\n".join(warned)


def test_twine_check_passes(built: Built) -> None:
    """What an index checks on upload (metadata, the README's rendering)."""
    if find_spec("twine") is None:
        pytest.skip("twine is not installed (it is in the dev extra)")
    files = sorted(str(p) for p in built.out.iterdir())
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == len(files), proc.stdout


def _pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest run in another project (``project``), as a user of the installed smartnsq."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    (project / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n"
                                        "asyncio_default_fixture_loop_scope = function\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, timeout=300, check=False, cwd=project,
                          env=env)


_USES_THE_FIXTURE = """
import pytest

from smartnsq import extensions

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_uses_the_dev_cluster(nsq_cluster):
    await nsq_cluster.create_topic("orders", partitions=1, replicas=1)
    assert len(nsq_cluster.lookupd_http_addresses) == 1
"""


def test_another_projects_pytest_run_loads_nothing_of_smartnsq(tmp_path: Path) -> None:
    """Installed, smartnsq adds no plugin to every pytest run (no import, no fixtures)."""
    (tmp_path / "test_other.py").write_text(textwrap.dedent("""
        import sys

        def test_nothing_of_smartnsq(request):
            assert "smartnsq" not in sys.modules
            assert not any("smartnsq" in (name or "") for name, _ in
                           request.config.pluginmanager.list_name_plugin())
    """))
    proc = _pytest_in(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "test_other.py").write_text(_USES_THE_FIXTURE)
    proc = _pytest_in(tmp_path)
    assert proc.returncode != 0 and "fixture 'nsq_cluster' not found" in proc.stdout, proc.stdout


@pytest.mark.parametrize("opt_in", ["conftest", "-p"])
def test_the_plugin_is_one_line_to_opt_in(tmp_path: Path, opt_in: str) -> None:
    (tmp_path / "test_mine.py").write_text(_USES_THE_FIXTURE)
    args: tuple[str, ...] = ()
    if opt_in == "conftest":
        (tmp_path / "conftest.py").write_text(
            'pytest_plugins = ["smartnsq.testing.pytest_plugin"]\n')
    else:
        args = ("-p", "smartnsq.testing.pytest_plugin")
    proc = _pytest_in(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


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
