"""The docs' home page as a new user follows it: the dev cluster started with the page's own
command, its ``export`` line pasted, then every Python snippet of the page run as written, in
order, each to its end (a snippet that never returns is a snippet nobody can try)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "docs" / "index.md"
BOUND = 60.0  # seconds: a generous ceiling for a snippet or the cluster's start, not a timing


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              cwd=script.parent, env=env, timeout=BOUND, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{script.name} did not end within {BOUND:g} s: a docs snippet "
                             f"must run to its end\n{exc.stderr!r}") from None


def test_index_snippets_run_as_written_against_the_dev_cluster(tmp_path: Path) -> None:
    text = INDEX.read_text()
    [command] = [line.split("#")[0].strip() for block in blocks(text, "bash")
                 for line in block.splitlines() if line.startswith("smartnsq dev-cluster")]
    env = {k: v for k, v in os.environ.items() if k != "SMARTNSQ_LOOKUPD"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cluster = subprocess.Popen([sys.executable, "-m", "smartnsq", *shlex.split(command)[1:]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT, env=env)
    watchdog = threading.Timer(BOUND, cluster.kill)  # a cluster that never says "running"
    watchdog.start()
    try:
        assert cluster.stdout is not None
        exports = {}
        for line in cluster.stdout:
            if line.startswith("export "):
                name, value = line[len("export "):].strip().split("=", 1)
                exports[name] = value
            if line.startswith("running"):
                break
        watchdog.cancel()
        assert "SMARTNSQ_LOOKUPD" in exports, "the dev cluster did not start"
        snippets = blocks(text, "python")
        assert len(snippets) >= 2
        outputs = []
        for number, snippet in enumerate(snippets, 1):
            script = tmp_path / f"index_snippet_{number}.py"
            script.write_text(snippet)
            done = _run(script, {**env, **exports})
            assert done.returncode == 0, f"snippet {number}:\n{snippet}\n{done.stderr}"
            outputs.append(done.stdout)
        published, consumed = outputs[0].split(), outputs[1].split()
        # the consumer got the message the producer published, from the partition it went to
        assert published[0] == consumed[0]
        assert "PublishReceipt(" in outputs[0] and "trace_id=7001" in outputs[0]
        assert outputs[1].strip().endswith("""b'{"order": 42}'""")
    finally:
        watchdog.cancel()
        with cluster:  # leaving it closes the pipes (else a ResourceWarning, an error here)
            cluster.terminate()
            try:
                cluster.wait(BOUND)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait(BOUND)
