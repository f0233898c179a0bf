"""A user's first commands: a bad ``--timeout``, ``--topic`` given as an option, and lines too
big together for one MPUB: each a clear answer (or just working), whatever the command."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support import bounded, cli

COMMANDS = [("pub", "t"), ("lookup", "t"), ("tail", "t"), ("stats", "t"), ("top", "t", "--json")]


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
async def test_every_command_refuses_a_bad_timeout_alike(command: tuple[str, ...],
                                                         value: str) -> None:
    # a closed port: the check comes before anything is dialled
    code, _, err = await cli(*command, "--lookupd", "127.0.0.1:1", f"--timeout={value}",
                             stdin="x\n")
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--timeout" in lines[0] and "finite number of seconds greater than 0" in lines[0]
    assert "drain_timeout" not in lines[0]


@pytest.mark.parametrize("command", ["pub", "tail", "lookup", "stats"])
@pytest.mark.parametrize("form", [["--topic", "t"], ["--topic=t"]])
async def test_topic_as_an_option_says_it_is_positional(command: str, form: list[str]) -> None:
    code, _, err = await cli(command, *form, "--lookupd", "127.0.0.1:1", stdin="x\n")
    assert code == 2
    assert f"the topic is positional: smartnsq {command} TOPIC" in err, err


async def test_pub_batches_by_bytes_within_max_body_size(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("big", partitions=1, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    lines = "".join(f"{i}" + "x" * (900 * 1024) + "\n" for i in range(8))  # 7.2 MiB in all
    code, out, err = await cli("pub", "big", "--lookupd", lookupd, "--json", stdin=lines)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["messages"] == 8
    assert summary["commands"] >= 2  # 5 MiB per MPUB at most


@pytest.mark.nsq_cluster(mode="classic", nodes=1)
async def test_tail_prints_a_message_however_often_it_was_delivered(nsq_cluster: Any) -> None:
    """A message requeued more times than a Consumer's default max_attempts (5) is still
    printed by ``tail``: a reader that only looks never gives a message up (each tail that
    exits gives back what it took, one more attempt each time)."""
    from smartnsq import BackoffPolicy, Consumer, RequeuePolicy

    await nsq_cluster.create_topic("seen", channels=["c"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("pub", "seen", "--lookupd", lookupd, stdin="again\n")
    assert code == 0, err
    attempts: list[int] = []
    six = asyncio.Event()

    def bounce(message: Any) -> None:
        attempts.append(message.attempts)
        if len(attempts) == 6:
            six.set()
        raise RuntimeError("not yet")

    async with Consumer("seen", "c", lookupd=[lookupd], handler=bounce, max_attempts=0,
                        backoff_policy=BackoffPolicy(enabled=False),
                        requeue_policy=RequeuePolicy(initial=0.0)) as consumer:
        async with bounded(20):
            await six.wait()
        await consumer.close()
    code, out, err = await cli("tail", "seen", "--channel", "c", "--lookupd", lookupd,
                               "-n", "1", "--json", "--timeout", "20")
    assert code == 0, err
    assert json.loads(out)["body"] == "again" and json.loads(out)["attempts"] >= 7


@pytest.mark.nsq_cluster(mode="classic", nodes=1)
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
async def test_one_signal_ends_tail_and_gives_back_what_it_took(nsq_cluster: Any,
                                                                signame: str) -> None:
    """One Ctrl-C (SIGINT) ends ``tail`` (the first was sometimes lost: 3.11's ``wait_for``
    swallowed asyncio.run's cancel), and so does ``kill PID`` (SIGTERM: what a container
    runtime and ``timeout`` send), the way Ctrl-C does: cleanup runs (tail gives back what it
    took), no traceback, exit 0 (any other command: 130 and 143)."""
    import os
    import signal
    import sys
    from pathlib import Path

    from smartnsq import Producer

    root = Path(__file__).resolve().parents[2]
    await nsq_cluster.create_topic("term", channels=["c"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    async with Producer(lookupd=[lookupd]) as producer:
        await producer.publish_many("term", [b"a", b"b", b"c"])
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("SMARTNSQ_LOOKUPD", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "tail", "term", "--channel", "c", "--lookupd",
        lookupd, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=root)
    assert proc.stdout is not None
    async with bounded(30):
        first = await proc.stdout.readline()  # it is reading
        assert first.strip() == b"a"
        proc.send_signal(getattr(signal, signame))
        _, err = await proc.communicate()
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()
    channel = nsq_cluster.state.topics["term"].partitions[0].channels["c"]
    assert channel.in_flight == 0  # given back, not left to time out


@pytest.mark.nsq_cluster(mode="classic", nodes=1)
async def test_sigterm_ends_other_commands_with_143(nsq_cluster: Any) -> None:
    """``top`` runs until stopped: SIGTERM ends it at once with 143 and one line."""
    import os
    import signal
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    await nsq_cluster.create_topic("topterm", channels=["c"])
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("SMARTNSQ_LOOKUPD", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "top", "topterm", "--interval", "0.2", "--lookupd",
        nsq_cluster.lookupd_http_addresses[0], stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=root)
    assert proc.stdout is not None
    async with bounded(30):
        assert b"topterm" in await proc.stdout.readuntil(b"topterm")  # the table is drawn
        proc.send_signal(signal.SIGTERM)
        _, err = await proc.communicate()
    assert proc.returncode == 143 and err.decode().strip() == "terminated", err.decode()
