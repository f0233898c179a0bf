"""``smartnsq dev-cluster`` and ``smartnsq dev-cluster fault`` as an operator meets them: the
help names the fault actions, the banner numbers the nodes and ends with ``export`` lines,
fault actions answer in sentences and tables (``--json`` for scripts), a server refusal is a
sentence saying what to change, Ctrl-C ends the cluster with 130. Real processes throughout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND = 60.0
SMARTNSQ = [sys.executable, "-m", "smartnsq"]


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if k not in ("SMARTNSQ_LOOKUPD", "DEVCLUSTER_ADMIN")}
    out["PYTHONPATH"] = str(ROOT)
    return out


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SMARTNSQ, *argv], capture_output=True, text=True, timeout=BOUND,
                          cwd=ROOT, env=env(), check=False)


class Cluster:
    def __init__(self, proc: subprocess.Popen[str], banner: str) -> None:
        self.proc = proc
        self.banner = banner
        self.values = dict(line.split("=", 1) for line in banner.splitlines()
                           if "=" in line and line.split("=", 1)[0].isupper())
        self.admin = self.values["DEVCLUSTER_ADMIN"]

    def fault(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run("dev-cluster", "fault", "--admin", self.admin, *argv)


def start(*argv: str) -> Cluster:
    proc = subprocess.Popen([*SMARTNSQ, "dev-cluster", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env())
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # ends at EOF if the cluster fails; bounded by the fixture's kill
        lines.append(line)
        if line.startswith("running"):
            break
    return Cluster(proc, "".join(lines))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = start("--nodes", "3", "--lookupds", "1", "--topic", "orders:4:2:ordered")
    try:
        yield c
    finally:
        with c.proc:  # leaving it closes the pipes (else a ResourceWarning, an error here)
            if c.proc.poll() is None:
                c.proc.terminate()
                try:
                    c.proc.wait(BOUND)
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait(BOUND)


def test_help_lists_fault_actions_and_documents_every_option() -> None:
    done = run("dev-cluster", "--help")
    assert done.returncode == 0
    for action in ("fault", "status", "kill|leave|stop|start N", "move-leader", "writable",
                   "cut|stall|resume", "settle", "create-topic", "130"):
        assert action in done.stdout, action
    assert "--mode {youzan,classic,mixed}\n" in done.stdout and "youzan nodes" in done.stdout
    assert "loopback address" in done.stdout  # --host


def test_more_replicas_than_nodes_is_one_sentence_before_starting() -> None:
    done = run("dev-cluster", "--topic", "orders:4:5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "smartnsq dev-cluster: error: --topic orders:4:5: 4 partitions x 5 replicas need 5 "
        "nodes; the cluster has 3 (lower the replicas of 'orders', or start the cluster "
        "with --nodes 5)"]
    assert "ErrType" not in done.stderr


def test_banner_numbers_nodes_and_ends_with_exports(cluster: Cluster) -> None:
    banner = cluster.banner
    assert "(4 partitions, 2 replicas ordered)" not in banner
    assert "topic orders: 4 partitions x 2 replicas, ordered" in banner
    for i in range(3):
        assert f"  #{i}  127.0.0.1:" in banner
    tail = banner.strip().splitlines()[-4:]
    assert tail[0] == f"export SMARTNSQ_LOOKUPD={cluster.values['NSQLOOKUPD_HTTP']}"
    assert tail[1] == f"export DEVCLUSTER_ADMIN={cluster.admin}"
    assert tail[-1] == "running; Ctrl-C to stop"


def test_fault_actions_answer_in_sentences_and_tables(cluster: Cluster) -> None:
    done = cluster.fault("kill", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("killed node #1 (")
    assert cluster.fault("settle").stdout.strip() == "settled: every fault sequence has ended"
    done = cluster.fault("status")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) < 60 and not done.stdout.lstrip().startswith("{")
    assert any(line.split()[:4] == ["#1", *line.split()[1:3], "down"] for line in lines
               if line.strip().startswith("#1")), done.stdout
    assert "fault timeline" in done.stdout and "node_lost" in done.stdout
    assert any(line.split()[:2] == ["orders", "0"] for line in lines)
    status = json.loads(cluster.fault("status", "--json").stdout)  # --json after the action
    assert not status["nodes"][1]["alive"]
    raw = json.loads(cluster.fault("--json", "start", "#1").stdout)
    assert raw == {"done": "start", "node": status["nodes"][1]["id"], "index": 1}


def test_refusals_say_what_to_change(cluster: Cluster) -> None:
    done = cluster.fault("cut", "2")
    assert done.returncode == 1
    assert done.stderr.strip() == ("fault cut: connection faults need a proxied cluster: "
                                   "restart it with smartnsq dev-cluster --proxied")
    done = cluster.fault("create-topic", "big:4:5")
    assert done.returncode == 1
    assert "4 partitions x 5 replicas need 5 nodes; the cluster has 3" in done.stderr
    assert "ErrType" not in done.stderr
    done = cluster.fault("kill", "7")
    assert done.returncode == 1 and "#0..#2" in done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_exits_130_and_sigterm_0() -> None:
    for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        c = start("--nodes", "1", "--lookupds", "1")
        try:
            assert c.banner.rstrip().endswith("running; Ctrl-C to stop"), c.banner
            c.proc.send_signal(sig)
            assert c.proc.wait(BOUND) == expected
        finally:
            with c.proc:  # leaving it closes the pipes
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.proc.wait(BOUND)
