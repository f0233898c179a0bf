"""Shared plumbing of the benchmark scripts (not a benchmark itself).

Every figure we quote is a ratio taken in one run against one endpoint, so this module gives
the scripts the same three things: a dev cluster in its own process (the server must not share
the client's event loop or GIL), a way to run each client in its own interpreter (gevent's
monkeypatching must not leak into the asyncio clients), and the environment block printed
under every table so a figure can be traced back to the machine that produced it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
# Measure the checkout these scripts live in, not whatever smartnsq is installed (an editable
# install may point at another checkout): ``python bench/x.py`` puts bench/ on sys.path, not
# the root.
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

from smartnsq.protocol import commands  # noqa: E402
from smartnsq.protocol.frames import (  # noqa: E402
    CLASSIC_LAYOUT,
    ErrorFrame,
    FrameReader,
    MessageFrame,
    Response,
)

PEERS = ("pynsq", "gnsq", "ansq", "asyncnsq")
# distribution name -> module imported by the worker
PEER_MODULES = {"pynsq": "nsq", "gnsq": "gnsq", "ansq": "ansq", "asyncnsq": "asyncnsq"}


# -- environment ---------------------------------------------------------------------------

def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "?"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else "?"


def _git_rev() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=False)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def _smartnsq_path() -> str:
    import smartnsq

    return os.path.dirname(os.path.dirname(os.path.abspath(smartnsq.__file__)))


def _extensions() -> str:
    """Which path this process runs (the workers inherit the environment that decides it)."""
    from smartnsq import extensions

    return extensions.describe()


def environment(extra: str = "") -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    lines = [
        "environment:",
        f"  date        {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"  python      {platform.python_implementation()} {platform.python_version()} "
        f"({platform.system()} {platform.machine()})",
        f"  cpu         {os.cpu_count()} x {_cpu_model()}",
        f"  load avg    {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (at the end of the run)",
        f"  smartnsq    {_version('smartnsq')} (git {_git_rev()}; imported from "
        f"{_smartnsq_path()})",
        f"  modules     {_extensions()} (workers named @pure: the pure-Python ones)",
        "  peers       " + ", ".join(f"{p} {_version(p)}" for p in PEERS),
    ]
    if extra:
        lines.append(f"  {extra}")
    return "\n".join(lines)


def command_line() -> str:
    rel = os.path.relpath(sys.argv[0], ROOT)
    return "python " + " ".join([rel, *sys.argv[1:]])


# -- tables --------------------------------------------------------------------------------

def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100_000:
        return f"{value / 1000:,.0f}k"
    if value >= 10_000:
        return f"{value / 1000:,.1f}k"
    return f"{value:,.0f}"


def fmt_ratio(value: float | None, base: float | None) -> str:
    if not value or not base:
        return "-"
    return f"{value / base:.2f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, padded so it also reads well in a terminal."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


# -- the dev cluster in its own process ------------------------------------------------------

@dataclass
class Cluster:
    """A server the clients run against: the dev cluster's process, or a real one (``process``
    None) named by ``--server nsqd=HOST:PORT[,lookupd=HOST:PORT]``."""

    mode: str
    nsqd_tcp: list[str]
    nsqd_http: list[str]
    lookupd_http: list[str]
    process: subprocess.Popen[str] | None = field(repr=False, default=None)

    @property
    def tcp(self) -> str:
        return self.nsqd_tcp[0]

    @property
    def http(self) -> str:
        return self.nsqd_http[0]

    # Topics are created and deleted per run so that every client starts from an empty topic
    # and the server's memory does not grow across runs. Classic: nsqd's HTTP API. Youzan:
    # as an operator does it (docs/protocol.md §2): create on the lookupd, wait for a leader,
    # create the channel on the leader (a youzan channel created later would start at the
    # partition's end, and writers do not see a partition without a channel).
    def post(self, path: str, host: str | None = None, **params: str) -> bytes:
        url = f"http://{host or self.http}{path}?{urllib.parse.urlencode(params)}"
        req = urllib.request.Request(url, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return bytes(resp.read())

    def _lookup(self, topic: str, access: str) -> dict[str, Any]:
        url = (f"http://{self.lookupd_http[0]}/lookup?"
               f"{urllib.parse.urlencode({'topic': topic, 'access': access})}")
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                data: dict[str, Any] = json.loads(resp.read())
        except OSError:
            return {}
        return dict(data.get("data", data))

    def _wait_lookup(self, topic: str, access: str) -> None:
        deadline = time.monotonic() + 30
        while not self._lookup(topic, access).get("partitions"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: no partition in access={access} lookups")
            time.sleep(0.01)  # a benchmark's set-up poll, not a test

    def info(self) -> dict[str, Any]:
        """nsqd's ``/info`` (its version, for the environment block); {} when unreachable."""
        req = urllib.request.Request(f"http://{self.http}/info",
                                     headers={"Accept": "application/vnd.nsq; version=1.0"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                data: dict[str, Any] = json.loads(resp.read())
        except (OSError, ValueError):
            return {}
        return dict(data.get("data", data))

    def describe(self) -> str:
        """Which server a table was measured against, for the header and the environment."""
        version = self.info().get("version", "?")
        if self.process is not None:
            return (f"smartnsq dev-cluster --mode {self.mode}, {len(self.nsqd_tcp)} nsqd "
                    f"(version string {version}), separate process, loopback")
        where = f"nsqd {','.join(self.nsqd_tcp)} (http {self.http})"
        if self.lookupd_http:
            where += f", lookupd {','.join(self.lookupd_http)}"
        return (f"an external {self.mode} server (not started here): {where}, nsqd /info "
                f"version {version}")

    def fresh_topic(self, topic: str, channel: str | None = "bench", partitions: int = 1,
                    replicas: int = 1) -> None:
        if self.mode == "classic":
            with suppress(OSError):  # did not exist
                self.post("/topic/delete", topic=topic)
            self.post("/topic/create", topic=topic)
            if channel:
                self.post("/channel/create", topic=topic, channel=channel)
            return
        if not self.lookupd_http:
            raise RuntimeError("a youzan server needs lookupd=HOST:PORT to create topics")
        lookupd = self.lookupd_http[0]
        with suppress(OSError):
            self.post("/topic/delete", lookupd, topic=topic, partition="**")
        # more partitions x replicas than nodes needs several partitions per node (multipart)
        multi = {"multipart": "true"} if partitions * replicas > len(self.nsqd_tcp) else {}
        self.post("/topic/create", lookupd, topic=topic, partition_num=str(partitions),
                  replicator=str(replicas), **multi)
        deadline = time.monotonic() + 30
        while len(self._lookup(topic, "r").get("partitions") or {}) < partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: not every partition has a leader")
            time.sleep(0.01)  # a benchmark's set-up poll, not a test
        for pid, leader in self.leaders(topic).items():
            self.post("/channel/create", leader, topic=topic, partition=str(pid),
                      channel=channel or "bench")
        deadline = time.monotonic() + 30
        while len(self._lookup(topic, "w").get("partitions") or {}) < partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: not every partition is writable")
            time.sleep(0.01)

    def leaders(self, topic: str) -> dict[int, str]:
        """Youzan: partition -> its leader's HTTP address, from an access=r lookup."""
        out = {}
        for pid, node in (self._lookup(topic, "r").get("partitions") or {}).items():
            out[int(pid)] = f"{node['broadcast_address']}:{node['http_port']}"
        return out

    def youzan_count(self, topic: str) -> int:
        """Messages the topic's partition leaders hold (replicas not counted twice)."""
        total = 0
        for http in self.nsqd_http:
            url = f"http://{http}/stats?format=json&topic={topic}"
            req = urllib.request.Request(
                url, headers={"Accept": "application/vnd.nsq; version=1.0"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                data: dict[str, Any] = json.loads(resp.read())
            data = data.get("data", data)
            for t in data.get("topics") or []:
                if t.get("topic_name") == topic and t.get("is_leader"):
                    total += int(t.get("message_count", 0))
        return total

    def drop_topic(self, topic: str) -> None:
        with suppress(OSError):
            if self.mode == "classic":
                self.post("/topic/delete", topic=topic)
            else:
                self.post("/topic/delete", self.lookupd_http[0], topic=topic, partition="**")

    def stats(self, topic: str) -> dict[str, Any]:
        url = f"http://{self.http}/stats?format=json&topic={topic}"
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            data: dict[str, Any] = json.loads(resp.read())
        data = data.get("data", data)
        for t in data.get("topics") or []:
            if t.get("topic_name") == topic:
                return dict(t)
        return {}

    def message_count(self, topic: str) -> int | None:
        info = self.stats(topic)
        count = info.get("message_count")
        return int(count) if count is not None else None


@contextmanager
def dev_cluster(mode: str = "classic", nodes: int = 1, topics: Sequence[str] = (),
                channels: Sequence[str] = ("bench",), lookupds: int = 1) -> Iterator[Cluster]:
    """``smartnsq dev-cluster`` in a child process; yields its addresses.

    ``topics`` (``NAME[:PARTITIONS[:REPLICAS]]``) are created at start with ``channels``:
    a youzan channel created later starts at the partition's end, so it must exist before
    anything is published.
    """
    cmd = [sys.executable, "-m", "smartnsq", "dev-cluster", "--mode", mode, "--nodes", str(nodes),
           "--lookupds", str(lookupds)]
    for topic in topics:
        cmd += ["--topic", topic]
    if topics:
        for channel in channels:
            cmd += ["--channel", channel]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    values: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"dev cluster exited: {err.strip()}")
            if "=" in line and line.split("=", 1)[0].isupper():
                key, value = line.strip().split("=", 1)
                values[key] = value
            if line.startswith("running"):
                break
        else:
            raise RuntimeError("dev cluster did not start within 30 s")
        yield Cluster(mode, values["NSQD_TCP"].split(","), values["NSQD_HTTP"].split(","),
                      values["NSQLOOKUPD_HTTP"].split(","), proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class ServerSpec:
    """``--server nsqd=HOST:PORT[,lookupd=HOST:PORT][,http=HOST:PORT]``: a server process the
    scripts do not start (a real nsqd 1.3.0, a youzan cluster, or a dev cluster started by
    hand). ``http`` is nsqd's HTTP address, used to create, count and delete the benchmark's
    topics; by default the TCP port + 1, as nsqd's defaults are (4150/4151)."""

    nsqd: str
    http: str
    lookupd: str = ""


def server_arg(value: str) -> str | ServerSpec:
    """argparse type of ``--server``: ``minimal``, ``devcluster``, ``real`` (the real servers
    started here: ``bench/_real.py``) or a ServerSpec."""
    import argparse

    if value in ("minimal", "devcluster", "real"):
        return value
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, addr = part.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or key not in ("nsqd", "lookupd", "http") or not colon or not host \
                or not port.isdigit():
            raise argparse.ArgumentTypeError(
                f"{value!r}: expected minimal, devcluster, real or "
                "nsqd=HOST:PORT[,lookupd=HOST:PORT][,http=HOST:PORT]")
        fields[key] = addr
    if "nsqd" not in fields:
        raise argparse.ArgumentTypeError(f"{value!r}: nsqd=HOST:PORT is required")
    host, _, port = fields["nsqd"].rpartition(":")
    return ServerSpec(fields["nsqd"], fields.get("http", f"{host}:{int(port) + 1}"),
                      fields.get("lookupd", ""))


@contextmanager
def external_server(spec: ServerSpec, mode: str = "classic") -> Iterator[Cluster]:
    """A server someone else runs: checked reachable, never started or stopped here."""
    host, _, port = spec.nsqd.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise RuntimeError(f"nsqd {spec.nsqd} is not reachable: {exc}") from None
    yield Cluster(mode, [spec.nsqd], [spec.http], [spec.lookupd] if spec.lookupd else [])


@contextmanager
def cluster_server(server: str | ServerSpec, mode: str = "classic") -> Iterator[Cluster]:
    """The dev cluster in its own process, or the real server ``--server nsqd=...`` names."""
    if isinstance(server, ServerSpec):
        with external_server(server, mode) as cluster:
            yield cluster
    else:
        with dev_cluster(mode) as cluster:
            yield cluster


# -- workers: one client per interpreter ----------------------------------------------------

# A client (or youzan item) named with this suffix runs the same worker from another checkout
# of the project (``--baseline DIR``): the tree before a change, measured in the same run and
# against the same server as the tree after it, interleaved with it.
BASELINE_SUFFIX = "@base"
BASELINE_ENV = "SMARTNSQ_BENCH_BASELINE"
# ... and with this one (``--pure``), the same worker of this tree on the pure-Python modules
# (SMARTNSQ_NO_EXTENSIONS=1: the compiled ones stepped around; smartnsq/extensions.py)
PURE_SUFFIX = "@pure"
TWIN_SUFFIXES = (BASELINE_SUFFIX, PURE_SUFFIX)


def set_baseline(tree: str) -> Path:
    """Where the ``@base`` workers come from (checked here: a typo must not measure nothing)."""
    path = Path(tree).resolve()
    if not (path / "bench").is_dir() or not (path / "smartnsq").is_dir():
        raise SystemExit(f"--baseline {tree}: not a checkout of smartnsq (no bench/, smartnsq/)")
    os.environ[BASELINE_ENV] = str(path)
    return path


def baseline_name(name: str) -> str:
    """The worker's own name for a ``@base`` or ``@pure`` client or item (without the suffix)."""
    for suffix in TWIN_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def with_baseline(clients: Sequence[str], suffix: str = BASELINE_SUFFIX) -> list[str]:
    """``clients`` with each smartnsq client's twin (``@base``, or ``suffix``) right after it."""
    out: list[str] = []
    for client in clients:
        out.append(client)
        if client.startswith("smartnsq") and not client.endswith(TWIN_SUFFIXES):
            out.append(client + suffix)
    return out


def topic_part(name: str) -> str:
    """A client's or item's name as part of a topic name (``-`` and ``@`` are not allowed)."""
    return name.replace("-", "_").replace("@", "_")


def run_worker(script: str, args: Sequence[str], timeout: float = 300,
               prefix: Sequence[str] = (), python_flags: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``script --worker ...`` in a fresh interpreter; its last stdout line is JSON.

    ``prefix``: a command the interpreter runs under (``valgrind --tool=callgrind ...``);
    ``python_flags``: the interpreter's own (``-O``). A first argument ending in ``@base``
    runs the baseline checkout's own copy of ``script`` (its ``bench/`` puts its tree first on
    ``sys.path``), with the suffix removed; one ending in ``@pure`` runs this tree's worker
    with ``SMARTNSQ_NO_EXTENSIONS=1``."""
    root = ROOT
    env = worker_env()
    if args and args[0].endswith(BASELINE_SUFFIX):
        root = Path(os.environ[BASELINE_ENV])
    if args and args[0].endswith(PURE_SUFFIX):
        env["SMARTNSQ_NO_EXTENSIONS"] = "1"
    if args:
        args = [baseline_name(args[0]), *args[1:]]
    cmd = [*prefix, sys.executable, *python_flags, str(root / "bench" / script), "--worker",
           *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=root,
                             check=False, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {out.returncode}: {tail[:160]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def worker_env() -> dict[str, str]:
    """The workers' environment: with a bytecode cache, as an installed package has.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it), every worker would
    compile smartnsq from source at import: about 3.5x the import's instructions and ~4 MiB
    more RSS after import than an installed wheel costs. The cache goes to a temporary
    directory (``PYTHONPYCACHEPREFIX``), not into the checkout.
    """
    import tempfile

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "smartnsq-bench-pycache")
    return env


def emit(result: dict[str, Any]) -> None:
    """A worker's answer to ``run_worker``."""
    print(json.dumps(result), flush=True)


def peer_available(peer: str) -> str | None:
    """None when the peer imports in a fresh interpreter, else why not."""
    mod = PEER_MODULES[peer]
    out = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True,
                         text=True, timeout=60, check=False)
    if out.returncode == 0:
        return None
    return (out.stderr.strip().splitlines() or ["import failed"])[-1][:160]


class Span:
    """Wall-clock and process CPU time of a measured stretch.

    CPU time is the client's own cost (every thread of its interpreter), which the load of a
    shared machine and the server's speed disturb far less than wall-clock rates.
    """

    __slots__ = ("_cpu0", "_sys0", "_wall0", "cpu", "system", "wall")

    def __init__(self) -> None:
        self._wall0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._sys0 = os.times().system
        self.wall = self.cpu = self.system = 0.0

    @classmethod
    def begin(cls) -> Span:
        return cls()

    def end(self) -> Span:
        self.wall = time.perf_counter() - self._wall0
        self.cpu = time.process_time() - self._cpu0
        self.system = os.times().system - self._sys0  # the kernel's share of cpu
        return self


# -- a minimal blocking client, for pre-loading and for measuring the server ------------------

class RawClient:
    """One blocking socket speaking just enough V2 to load topics and measure the server.

    Deliberately thin (no library in the way) so that its own cost is small next to the
    server's: what it measures is close to what the server can take.
    """

    def __init__(self, address: str, layout: Any = CLASSIC_LAYOUT) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"  V2")
        self.reader = FrameReader(layout)
        self.sock.sendall(commands.identify({"feature_negotiation": True,
                                             "heartbeat_interval": 60000}))
        self.expect(1)

    def frames(self) -> list[Any]:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("server closed the connection")
        return self.reader.feed(data)

    def expect(self, count: int) -> None:
        """Wait for ``count`` responses; raise on an error frame."""
        got = 0
        while got < count:
            for frame in self.frames():
                if isinstance(frame, ErrorFrame):
                    raise RuntimeError(frame.payload.decode(errors="replace"))
                if isinstance(frame, Response):
                    got += 1

    def send_and_count(self, payload: bytes, count: int) -> None:
        """Send ``payload`` (``count`` commands with answers) while reading the answers."""
        import threading

        sender = threading.Thread(target=self.sock.sendall, args=(payload,), daemon=True)
        sender.start()
        self.expect(count)
        sender.join()

    def preload(self, topic: str, count: int, body: bytes, batch: int = 100,
                partition: int | None = None) -> None:
        batches = []
        left = count
        while left > 0:
            n = min(batch, left)
            batches.append(commands.mpub(topic, [body] * n, partition))
            left -= n
        self.send_and_count(b"".join(batches), len(batches))

    def close(self) -> None:
        self.sock.close()


def is_message(frame: object) -> bool:
    return isinstance(frame, MessageFrame)


# -- the minimal endpoint in its own process -------------------------------------------------

@dataclass
class Endpoint:
    """``bench/_endpoint.py`` running in a child process (see its docstring).

    ``connections()`` returns the counters of the connections closed since the last call:
    the endpoint prints them when a client's connection goes away, which is when its worker
    process exits, so they are read after ``run_worker`` returns.
    """

    tcp: str
    process: subprocess.Popen[str] = field(repr=False)
    _lines: Any = field(repr=False, default=None)

    def connections(self, expect: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        import queue

        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            wait = deadline - time.monotonic() if len(out) < expect else 0.05
            try:
                out.append(self._lines.get(timeout=max(wait, 0.0)))
            except queue.Empty:
                return out


@contextmanager
def minimal_endpoint(body: int = 100) -> Iterator[Endpoint]:
    import queue
    import threading

    cmd = [sys.executable, str(BENCH_DIR / "_endpoint.py"), "--body", str(body)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first.startswith("LISTEN "):
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"endpoint did not start: {first.strip()} {err.strip()}")

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{"):
                    lines.put(json.loads(line))

        threading.Thread(target=pump, daemon=True).start()
        yield Endpoint(first.split()[1], proc, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def max_rss_kib() -> int:
    """The process's RSS high-water mark in KiB.

    Linux: ``VmHWM`` of /proc/self/status, not ``ru_maxrss``: a worker forked from the
    orchestrator starts with the orchestrator's high-water mark in ``ru_maxrss`` (the kernel
    keeps it across exec), so a worker started after a large pre-load reported the
    orchestrator's size as its own baseline and peak."""
    import resource

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak // 1024) if sys.platform == "darwin" else int(peak)


def merge(prev: dict[str, Any] | None, result: dict[str, Any]) -> dict[str, Any]:
    """Keep the best rate and, separately, the lowest CPU cost and the lowest peak memory."""
    if prev is None or "error" in prev:
        return result
    if "error" in result:
        return prev
    cheaper = result if result["cpu_us"] < prev["cpu_us"] else prev
    peak = min(prev["peak_kib"], result["peak_kib"])
    best = result if result["rate"] > prev["rate"] else prev
    best["cpu_us"] = cheaper["cpu_us"]
    if "sys_us" in cheaper:  # the kernel's share of that same round's CPU
        best["sys_us"] = cheaper["sys_us"]
    best["peak_kib"] = peak
    return best


def fmt_kib(kib: float) -> str:
    return f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib:.0f} KiB"
