"""``RealCluster``: the real NSQ servers as processes, started and stopped like a ``DevCluster``.

For tests, benchmarks and users who have the real binaries (youzan nsqd/nsqlookupd, which need
etcd, or classic nsqd/nsqlookupd 1.3). The binaries folder comes from ``binaries=`` or the
``SMARTNSQ_REAL_NSQ`` environment variable; it holds ``youzan/`` and ``classic/`` sub-folders,
or the binaries themselves.

Where the two overlap the interface is ``DevCluster``'s (``start``/``stop``, the address
lists, ``create_topic`` until usable, ``kill_node``/``leave_node``/``start_node``,
``stop_lookupd``/``start_lookupd``), so a test can take either. The faults are what real
processes have: SIGKILL is a leader loss (the cluster notices when etcd's session expires),
SIGTERM a graceful leave. Every member gets free loopback ports picked at start and its own
temporary data folder; a member that does not come up within the start bound fails the start
with the tail of its log. Children die with the process that started them (``PR_SET_PDEATHSIG``
on Linux), and ``stop()`` (also run at interpreter exit) kills whatever is left.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ..admin import AsyncAdmin
from ..errors import AdminError, NSQError, RealNsqdError, Timeout
from ..transport.http import HttpClient

__all__ = ["ENV", "AuthHttpServer", "RealCluster", "RealMember",
           "find_binaries"]

log = logging.getLogger("smartnsq.realcluster")

ENV = "SMARTNSQ_REAL_NSQ"
"""The environment variable naming the folder of real NSQ binaries."""

HOST = "127.0.0.1"
MODES = ("youzan", "classic")
_LOG_TAIL = 30  # lines of a failed member's log shown in the error


def find_binaries(folder: str | os.PathLike[str] | None, mode: str) -> Path:
    """The folder holding ``nsqd`` and ``nsqlookupd`` of ``mode``, or ``RealNsqdError``.

    ``folder`` (default: ``$SMARTNSQ_REAL_NSQ``) may be the binaries folder itself or a folder
    with ``youzan/`` and ``classic/`` inside.
    """
    if folder is None:
        folder = os.environ.get(ENV)
        if not folder:
            raise RealNsqdError(f"no real NSQ binaries: set {ENV} to their folder")
    base = Path(folder).expanduser()
    for candidate in (base / mode, base):
        if (candidate / "nsqd").is_file() and (candidate / "nsqlookupd").is_file():
            return candidate.resolve()
    raise RealNsqdError(f"no {mode} nsqd/nsqlookupd in {base} (nor in {base / mode})")


_TAKEN: set[int] = set()
"""Ports this process handed out: the kernel may give a just-closed port again, and two
members (etcd's client and peer URLs once) then fail with "address already in use"."""


def _free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in _TAKEN:
            _TAKEN.add(port)
            return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setpgrp()  # a Ctrl-C to the terminal's group reaches the parent, which stops us in order


@dataclass
class RealMember:
    """One server process: etcd, an nsqlookupd or an nsqd."""

    name: str
    kind: str  # "etcd" | "nsqlookupd" | "nsqd"
    argv: list[str]
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    unix_path: str | None = None  # an nsqd whose TCP protocol is on this socket instead

    @property
    def log_path(self) -> Path:
        return self.workdir / "output.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def address(self, port: str) -> str:
        return f"{HOST}:{self.ports[port]}"

    @property
    def tcp_address(self) -> str:
        """What a client connects to: ``host:port``, or ``unix:PATH`` for a socket."""
        return f"unix:{self.unix_path}" if self.unix_path else self.address("tcp")

    @property
    def http_address(self) -> str:
        return self.address("http")

    def spawn(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it; we close our copy
        try:
            self.process = subprocess.Popen(
                self.argv, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        finally:
            out.close()

    def signal(self, signum: int) -> None:
        if self.running:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def log_tail(self, lines: int = _LOG_TAIL) -> str:
        try:
            text = self.log_path.read_bytes()[-16384:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    async def wait_exit(self, timeout: float) -> bool:
        """True once the process has exited (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.process is not None and self.process.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{self.kind} {self.name} {self.ports} {state}>"


class AuthHttpServer:
    """A loopback auth server for nsqd's ``--auth-http-address``, answering from a table.

    The table is the dev cluster's (``DevCluster(auth=...)``): secret -> the auth server's
    answer (``identity``, ``identity_url``, ``authorizations``). ``GET /auth?secret=S`` answers
    200 with that answer and a ``ttl``, an unknown secret 403 (nsqd then answers
    ``E_AUTH_FAILED``). It serves from a thread of its own, so it answers while the caller's
    event loop is busy. ``requests`` counts the questions asked.
    """

    def __init__(self, table: Mapping[str, Any], ttl: int = 3600) -> None:
        self.table = {str(secret): dict(answer) for secret, answer in table.items()}
        self.ttl = ttl
        self.requests = 0
        self._server: Any = None  # http.server.ThreadingHTTPServer, imported when started
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        assert self._server is not None, "not started"
        return f"{HOST}:{self._server.server_address[1]}"

    def start(self) -> AuthHttpServer:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                from urllib.parse import parse_qs, urlsplit

                owner.requests += 1
                url = urlsplit(self.path)
                secret = parse_qs(url.query).get("secret", [""])[0]
                answer = owner.table.get(secret) if url.path == "/auth" else None
                if answer is None:
                    self._reply(403, {"message": "NOT_AUTHORIZED"})
                    return
                self._reply(200, {"ttl": owner.ttl, "identity": answer.get("identity", ""),
                                  "identity_url": answer.get("identity_url", ""),
                                  "authorizations": list(answer.get("authorizations") or [])})

            def _reply(self, status: int, body: Any) -> None:
                import json

                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("auth server: " + format, *args)

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="smartnsq-auth-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


_LIVE: weakref.WeakSet[RealCluster] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for cluster in list(_LIVE):
        cluster.kill_all()


class RealCluster:
    """Real NSQ servers on loopback; use as ``async with RealCluster(...) as cluster:``.

    ``mode="youzan"``: one etcd (``etcd`` on PATH or ``etcd=``), ``lookupds`` nsqlookupds and
    ``nodes`` nsqd of one youzan cluster. ``mode="classic"``: ``lookupds`` classic
    nsqlookupds and ``nodes`` classic nsqd registered with them. ``nsqd_args`` are extra
    command-line flags for every nsqd (``["--msg-timeout=5s"]``, TLS files, ``--snappy``).
    ``auth`` is a secrets table in ``DevCluster(auth=...)``'s format: an
    :class:`AuthHttpServer` answering from it runs beside the cluster and every nsqd gets its
    ``--auth-http-address``. ``unix_sockets=True`` (classic) has every nsqd listen on a unix
    socket in its folder (``--tcp-address=PATH``) instead of a TCP port: such an nsqd cannot
    register with nsqlookupd (it has no TCP port to name), so clients reach it through
    ``nsqd_unix_addresses``. ``start_timeout`` bounds the whole start.
    """

    def __init__(self, nodes: int = 3, lookupds: int = 2, mode: str = "youzan", *,
                 binaries: str | os.PathLike[str] | None = None, etcd: str | None = None,
                 nsqd_args: Sequence[str] = (), lookupd_args: Sequence[str] = (),
                 auth: Mapping[str, Any] | None = None, start_timeout: float = 60.0,
                 workdir: str | os.PathLike[str] | None = None,
                 unix_sockets: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if unix_sockets and mode != "classic":
            raise ValueError("unix sockets are classic nsqd 1.3's (--tcp-address=PATH)")
        self.unix_sockets = unix_sockets
        if nodes < 1 or lookupds < 1:
            raise ValueError("a real cluster needs at least one nsqd and one nsqlookupd")
        self.mode = mode
        self.bin = find_binaries(binaries, mode)
        self.etcd_path = etcd or shutil.which("etcd") or "/usr/bin/etcd"
        if mode == "youzan" and not Path(self.etcd_path).is_file():
            raise RealNsqdError("youzan NSQ needs etcd (Debian: apt-get install etcd-server)")
        self._node_count = nodes
        self._lookupd_count = lookupds
        self.nsqd_args = list(nsqd_args)
        self.lookupd_args = list(lookupd_args)
        self.auth = auth
        self.auth_server: AuthHttpServer | None = None
        self.start_timeout = start_timeout
        self._workdir_arg = workdir
        self.root: Path | None = None
        self.etcd: RealMember | None = None
        self.lookupds: list[RealMember] = []
        self.nodes: list[RealMember] = []
        self.cluster_id = f"smartnsq-{os.getpid()}-{id(self) & 0xffff:x}"
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> RealCluster:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        _LIVE.add(self)
        self.root = Path(tempfile.mkdtemp(prefix=f"smartnsq-real-{self.mode}-",
                                          dir=self._workdir_arg))
        deadline = time.monotonic() + self.start_timeout
        try:
            if self.auth is not None:
                self.auth_server = AuthHttpServer(self.auth).start()
            if self.mode == "youzan":
                self.etcd = self._etcd_member()
                await self._launch(self.etcd, deadline)
            self.lookupds = [self._lookupd_member(i) for i in range(self._lookupd_count)]
            for lookupd in self.lookupds:
                await self._launch(lookupd, deadline)
            self.nodes = [self._nsqd_member(i) for i in range(self._node_count)]
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                await self._until_ready(node, deadline)
            await self._until_registered(deadline)
        except BaseException:
            await self.stop()
            raise
        log.info("real %s cluster up: lookupds %s, nsqd %s", self.mode,
                 self.lookupd_http_addresses, self.nsqd_tcp_addresses)

    @property
    def members(self) -> list[RealMember]:
        """Every process of the cluster: the nsqd, the lookupds, etcd."""
        return [*self.nodes, *self.lookupds, *([self.etcd] if self.etcd else [])]

    async def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL after 5 s) and remove the data folders."""
        for member in self.members:
            member.signal(signal.SIGTERM)
        for member in self.members:
            if not await member.wait_exit(5.0):
                member.signal(signal.SIGKILL)
                await member.wait_exit(5.0)
        self._forget()

    def stop_now(self) -> None:
        """:meth:`stop` for code outside an event loop (a session fixture's finalizer)."""
        for member in self.members:
            member.signal(signal.SIGTERM)
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(5)
                except subprocess.TimeoutExpired:
                    member.signal(signal.SIGKILL)
        self._forget()

    def _forget(self) -> None:
        """After the members were asked to stop: kill what is left, drop the data."""
        self.kill_all()
        self._stop_auth()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        _LIVE.discard(self)
        self._started = False

    def _stop_auth(self) -> None:
        if self.auth_server is not None:
            self.auth_server.stop()
            self.auth_server = None

    @property
    def healthy(self) -> bool:
        """Every member is running (a shared cluster a test damaged is started anew)."""
        return self._started and all(member.running for member in self.members)

    def kill_all(self) -> None:
        """SIGKILL every member still running (used at exit; no waiting beyond the reap)."""
        for member in self.members:
            if member.running:
                member.signal(signal.SIGKILL)
                assert member.process is not None
                with contextlib.suppress(Exception):
                    member.process.wait(5)

    async def _launch(self, member: RealMember, deadline: float) -> None:
        member.spawn()
        await self._until_ready(member, deadline)

    async def _until_ready(self, member: RealMember, deadline: float) -> None:
        path = "/health" if member.kind == "etcd" else "/ping"
        port = "client" if member.kind == "etcd" else "http"
        while True:
            if not member.running:
                raise RealNsqdError(f"{member.name} exited while starting:\n{member.log_tail()}")
            if await _http_ok(HOST, member.ports[port], path):
                return
            if time.monotonic() >= deadline:
                raise RealNsqdError(f"{member.name} not ready within {self.start_timeout}s:\n"
                                    f"{member.log_tail()}")
            await asyncio.sleep(0.05)

    async def _until_registered(self, deadline: float) -> None:
        """Until every lookupd lists every nsqd (a fresh cluster otherwise refuses topics)."""
        want = {node.ports["tcp"] for node in self.nodes if "tcp" in node.ports}
        if not want:  # nsqd on sockets only: none can register
            return
        admins = [AsyncAdmin([address], timeout=2.0) for address in self.lookupd_http_addresses]
        try:
            while True:
                seen: list[set[int]] = []
                for admin in admins:
                    try:
                        nodes: tuple[Any, ...] = await admin.nodes()
                    except NSQError:  # not up yet: ask again
                        nodes = ()
                    seen.append({n.tcp_port for n in nodes})
                if all(want <= s for s in seen):
                    return
                if time.monotonic() >= deadline:
                    raise RealNsqdError(
                        f"the nsqd did not register with every lookupd within "
                        f"{self.start_timeout}s (want {sorted(want)}, lookupds see "
                        f"{[sorted(s) for s in seen]}):\n{self.lookupds[0].log_tail()}")
                await asyncio.sleep(0.1)
        finally:
            for admin in admins:
                await admin.aclose()

    # -- members --------------------------------------------------------------------------------

    def _dir(self, name: str) -> Path:
        assert self.root is not None
        return self.root / name

    def _etcd_member(self) -> RealMember:
        ports = {"client": _free_port(), "peer": _free_port(), "metrics": _free_port()}
        client, peer = f"http://{HOST}:{ports['client']}", f"http://{HOST}:{ports['peer']}"
        workdir = self._dir("etcd")
        argv = [self.etcd_path, "--name", "smartnsq", "--data-dir", str(workdir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"smartnsq={peer}",
                "--listen-metrics-urls", f"http://{HOST}:{ports['metrics']}",
                "--enable-v2=true", "--log-level", "warn"]
        return RealMember("etcd", "etcd", argv, workdir, ports=ports)

    @property
    def _etcd_url(self) -> str:
        assert self.etcd is not None
        return f"http://{HOST}:{self.etcd.ports['client']}"

    def _lookupd_member(self, i: int) -> RealMember:
        name = f"nsqlookupd-{i + 1}"
        workdir = self._dir(name)
        ports = {"tcp": _free_port(), "http": _free_port()}
        argv = [str(self.bin / "nsqlookupd"), f"--tcp-address={HOST}:{ports['tcp']}",
                f"--http-address={HOST}:{ports['http']}", f"--broadcast-address={HOST}"]
        if self.mode == "youzan":
            ports.update(rpc=_free_port(), metric=_free_port())
            argv += [f"--cluster-id={self.cluster_id}",
                     f"--cluster-leadership-addresses={self._etcd_url}",
                     f"--rpc-port={ports['rpc']}", f"--metric-address={HOST}:{ports['metric']}",
                     f"--log-dir={workdir}"]
            # the server's own ping and inactivity timeouts: a --nsqd-ping-timeout under
            # nsqd's ping interval drops every nsqd's registration (lookups then list no
            # partitions, a topic is never writable)
        return RealMember(name, "nsqlookupd", [*argv, *self.lookupd_args], workdir, ports=ports)

    def _nsqd_member(self, i: int) -> RealMember:
        name = f"nsqd-{i + 1}"
        workdir = self._dir(name)
        ports = {"http": _free_port(), "https": _free_port()}
        unix_path = str(workdir / "nsqd.sock") if self.unix_sockets else None
        if unix_path is None:
            ports["tcp"] = _free_port()
        tcp = unix_path or f"{HOST}:{ports['tcp']}"
        argv = [str(self.bin / "nsqd"), f"--tcp-address={tcp}",
                f"--http-address={HOST}:{ports['http']}",
                f"--https-address={HOST}:{ports['https']}", f"--broadcast-address={HOST}",
                f"--data-path={workdir / 'data'}"]
        env: dict[str, str] = {}
        if self.mode == "youzan":
            ports.update(rpc=_free_port(), metric=_free_port())
            argv += [f"--cluster-id={self.cluster_id}",
                     f"--cluster-leadership-addresses={self._etcd_url}",
                     "--broadcast-interface=lo", f"--rpc-port={ports['rpc']}",
                     f"--metric-address={HOST}:{ports['metric']}", f"--worker-id={i + 1}",
                     f"--log-dir={workdir}"]
            env["NSQD_RESERVED_FD"] = "5000"
        else:
            if unix_path is None:  # on a socket, its IDENTIFY to lookupd would be refused
                argv += [f"--lookupd-tcp-address={lk.tcp_address}" for lk in self.lookupds]
            argv.append(f"--node-id={i + 1}")
        if self.auth_server is not None:
            argv.append(f"--auth-http-address={self.auth_server.address}")
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        return RealMember(name, "nsqd", [*argv, *self.nsqd_args], workdir, env=env, ports=ports,
                          unix_path=unix_path)

    # -- addresses ------------------------------------------------------------------------------

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [lookupd.http_address for lookupd in self.lookupds]

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [node.tcp_address for node in self.nodes]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return [node.http_address for node in self.nodes]

    @property
    def nsqd_unix_addresses(self) -> list[str]:
        """``unix:PATH`` of every nsqd's socket (``unix_sockets=True``), in node order."""
        return [node.tcp_address for node in self.nodes if node.unix_path]

    def node(self, ref: int | str | RealMember) -> RealMember:
        """The nsqd given as index, TCP address (``host:port``) or member."""
        if isinstance(ref, RealMember):
            return ref
        if isinstance(ref, int):
            return self.nodes[ref]
        for node in self.nodes:
            if ref in (node.tcp_address, node.http_address, node.name):
                return node
        raise LookupError(f"not an nsqd of this cluster: {ref!r}")

    # -- topics ---------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int = 1, replicas: int = 1, *,
                           ordered: bool = False, ext: bool = False,
                           multipart: bool | None = None,
                           disable_channel_auto_create: bool = False,
                           channels: Sequence[str] | None = ("default",),
                           timeout: float | None = None) -> Any:
        """Create a topic as an operator does and return once it is writable (as
        :meth:`DevCluster.create_topic`, through :meth:`AsyncAdmin.create_topic`)."""
        if timeout is None:
            timeout = 60.0
        alive = sum(1 for node in self.nodes if node.running)
        if multipart is None:
            multipart = not ordered and partitions * replicas > alive
        deadline = time.monotonic() + timeout
        async with AsyncAdmin(self.lookupd_http_addresses, timeout=min(5.0, timeout)) as admin:
            while True:
                try:
                    return await admin.create_topic(
                        name, partitions, replicas, ordered=ordered, ext=ext,
                        multipart=multipart,
                        disable_channel_auto_create=disable_channel_auto_create,
                        channels=list(channels or ()),
                        timeout=max(deadline - time.monotonic(), 1.0), resend_interval=2.0,
                        poll_interval=0.1)
                except AdminError as exc:
                    # the leader lookupd places replicas on the nodes it counts as healthy; a
                    # fresh cluster's node can be missing from that count for a moment
                    # although every lookupd lists it (seen once in CI's real tier): with
                    # enough nodes running, that refusal is asked again, within the timeout
                    if "No node is available" not in str(exc) or replicas > alive \
                            or time.monotonic() + 0.5 >= deadline:
                        raise RuntimeError(str(exc)) from exc
                    log.info("creating %s: %s; asking again", name, exc)
                    await asyncio.sleep(0.5)

    # -- faults ---------------------------------------------------------------------------------

    async def kill_node(self, ref: int | str | RealMember) -> None:
        """SIGKILL an nsqd: a leader loss (the cluster reacts when etcd's session expires)."""
        node = self.node(ref)
        node.signal(signal.SIGKILL)
        await node.wait_exit(10.0)

    async def stop_node(self, ref: int | str | RealMember) -> None:
        """Stop an nsqd as a crash does (SIGKILL), the same as :meth:`kill_node`."""
        await self.kill_node(ref)

    async def leave_node(self, ref: int | str | RealMember) -> None:
        """SIGTERM an nsqd: a graceful leave (it hands its partitions over, then exits).

        Returns at once, as ``DevCluster.leave_node`` does; ``await cluster.settled(node)``
        waits for the process to be gone.
        """
        self.node(ref).signal(signal.SIGTERM)

    async def settled(self, ref: int | str | RealMember | None = None,
                      timeout: float = 30.0) -> None:
        """Until a leaving nsqd (every leaving one if None) has exited."""
        nodes = self.nodes if ref is None else [self.node(ref)]
        for node in nodes:
            if node.process is not None and not await node.wait_exit(timeout):
                raise Timeout(f"{node.name} still running {timeout}s after SIGTERM")

    async def start_node(self, ref: int | str | RealMember, timeout: float = 30.0) -> None:
        """Restart a stopped nsqd on the same ports with the same data."""
        node = self.node(ref)
        if node.running:
            raise RuntimeError(f"{node.name} is still running")
        if node.unix_path:  # a killed nsqd leaves its socket file: nsqd's bind then fails
            with contextlib.suppress(FileNotFoundError):
                os.unlink(node.unix_path)
        node.spawn()
        await self._until_ready(node, time.monotonic() + timeout)

    async def stop_lookupd(self, ref: int) -> None:
        """SIGKILL a lookupd (if it led, another one takes over through etcd)."""
        lookupd = self.lookupds[ref]
        lookupd.signal(signal.SIGKILL)
        await lookupd.wait_exit(10.0)

    async def start_lookupd(self, ref: int, timeout: float = 30.0) -> None:
        lookupd = self.lookupds[ref]
        if lookupd.running:
            raise RuntimeError(f"{lookupd.name} is still running")
        lookupd.spawn()
        await self._until_ready(lookupd, time.monotonic() + timeout)

    # -- presentation ---------------------------------------------------------------------------

    def describe(self) -> str:
        lines = [f"real NSQ cluster ({self.mode}, {self.bin})"]
        for i, lookupd in enumerate(self.lookupds):
            lines.append(f"  [{i}] nsqlookupd http://{lookupd.http_address}")
        for i, node in enumerate(self.nodes):
            lines.append(f"  [{i}] nsqd tcp {node.tcp_address} http http://{node.http_address}")
        return "\n".join(lines)


async def _http_ok(host: str, port: int, path: str, timeout: float = 1.0) -> bool:
    """True when ``GET path`` answers 200 (a readiness probe; any failure is "not yet")."""
    async with HttpClient() as client:
        try:
            answer = await client.request("GET", f"http://{host}:{port}{path}",
                                          timeout=timeout, max_body=65536)
        except NSQError:
            return False
    return answer.status == 200
