"""``await Consumer.run()`` in a process of its own under ``asyncio.run``, stopped the way a user
or a container stops it: SIGINT (Ctrl-C) or SIGTERM drains and returns True, the process ends
within seconds, with no traceback, and a message being handled when the signal came is
finished, not lost."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import WAIT, BackgroundCluster

CHILD = textwrap.dedent("""
    import asyncio, signal, sys
    from smartnsq import Consumer

    async def main():
        async def handle(message):
            print("HANDLING", message.body.decode(), flush=True)
            await asyncio.sleep(0.3)  # the work: still under way when the signal comes

        consumer = Consumer("sig", "ch", lookupd=sys.argv[1:], handler=handle,
                            reconnect_delay=0.05)
        # run() takes the signals before it first waits: this line comes after that
        asyncio.get_running_loop().call_soon(print, "READY")
        before = signal.getsignal(signal.SIGTERM)
        stopped = await consumer.run(stop_on=(signal.SIGINT, signal.SIGTERM))
        stats = consumer.stats()
        print("RETURNED", stopped, consumer.closed, stats.finished, stats.requeued,
              signal.getsignal(signal.SIGTERM) is before, flush=True)

    asyncio.run(main())
    print("EXITED", flush=True)
""")


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(1, {"sig": 1}, WAIT)
    yield background
    background.stop()


def _lines(child: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """The child's stdout, line by line, read on a thread (which ends at its end)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put("")  # the end: the child exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _wait_for(lines: queue.Queue[str], start: str) -> list[str]:
    seen = []
    while True:
        line = lines.get(timeout=30)
        assert line, f"the child exited before {start!r}: {''.join(seen)}"
        seen.append(line)
        if line.startswith(start):
            return seen


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_drains_and_returns(signum: int, busy: bool, bg: BackgroundCluster) -> None:
    from smartnsq import Admin, sync

    with Admin(bg.lookupd) as admin:  # a new channel starts at the end: make it first
        admin.create_channel("sig", "ch")
    child = subprocess.Popen([sys.executable, "-c", CHILD, *bg.lookupd],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines, reader = _lines(child)
    try:
        _wait_for(lines, "READY")
        if busy:
            with sync.Producer(lookupd=bg.lookupd) as producer:
                producer.publish("sig", b"one")
            _wait_for(lines, "HANDLING one")  # subscribed, and the handler is at work
        signalled = time.monotonic()
        child.send_signal(signum)
        child.wait(timeout=15)
        took = time.monotonic() - signalled
        assert child.stderr is not None
        err = child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.join(timeout=15)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    out = []
    while not lines.empty():
        out.append(lines.get())
    text = "".join(out)
    assert child.returncode == 0, err
    finished = 1 if busy else 0
    assert f"RETURNED True True {finished} 0 True" in text, text + err
    assert "EXITED" in text, text + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert took < 5, f"{took:.1f}s from the signal to the exit"


def test_the_graceful_shutdown_example_stops_itself_and_loses_nothing() -> None:
    """``examples/graceful_shutdown.py`` as CI runs it: it sends itself SIGTERM, drains, and
    a second consumer finds every message the first did not handle."""
    example = Path(__file__).resolve().parents[2] / "examples" / "graceful_shutdown.py"
    done = subprocess.run([sys.executable, str(example), "--count", "120", "--stop-after",
                           "40"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drained and closed: True" in done.stdout, done.stdout
    assert "every job handled: True" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
