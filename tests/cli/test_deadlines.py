"""Every command against a refusing, silent, trickling and non-NSQ peer ends within its
``--timeout`` with one line and exit status 1; Ctrl-C ends it with 130 (``tail``: 0).

The commands run as real processes (from the worktree root, so this checkout's package is the
one imported), each timed from the command line's entry point to its return; the peers are
``smartnsq.testing.hostile``'s, on the test's loop. Ctrl-C goes to ``python -m smartnsq``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from smartnsq.testing.hostile import DripLookupd, SilentLookupd, SilentNsqd, StallingNsqd

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 1.5
ALLOWANCE = 1.0  # the command's imports of the library, and closing, on a shared machine
BOUND = 60.0


class NotNsq:
    """A server that speaks another protocol: a banner, then it reads and ignores."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        writer.write(b"SSH-2.0-OpenSSH_9.6 not an NSQ server\r\n")
        try:
            await writer.drain()
            while await reader.read(65536):
                pass
        except OSError:
            pass

    async def __aenter__(self) -> NotNsq:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()


class Refusing:
    """A port nothing listens on."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{s.getsockname()[1]}"

    async def __aenter__(self) -> Refusing:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "SMARTNSQ_LOOKUPD"}
    out["PYTHONPATH"] = str(ROOT)
    return out


# the command line's own entry point, timed from the call to its return, with the library
# imported first: starting the interpreter and importing take seconds on a loaded 2-core
# machine (2.5-3.3 s at a load of 10), which is not what --timeout bounds or this measures
TIMED = ("import sys, time\n"
         "from smartnsq.cli import main\n"
         "import smartnsq.admin, smartnsq.consumer, smartnsq.discovery.lookup, smartnsq.producer\n"
         "import smartnsq.cli.devcluster\n"
         "started = time.monotonic()\n"
         "code = main(sys.argv[1:])\n"
         "print(f'@@took {time.monotonic() - started:.3f}', flush=True)\n"
         "sys.exit(code)\n")


async def smartnsq(*argv: str, stdin: bytes = b"") -> tuple[int, str, float]:
    """Run the command line in a process: exit status, stderr, seconds ``main`` took."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", TIMED, *argv, cwd=ROOT, env=env(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), BOUND)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    took = [line for line in out.decode().splitlines() if line.startswith("@@took ")]
    assert took, (out, err)
    return proc.returncode, err.decode(), float(took[-1].split()[1])


PEERS: dict[str, Any] = {"refusing": Refusing, "silent lookupd": SilentLookupd,
                         "trickling lookupd": lambda: DripLookupd(interval=0.3),
                         "silent nsqd": SilentNsqd, "stalling nsqd": StallingNsqd,
                         "not nsq": NotNsq}
AS_LOOKUPD = ("refusing", "silent lookupd", "trickling lookupd", "silent nsqd", "not nsq")
AS_NSQD = ("refusing", "silent nsqd", "stalling nsqd", "silent lookupd", "not nsq")
AS_NSQD_HTTP = ("refusing", "silent nsqd", "trickling lookupd", "not nsq")


def runs(peers: dict[str, Any]) -> list[tuple[str, list[str], bytes]]:
    t = ["--timeout", str(TIMEOUT)]
    line = b'{"id": 1}\n'
    out: list[tuple[str, list[str], bytes]] = []
    for name in AS_LOOKUPD:
        a = peers[name].address
        out += [(name, ["lookup", "orders", "--lookupd", a, *t], b""),
                (name, ["stats", "orders", "--lookupd", a, *t], b""),
                (name, ["tail", "orders", "--lookupd", a, *t], b""),
                (name, ["pub", "orders", "--lookupd", a, *t], line)]
    for name in AS_NSQD:
        a = peers[name].address
        out += [(name, ["tail", "orders", "--nsqd", a, *t], b""),
                (name, ["pub", "orders", "--nsqd", a, *t], line)]
    for name in AS_NSQD_HTTP:
        out.append((name, ["stats", "orders", "--nsqd-http", peers[name].address, *t], b""))
    return out


async def test_every_command_ends_within_its_timeout_with_one_line() -> None:
    async with AsyncExitStack() as stack:
        peers = {name: await stack.enter_async_context(make()) for name, make in PEERS.items()}
        gate = asyncio.Semaphore(3)  # two cores: a few interpreters at a time

        async def one(name: str, argv: list[str], stdin: bytes) -> str | None:
            async with gate:
                code, err, took = await smartnsq(*argv, stdin=stdin)
            lines = err.strip().splitlines()
            what = f"{argv[0]} {argv[2]} <{name}>: {took:.2f} s, status {code}: {err!r}"
            if code != 1 or len(lines) != 1 or "Traceback" in err \
                    or not lines[0].startswith(f"smartnsq {argv[0]}: error: ") \
                    or took > TIMEOUT + ALLOWANCE:
                return what
            return None

        results = await asyncio.gather(*(one(*r) for r in runs(peers)))
    failures = [r for r in results if r is not None]
    assert not failures, "\n".join(failures)


async def test_a_timeout_names_the_peer_and_hints_at_the_port() -> None:
    async with SilentLookupd() as lookupd, SilentNsqd() as nsqd:
        code, err, _ = await smartnsq("lookup", "orders", "--lookupd", lookupd.address,
                                      "--timeout", "1")
        assert code == 1
        assert f"from {lookupd.address} within 1 s" in err and "4161" in err
        code, err, _ = await smartnsq("tail", "orders", "--nsqd", nsqd.address,
                                      "--timeout", "1")
        assert code == 1 and nsqd.address in err and "4150" in err


class _Noticed(SilentLookupd):
    """A silent lookupd that says when the first request came in."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        self.asked.set()
        await super().answer(path, writer)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
@pytest.mark.parametrize(("command", "expected"), [("lookup", 130), ("stats", 130),
                                                    ("pub", 130), ("tail", 0)])
async def test_ctrl_c_exit_status(command: str, expected: int) -> None:
    """Ctrl-C while the command waits on a peer: 130 (docs/cli.md), ``tail`` 0."""
    async with _Noticed() as lookupd:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", command, "orders", "--lookupd",
            lookupd.address, "--timeout", "30", cwd=ROOT, env=env(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"x\n")
            await asyncio.wait_for(lookupd.asked.wait(), BOUND)
            proc.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(proc.communicate(), BOUND)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == expected, err
    assert b"Traceback" not in err


async def test_fault_against_a_silent_admin_endpoint_ends_within_its_timeout() -> None:
    async with _Noticed() as admin:
        code, err, took = await smartnsq("dev-cluster", "fault", "--admin", admin.address,
                                         "--timeout", "1", "status")
        assert code == 1 and took < 1 + ALLOWANCE
        assert err.strip().splitlines() == [
            f"fault status: no answer from the admin endpoint {admin.address} within 1 s"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
async def test_ctrl_c_during_a_fault_request_exits_130() -> None:
    async with _Noticed() as admin:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", "dev-cluster", "fault", "--admin",
            admin.address, "status", cwd=ROOT, env=env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        try:
            await asyncio.wait_for(admin.asked.wait(), BOUND)
            proc.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(proc.communicate(), BOUND)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130 and b"Traceback" not in err, err
