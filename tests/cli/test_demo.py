"""``smartnsq demo`` and ``smartnsq dev-cluster``: in-process, against a given cluster, and as
real subprocesses (the README's command)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
from typing import Any

from support import slow_topic_creation

from smartnsq.cli import main


def test_demo_in_process_verifies_order_and_failover() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["demo", "--orders", "40", "--events", "4", "--duration", "0.5"],
                stdout=out, stderr=err)
    text = out.getvalue()
    assert code == 0, text + err.getvalue()
    assert "result:     OK" in text
    assert "160/160 events consumed, each once; duplicates 0, missing 0" in text
    assert "every order id in order (40 order ids checked)" in text
    assert "audit:      40/40" in text
    assert "failover:   partition 1 leader moved" in text
    assert "trace 100001" in text  # the first order is one of the traced ones
    assert "Traceback" not in err.getvalue()


async def test_demo_against_a_given_cluster(nsq_cluster: Any) -> None:
    """``--cluster``: the topics are created over HTTP like on a real cluster; no leader move."""
    out, err = io.StringIO(), io.StringIO()
    lookupd = ",".join(nsq_cluster.lookupd_http_addresses)
    code = await asyncio.to_thread(
        main, ["demo", "--cluster", lookupd, "--orders", "30", "--events", "3",
               "--duration", "0", "--topic-prefix", "given"], stdout=out, stderr=err)
    text = out.getvalue()
    assert code == 0, text + err.getvalue()
    assert "failover:   skipped" in text and "result:     OK" in text
    assert nsq_cluster.state.topics["given_orders"].ordered


async def test_demo_against_a_cluster_that_creates_topics_slowly(nsq_cluster: Any) -> None:
    """On a real cluster the partitions get leaders only when the create is sent again; the
    demo re-sends until every partition has a leader and is writable, and says how far it got
    while it waits (without the re-send it failed with "did not get a leader for every
    partition in time" in each of 6 runs)."""
    sends = slow_topic_creation(nsq_cluster, 2, topics=["slow_orders"])
    out, err = io.StringIO(), io.StringIO()
    lookupd = ",".join(nsq_cluster.lookupd_http_addresses)
    code = await asyncio.to_thread(
        main, ["demo", "--cluster", lookupd, "--orders", "20", "--events", "3",
               "--duration", "0", "--topic-prefix", "slow", "--create-timeout", "30"],
        stdout=out, stderr=err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert sends.count("slow_orders") >= 2
    assert "creating topic slow_orders: 0/4 partitions have a leader" in err.getvalue()


def test_demo_bad_options() -> None:
    err = io.StringIO()
    assert main(["demo", "--orders", "0"], stdout=io.StringIO(), stderr=err) == 1
    assert err.getvalue().strip() == "smartnsq demo: error: --orders must be in 1..1000000"


def test_demo_subprocess_smoke() -> None:
    """What the README runs: a real process, its exit status and its report."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SMARTNSQ_LOOKUPD", None)
    done = subprocess.run([sys.executable, "-m", "smartnsq", "demo", "--orders", "50",
                           "--duration", "0.5"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result:     OK" in done.stdout
    assert "Traceback" not in done.stderr


def test_dev_cluster_subprocess_prints_addresses_and_stops_on_sigint() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "smartnsq", "dev-cluster", "--nodes", "1",
                             "--lookupds", "1", "--topic", "t:2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # blocks until the cluster prints; ends at EOF
            lines.append(line)
            if line.startswith("running"):
                break
        text = "".join(lines)
        assert "NSQLOOKUPD_HTTP=127.0.0.1:" in text and "topic t" in text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130  # Ctrl-C, as docs/cli.md says
    finally:
        with proc:  # leaving it closes the pipes (else a ResourceWarning, an error here)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
