"""``--server real``: the real servers started here, and the Go tools wrapped as clients.

Not a benchmark itself. ``real_server()`` starts a ``smartnsq.testing.realcluster.RealCluster`` (the
real classic nsqd 1.3.0, or the real youzan cluster) from ``--real DIR`` or
``$SMARTNSQ_REAL_NSQ`` and yields a ``_common.Cluster`` the scripts use like the dev cluster's,
plus the nsqd process ids, so that every run can also read the server's own CPU time
(``/proc/PID/stat``) before and after it: the nsqd's CPU per message is printed beside the
client's.

The Go tools measure themselves differently; ``GoTools`` runs each under ``os.wait4`` (so the
client's CPU time and peak RSS come from the kernel, as for no other client) and turns its
output into the same result dict the Python workers return (``rate``, ``cpu_us``,
``peak_kib``, ``seconds``, ``count``, plus ``how``: how the rate was taken):

* ``to_nsq`` (go-nsq, one PUB at a time from stdin lines) and ``nsq_tail`` (go-nsq consumer,
  ``--n N``): fixed message counts, so the rate is N over the process's wall time minus the wall
  time of the same tool doing 1 message (start-up, connect, IDENTIFY), and the CPU/msg the
  same difference of the process's CPU time;
* ``bench_writer`` and ``bench_reader`` (raw protocol, no client library) run for a duration
  and print their own count and window; the rate is the count the server confirms (messages
  stored, or taken off the channel) over the tool's own window. ``GOMAXPROCS=1`` so each opens
  one connection as the Python clients do (each of their goroutines opens its own).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import Cluster

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (``/proc/PID/stat``, whole process)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after "pid (comm)": state is field 3, utime 14 and stime 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / TICK


class ServerCpu:
    """The nsqd processes' CPU seconds over a stretch."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.start = self.read()

    def read(self) -> float:
        total = 0.0
        for pid in self.pids:
            with suppress(OSError):
                total += proc_cpu(pid)
        return total

    def used(self) -> float:
        return self.read() - self.start


@dataclass
class RealServer(Cluster):
    """A ``_common.Cluster`` over a started ``RealCluster`` (``real``)."""

    real: Any = field(repr=False, default=None)

    @property
    def nsqd_pids(self) -> list[int]:
        return [n.pid for n in self.real.nodes if n.pid]

    def fresh_topic(self, topic: str, channel: str | None = "bench", partitions: int = 1,
                    replicas: int = 1) -> None:
        if self.mode == "classic":
            super().fresh_topic(topic, channel, partitions, replicas)
            return
        self.drop_topic(topic)
        asyncio.run(self.real.create_topic(topic, partitions, replicas,
                                           channels=[channel or "bench"]))

    def drop_topic(self, topic: str) -> None:
        if self.mode == "classic":
            super().drop_topic(topic)
            return
        for lookupd in self.lookupd_http:  # only the leading lookupd deletes; try each
            with suppress(OSError):
                self.post("/topic/delete", lookupd, topic=topic, partition="**")
                return

    def describe(self) -> str:
        version = self.info().get("version", "?")
        what = ("classic nsqd" if self.mode == "classic" else
                f"youzan cluster: etcd, {len(self.lookupd_http)} nsqlookupd, "
                f"{len(self.nsqd_tcp)} nsqd")
        return (f"real {what} {version} started here (smartnsq.testing.realcluster.RealCluster, "
                f"{self.real.bin}; nsqd flags: {' '.join(self.real.nsqd_args) or 'defaults'}), "
                "separate processes, loopback")


def real_dir(arg: str | None) -> str:
    folder = arg or os.environ.get("SMARTNSQ_REAL_NSQ")
    if not folder:
        raise SystemExit("--server real needs --real DIR or $SMARTNSQ_REAL_NSQ (the folder of "
                         "the real binaries: classic/ and youzan/)")
    return folder


@contextmanager
def real_server(mode: str, folder: str, nodes: int = 1, lookupds: int = 1,
                nsqd_args: tuple[str, ...] = ()) -> Iterator[RealServer]:
    from smartnsq.testing.realcluster import RealCluster

    real = RealCluster(nodes=nodes, lookupds=lookupds, mode=mode, binaries=folder,
                       nsqd_args=nsqd_args)
    asyncio.run(real.start())
    try:
        yield RealServer(mode, real.nsqd_tcp_addresses, real.nsqd_http_addresses,
                         real.lookupd_http_addresses, None, real)
    finally:
        real.stop_now()


def vm_hwm(pid: int) -> int:
    """The process's peak RSS so far in KiB (``VmHWM``; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# -- the Go tools ---------------------------------------------------------------------------------

@dataclass
class Run:
    wall: float
    cpu: float
    sys: float  # the kernel's share of cpu
    peak_kib: int
    rc: int
    out: str
    err: str


def run_process(argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
                timeout: float = 300, stdout_null: bool = False) -> Run:
    """Run a process to its end; wall time, CPU and peak RSS from ``wait4``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin_f = open(stdin, "rb") if stdin else subprocess.DEVNULL  # noqa: SIM115
        try:
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, stdin=stdin_f,
                                    stdout=subprocess.DEVNULL if stdout_null else out,
                                    stderr=err, env={**os.environ, **(env or {})})
            deadline = time.monotonic() + timeout
            hwm = 0
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                hwm = max(hwm, vm_hwm(proc.pid))
                if time.monotonic() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.001)
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if stdin:
                stdin_f.close()  # type: ignore[union-attr]
        out.seek(0)
        err.seek(0)
        # not ru_maxrss: a child forked from this interpreter inherits its high-water mark
        return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_stime, hwm,
                   proc.returncode, out.read().decode(errors="replace"),
                   err.read().decode(errors="replace"))


_DURATION = re.compile(r"duration: (\S+) - [\d.]+mb/s - ([\d.]+)ops/s")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float:
    """Go's ``time.Duration.String()`` (``1.5s``, ``999.2ms``, ``1m2.5s``) in seconds."""
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text):
        total += float(number) * _UNITS[unit]
    return total


def parse_bench(text: str) -> tuple[float, float]:
    """bench_writer/bench_reader's last line: (window seconds, ops/s)."""
    match = _DURATION.search(text)
    if not match:
        raise RuntimeError(f"no 'duration: ...' line in: {text.strip()[-200:]}")
    return go_duration(match.group(1)), float(match.group(2))


class GoTools:
    """The real distribution's Go clients, as ``--server real`` runs them."""

    def __init__(self, folder: str, procs: int = 1) -> None:
        base = Path(folder)
        self.classic = base / "classic" if (base / "classic").is_dir() else base
        self.youzan = base / "youzan" if (base / "youzan").is_dir() else base
        self.env = {"GOMAXPROCS": str(procs)}

    def available(self, tool: str) -> str | None:
        where = self.youzan if tool == "yzgo" else self.classic
        return None if (where / tool).is_file() else f"no {where / tool}"

    @staticmethod
    def _lines(count: int, body: int, tmp: str) -> str:
        path = os.path.join(tmp, f"lines-{count}-{body}")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write((b"x" * body + b"\n") * count)
        return path

    def to_nsq(self, addr: str, topic: str, count: int, body: int, rate: int = 0
               ) -> dict[str, Any]:
        """``count`` PUBs one at a time; start-up taken out by a 1-message run."""
        argv = [str(self.classic / "to_nsq"), f"--nsqd-tcp-address={addr}", f"--topic={topic}"]
        if rate:
            argv.append(f"--rate={rate}")
        with tempfile.TemporaryDirectory(prefix="smartnsq-to-nsq-") as tmp:
            one = run_process(argv, stdin=self._lines(1, body, tmp))
            full = run_process(argv, stdin=self._lines(count, body, tmp))
        if one.rc or full.rc:
            return {"error": f"to_nsq exit {full.rc or one.rc}: "
                             f"{(full.err or one.err).strip()[-160:]}"}
        return _fixed(count, one, full,
                      how="wall time of to_nsq with N stdin lines minus with 1 line")

    def nsq_tail(self, addr: str, topic: str, channel: str, count: int, mif: int,
                 base_topic: str) -> dict[str, Any]:
        """``--n N`` messages; start-up taken out by a run on a 1-message topic."""
        def argv(t: str, n: int) -> list[str]:
            return [str(self.classic / "nsq_tail"), f"--nsqd-tcp-address={addr}",
                    f"--topic={t}", f"--channel={channel}", f"--max-in-flight={mif}",
                    f"--n={n}"]
        one = run_process(argv(base_topic, 1), stdout_null=True)
        full = run_process(argv(topic, count), stdout_null=True)
        if one.rc or full.rc:
            return {"error": f"nsq_tail exit {full.rc or one.rc}: "
                             f"{(full.err or one.err).strip()[-160:]}"}
        return _fixed(count, one, full,
                      how="wall time of nsq_tail --n N minus --n 1 (on a 1-message topic); "
                          "it writes each body to stdout (/dev/null)")

    def bench_writer(self, addr: str, topic: str, batch: int, body: int, runfor: float
                     ) -> dict[str, Any]:
        run = run_process([str(self.classic / "bench_writer"), f"--nsqd-tcp-address={addr}",
                           f"--topic={topic}", f"--size={body}", f"--batch-size={batch}",
                           f"--runfor={runfor}s"], env=self.env)
        if run.rc:
            return {"error": f"bench_writer exit {run.rc}: {run.err.strip()[-160:]}"}
        window, ops = parse_bench(run.err + run.out)
        count = round(ops * window)
        return {"count": count, "seconds": window, "rate": count / window,
                "cpu_us": run.cpu / count * 1e6, "sys_us": run.sys / count * 1e6,
                "peak_kib": run.peak_kib,
                "how": "its own count (checked against the server's) over its own window; "
                       "CPU and RSS of the whole process", "timed_by_tool": True}

    def bench_reader(self, addr: str, topic: str, channel: str, rdy: int, body: int,
                     runfor: float) -> dict[str, Any]:
        run = run_process([str(self.classic / "bench_reader"), f"--nsqd-tcp-address={addr}",
                           f"--topic={topic}", f"--channel={channel}", f"--size={body}",
                           f"--rdy={rdy}", f"--runfor={runfor}s"], env=self.env)
        if run.rc:
            return {"error": f"bench_reader exit {run.rc}: {run.err.strip()[-160:]}"}
        window, ops = parse_bench(run.err + run.out)
        count = round(ops * window)
        return {"count": count, "seconds": window, "rate": count / window,
                "cpu_us": run.cpu / max(count, 1) * 1e6,
                "sys_us": run.sys / max(count, 1) * 1e6, "peak_kib": run.peak_kib,
                "how": "its own count over its own window (runfor), from a channel loaded "
                       "with more than it can read in that time", "timed_by_tool": True}

    def yzgo(self, args: list[str], timeout: float = 600) -> dict[str, Any]:
        import json

        run = run_process([str(self.youzan / "yzgo"), *args], timeout=timeout)
        line = next((ln for ln in reversed(run.out.splitlines())
                     if ln.startswith("RESULT ")), None)
        if run.rc or line is None:
            return {"error": f"yzgo exit {run.rc}: {(run.err or run.out).strip()[-200:]}"}
        data: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        return data | {"wait4_cpu_s": run.cpu, "wait4_peak_kib": run.peak_kib,
                       "process_wall": run.wall}


def _fixed(count: int, one: Run, full: Run, how: str) -> dict[str, Any]:
    n = count - 1  # the 1-message run did one of them
    wall = max(full.wall - one.wall, 1e-9)
    cpu = max(full.cpu - one.cpu, 0.0)
    system = max(full.sys - one.sys, 0.0)
    return {"count": count, "seconds": wall, "rate": n / wall, "cpu_us": cpu / n * 1e6,
            "sys_us": system / n * 1e6,
            "peak_kib": full.peak_kib, "how": how, "startup_s": one.wall}
