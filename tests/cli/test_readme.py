"""The README as a new user follows it: the dev cluster started as it says, its banner's
``export`` line pasted, the Python snippet run as written; install lines that work from a
clone; ``python -m smartnsq`` shadowed by a folder says so in one line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BOUND = 60.0


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_readme_python_runs_as_written_against_the_dev_cluster(tmp_path: Path) -> None:
    [command] = [line.split("#")[0].strip() for block in blocks("bash")
                 for line in block.splitlines() if line.startswith("smartnsq dev-cluster")]
    env = {k: v for k, v in os.environ.items() if k != "SMARTNSQ_LOOKUPD"}
    env["PYTHONPATH"] = str(ROOT)
    cluster = subprocess.Popen([sys.executable, "-m", "smartnsq", *shlex.split(command)[1:]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT, env=env)
    try:
        assert cluster.stdout is not None
        exports = {}
        for line in cluster.stdout:  # bounded by the kill below if the cluster hangs
            if line.startswith("export "):
                name, value = line[len("export "):].strip().split("=", 1)
                exports[name] = value
            if line.startswith("running"):
                break
        assert "SMARTNSQ_LOOKUPD" in exports
        [snippet] = blocks("python")
        script = tmp_path / "quickstart.py"
        script.write_text(snippet)
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              cwd=tmp_path, env={**env, **exports}, timeout=BOUND, check=False)
        assert done.returncode == 0, done.stderr
        lines = [line.split() for line in done.stdout.splitlines()]
        assert len(lines) == 9
        by_order: dict[str, list[str]] = {}
        for _, _, trace_id, body in lines:
            by_order.setdefault(trace_id, []).append(body)
        assert by_order == {str(o): ["b'created'", "b'paid'", "b'shipped'"]
                            for o in (1001, 1002, 1003)}
    finally:
        with cluster:  # leaving it closes the pipes (else a ResourceWarning, an error here)
            cluster.terminate()
            try:
                cluster.wait(BOUND)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait(BOUND)


def test_install_lines_work_from_a_clone() -> None:
    texts = {"README.md": README}
    texts.update({f"examples/{p.name}": p.read_text() for p in (ROOT / "examples").glob("*.py")})
    for name, text in texts.items():
        for line in re.findall(r"pip install [^\n`]*", text):
            assert "smartnsq[" not in line and not re.search(r"install\s+'?smartnsq\b", line), \
                f"{name}: {line!r} only works once smartnsq is on an index"
    assert "-m 'not spark'" in README


def test_a_shadowing_folder_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    import smartnsq.__main__ as entry

    assert entry._shadowed() is None
    folder = tmp_path / "smartnsq"
    folder.mkdir()
    namespace = types.ModuleType("smartnsq")
    namespace.__path__ = [str(folder)]  # what Python makes of a folder without __init__.py
    monkeypatch.setitem(sys.modules, "smartnsq", namespace)
    assert entry._shadowed() == str(folder)
