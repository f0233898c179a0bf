"""``sync.Consumer.run()`` in a process of its own, stopped the way a user or a container stops
it: SIGINT (Ctrl-C) or SIGTERM drains and returns, no traceback, within seconds, and a
message being handled when the signal came is finished, not lost."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
from support import WAIT, BackgroundCluster

CHILD = textwrap.dedent("""
    import sys, threading
    from smartnsq import sync

    started = threading.Event()
    release = threading.Event()

    def handle(message):
        print("HANDLING", message.body.decode(), flush=True)
        started.set()
        release.wait(0.5)  # still busy when the signal comes

    consumer = sync.Consumer("sig", "ch", lookupd=sys.argv[1:], handler=handle,
                             reconnect_delay=0.05)
    print("RETURNED", consumer.run(), consumer.stats().finished, flush=True)
""")


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(1, {"sig": 1}, WAIT)
    yield background
    background.stop()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_drains_and_returns(signum: int, bg: BackgroundCluster) -> None:
    from smartnsq import Admin, sync

    with Admin(bg.lookupd) as admin:  # a new channel starts at the end: make it first
        admin.create_channel("sig", "ch")
    child = subprocess.Popen([sys.executable, "-c", CHILD, *bg.lookupd],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        with sync.Producer(lookupd=bg.lookupd) as producer:
            producer.publish("sig", b"one")
        assert child.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(child.stdout.readline()),  # type: ignore
                         daemon=True).start()
        line = lines.get(timeout=30)  # the handler began: the child is subscribed
        assert line.startswith("HANDLING one"), line
        child.send_signal(signum)
        out, err = child.communicate(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert "RETURNED True 1" in out, out + err
    assert "Traceback" not in err, err
