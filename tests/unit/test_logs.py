"""The library's logging (docs/logging.md): every logger listed, repeats held back with a
count, the fallback a program that configures nothing sees, one line per failed handler
attempt with the traceback once."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import channel_reaches

from smartnsq import Consumer
from smartnsq.observability import logs
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection

ROOT = Path(__file__).resolve().parents[2]


def test_every_logger_is_listed_and_documented() -> None:
    used: set[str] = set()
    for directory in (ROOT / "smartnsq", ROOT / "compat"):
        for path in directory.rglob("*.py"):
            used |= set(re.findall(r'getLogger\("(smartnsq(?:\.[a-z_]+)*)"\)', path.read_text()))
    assert used <= set(logs.LOGGERS), sorted(used - set(logs.LOGGERS))
    assert set(logs.LOGGERS) - {"smartnsq"} <= used, "a listed logger nobody uses"
    doc = (ROOT / "docs" / "logging.md").read_text()
    assert not [name for name in logs.LOGGERS if f"`{name}`" not in doc]


def test_repeats_are_held_back_and_counted(caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(logs, "clock", lambda: now[0])
    logs.reset()
    log = logging.getLogger("smartnsq.pool")
    with caplog.at_level(logging.DEBUG, "smartnsq"):
        for _ in range(5):
            log.warning("node %s refused", "127.0.0.1:1")
            log.info("info is never held back")
        log.warning("node %s refused", "127.0.0.1:2")  # other arguments: its own line
        now[0] += 10.5
        log.warning("node %s refused", "127.0.0.1:1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["node 127.0.0.1:1 refused", "node 127.0.0.1:2 refused",
                        "node 127.0.0.1:1 refused [and 4 more like this in the last 10.5 s]"]
    assert sum(r.levelno == logging.INFO for r in caplog.records) == 5
    logs.reset()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)


def test_a_program_that_configures_nothing_sees_warnings_naming_their_logger() -> None:
    done = _python("import logging, smartnsq\n"
                   "logging.getLogger('smartnsq.consumer').info('not shown')\n"
                   "logging.getLogger('smartnsq.consumer').warning('shown %s', 1)\n"
                   "logging.getLogger('smartnsq.lookup').error('also shown')\n")
    assert done.stderr.splitlines() == ["WARNING smartnsq.consumer: shown 1",
                                        "ERROR smartnsq.lookup: also shown"]
    done = _python("import logging, smartnsq\n"
                   "logging.basicConfig(format='mine %(name)s %(message)s')\n"
                   "logging.getLogger('smartnsq.consumer').warning('once')\n")
    assert done.stderr.splitlines() == ["mine smartnsq.consumer once"]  # not twice


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_failing_handler_logs_one_line_per_attempt_and_the_traceback_once(
        nsq_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy

    await nsq_cluster.create_topic("poison", channels=["ch"])
    leader = nsq_cluster.node_info(nsq_cluster.leader_of("poison", 0)).tcp_address
    host, port = leader.rsplit(":", 1)
    conn = await Connection.connect(host, int(port))
    try:
        await conn.request(commands.pub("poison", b"bad", 0))
    finally:
        await conn.close()

    def handler(message: Any) -> None:
        raise ValueError("no such order\nsecond line of the message")

    logs.reset()
    with caplog.at_level(logging.DEBUG, "smartnsq.consumer"):
        async with Consumer("poison", "ch", nsqd=[leader], handler=handler, max_attempts=3,
                            requeue_policy=RequeuePolicy(initial=0.0),
                            backoff_policy=BackoffPolicy(enabled=False)):
            channel = nsq_cluster.state.topics["poison"].partitions[0].channels["ch"]
            await channel_reaches(channel, lambda: channel.finish_count == 1)
    failures = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.WARNING, logging.ERROR]
    first = failures[0].getMessage()
    assert first.startswith("poison/ch partition 0: handler failed on message ")
    assert first.endswith(", attempt 1: ValueError: no such order; requeued")
    assert "\n" not in first and failures[0].exc_info is None
    assert "attempt 3 of 3" in failures[2].getMessage() and failures[2].exc_info is not None
    tracebacks = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(tracebacks) == 2  # attempts 1 and 2, at DEBUG; the third is the ERROR's
    assert any("giving up" in r.getMessage() for r in caplog.records)
