"""``nsq.run()`` ends on SIGINT and SIGTERM while it waits for messages that do not come.

pynsq's ``run()`` installs its handlers and stops the IOLoop from them; a program stopped by
Ctrl-C or by its supervisor's SIGTERM exits, whether or not messages are flowing. The program
runs in a child process (a real signal, a real main thread, a real idle Reader subscribed to
an empty topic of the dev cluster that this test starts), so nothing of the test's own
process is at stake.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pynsq_support import classic_nsqd

EXIT_BOUND = 10.0
"""How long the child may take to exit after the signal: generous, for a loaded CI box (the
test asserts that it exits, not how fast)."""

START_BOUND = 30.0
"""How long the child may take to import smartnsq and enter ``run()``."""

CHILD = """
import signal
import sys
import threading
import time

import smartnsq.compat.pynsq as nsq

handled = []


def handler(message):
    handled.append(message.body)
    return True


def to_this_thread(main):
    # once the run() thread waits in select() (polled, with a deadline): only a wake-up of
    # that select() can make run() return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        if frame is not None and frame.f_code.co_name == "select":
            break
        time.sleep(0.001)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def running():
    # inside run() (its signal handlers are installed), once subscribed: from here on the
    # run() loop has nothing to do, and the parent signals only then
    if any(sub.connected for stats in reader.stats() for sub in stats.subscriptions):
        print("running", flush=True)
        if sys.argv[2] == "thread":  # the signal lands on another thread than run()'s
            threading.Thread(target=to_this_thread, args=(threading.get_ident(),)).start()
    else:
        reader.io_loop.call_later(0.02, running)


reader = nsq.Reader("idle", "c", handler, nsqd_tcp_addresses=[sys.argv[1]])
reader.io_loop.call_soon(running)
nsq.run()
print("returned", flush=True)
reader.close().result(10)
sys.exit(3 if handled else 0)  # the topic is idle: nothing may have been handled
"""


@pytest.fixture(scope="module")
def idle_nsqd() -> Iterator[str]:
    """A classic dev nsqd whose topic ``idle`` (channel ``c``) never gets a message."""
    with classic_nsqd("signals-devcluster", "idle") as cluster:
        yield cluster.nsqd_tcp_addresses[0]


def wait_for_line(proc: subprocess.Popen[str], wanted: str, bound: float) -> bool:
    """Read the child's stdout until ``wanted`` arrives (True) or ``bound`` passes."""
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == wanted:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return seen.wait(bound)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
def test_an_idle_run_returns_on_a_signal(idle_nsqd: str, tmp_path: Path,
                                         signum: signal.Signals) -> None:
    proc = start_child(tmp_path, idle_nsqd, "parent")
    try:
        assert wait_for_line(proc, "running", START_BOUND), "the child never entered run()"
        proc.send_signal(signum)
        assert_exits(proc, f"{signum.name} while idle")
    finally:
        reap(proc)


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="no pthread_kill here")
def test_an_idle_run_returns_on_a_signal_another_thread_received(idle_nsqd: str,
                                                                 tmp_path: Path) -> None:
    """The kernel may hand a process's signal to any of its threads: the handler still runs
    (on the main thread) and run() still returns, though nothing interrupted its select()."""
    proc = start_child(tmp_path, idle_nsqd, "thread")
    try:
        assert wait_for_line(proc, "running", START_BOUND), "the child never entered run()"
        assert_exits(proc, "SIGINT delivered to a thread other than run()'s")
    finally:
        reap(proc)


def start_child(tmp_path: Path, nsqd: str, mode: str) -> subprocess.Popen[str]:
    program = tmp_path / "idle_reader.py"
    program.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(program), nsqd, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)


def assert_exits(proc: subprocess.Popen[str], after: str) -> None:
    try:
        code = proc.wait(EXIT_BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"nsq.run() did not return within {EXIT_BOUND:g} s of {after}")
    assert proc.stderr is not None
    errors = proc.stderr.read()
    assert code == 0, f"the child exited {code}: {errors}"


def reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(EXIT_BOUND)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
