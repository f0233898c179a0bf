"""Faults from outside the process: ``smartnsq dev-cluster`` in a subprocess, driven by
``smartnsq dev-cluster fault ...`` (another subprocess) through the admin endpoint.

Every subprocess is bounded by a timeout and killed at the end of the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq.cli.devcluster import _topic_spec

BOUND = 60.0
SMARTNSQ = [sys.executable, "-c", "import sys; from smartnsq.cli import main; "
            "sys.exit(main(sys.argv[1:]))"]
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def test_topic_spec_takes_ordered_and_ext() -> None:
    assert _topic_spec("t") == _topic_spec("t:1:1")
    spec = _topic_spec("o:4:2:ordered")
    assert (spec.name, spec.partitions, spec.replicas, spec.ordered, spec.ext) == (
        "o", 4, 2, True, False)
    spec = _topic_spec("e:2:ext")
    assert (spec.partitions, spec.replicas, spec.ext) == (2, 1, True)
    assert _topic_spec("b:1:1:ordered:ext").ordered and _topic_spec("b:1:1:ext:ordered").ext
    for bad in ("", ":1", "t:x", "t:1:1:sorted", "t:0", "t:1:1:ext:ext"):
        with pytest.raises(ValueError, match="--topic"):
            _topic_spec(bad)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A dev cluster in a subprocess (scaled realistic profile); its NAME=value lines."""
    log = (tmp_path / "cluster.out").open("w+")
    proc = subprocess.Popen(
        [*SMARTNSQ, "dev-cluster", "--profile", "realistic", "--time-scale", "0.01",
         "--topic", "t:2:2", "--topic", "o:2:2:ordered", "--topic", "e:1:1:ext"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        values: dict[str, str] = {}
        for line in proc.stdout:  # bounded: the process is killed below if it hangs
            if "=" in line and line.split("=", 1)[0].isupper():
                key, value = line.strip().split("=", 1)
                values[key] = value
            if line.startswith("running"):
                break
        assert "DEVCLUSTER_ADMIN" in values, log.read()
        yield values
    finally:
        with proc:  # leaving it closes the pipe
            proc.terminate()
            try:
                proc.wait(BOUND)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(BOUND)
        log.close()


def fault(admin: str, *args: str) -> Any:
    done = subprocess.run([*SMARTNSQ, "dev-cluster", "fault", "--admin", admin, "--json", *args],
                          capture_output=True, text=True, timeout=BOUND, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_fault_command_kills_a_node_of_a_running_cluster(running: dict[str, str]) -> None:
    admin = running["DEVCLUSTER_ADMIN"]
    lookupd = running["NSQLOOKUPD_HTTP"].split(",")[0]
    status = fault(admin, "status")
    assert status["profile"]["name"] == "realistic"
    assert status["profile"]["replica_stall"] == pytest.approx([0.12, 0.12])
    meta = httpx.get(f"http://{lookupd}/lookup", params={"topic": "o", "metainfo": "true"},
                     headers=V1, timeout=BOUND).json()["meta"]
    assert meta["ordered"] and meta["partition_num"] == 2
    assert httpx.get(f"http://{lookupd}/lookup", params={"topic": "e", "metainfo": "true"},
                     headers=V1, timeout=BOUND).json()["meta"]["extend_support"]

    victim = status["topics"]["t"][0]["leader"]
    assert fault(admin, "kill", victim)["done"] == "kill"
    assert fault(admin, "settle", "--within", "30") == {"settled": True}
    status = fault(admin, "status")
    assert not next(n for n in status["nodes"] if n["id"] == victim)["alive"]
    assert status["topics"]["t"][0]["leader"] not in (None, victim)
    assert any(e["what"] == "elected" for e in status["timeline"])

    assert fault(admin, "create-topic", "x:1:1:ordered")["topic"] == "x"
    assert fault(admin, "start", victim)["done"] == "start"


def test_fault_command_names_what_is_wrong(running: dict[str, str]) -> None:
    admin = running["DEVCLUSTER_ADMIN"]
    done = subprocess.run([*SMARTNSQ, "dev-cluster", "fault", "--admin", admin, "kill", "9"],
                          capture_output=True, text=True, timeout=BOUND, check=False)
    assert done.returncode == 1 and "node: no node '9'" in done.stderr
    env = {k: v for k, v in os.environ.items() if k != "DEVCLUSTER_ADMIN"}
    done = subprocess.run([*SMARTNSQ, "dev-cluster", "fault", "--admin", "10.0.0.1:1", "status"],
                          capture_output=True, text=True, timeout=BOUND, check=False, env=env)
    assert done.returncode == 2 and "loopback" in done.stderr
