"""pytest plugin shipped with smartnsq: ``nsq_cluster`` fixtures backed by the embedded dev cluster.

Opt-in, not registered through a ``pytest11`` entry point: installed, smartnsq would otherwise
load it into every pytest run of every project in that environment, fixtures, markers and hooks
included. A project that wants the fixtures says so in its top-level ``conftest.py``::

    pytest_plugins = ["smartnsq.testing.pytest_plugin"]

(or ``pytest -p smartnsq.testing.pytest_plugin``). Loaded, it imports the dev cluster only when
a fixture is used.

Fixtures (function-scoped, need an asyncio test runner such as pytest-asyncio):

``nsq_cluster``
    a started :class:`~smartnsq.devcluster.DevCluster` with 3 youzan nsqd and 2 lookupds,
    stopped after the test. Mark the test to change its shape::

        @pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
        async def test_classic(nsq_cluster): ...

``nsq_cluster_factory``
    an async callable taking the ``DevCluster`` arguments and returning a started cluster;
    every cluster it made is stopped after the test::

        async def test_two_clusters(nsq_cluster_factory):
            a = await nsq_cluster_factory(nodes=1, lookupds=1)
            b = await nsq_cluster_factory(mode="classic", nodes=2)

``nsq_any_cluster``
    the same test body twice: once on a fresh ``DevCluster`` (id ``dev``) and once on the
    real servers (id ``real``, marked ``real``) as a
    :class:`~smartnsq.testing.realcluster.RealCluster` from the binaries in ``$SMARTNSQ_REAL_NSQ``.
    Without that variable the ``real`` case is skipped with one line naming it. The
    ``nsq_cluster`` marker gives the shape (``mode`` youzan or classic, ``nodes``,
    ``lookupds``); the real servers start in seconds and create topics in seconds too, so one
    real cluster of each shape serves every test of the session, and tests give their topics
    names of their own. A test that damages its cluster (kills, leaves) says ``fresh=True``
    in the marker and gets a real cluster of its own::

        @pytest.mark.nsq_cluster(nodes=3, fresh=True)
        async def test_leader_loss(nsq_any_cluster): ...

    ``nsqd_options`` (dev only) gives the dev nodes what the real servers do anyway, e.g.
    ``{"ordered_first_delivery_twice": True}``; ``nsqd_args`` (real only) are command-line
    flags of the real nsqd.

    ``-m real`` selects the real cases, ``-m 'not real'`` leaves them out.

    Shape keys both clusters take:

    * ``tls=True``: every nsqd serves TLS with a certificate for ``127.0.0.1`` from a
      throwaway CA (``trustme``), ``tls="require-verify"`` also demands a client certificate
      from that CA (the real nsqd's ``--tls-client-auth-policy``) and refuses clients
      without TLS on TCP (``--tls-required=tcp-https``: HTTP stays plain). The
      ``nsq_test_tls`` fixture (:class:`TestTLS`) gives the client side: its contexts and
      files.
    * ``tls_min_version="tls1.3"`` (with ``tls``): the oldest TLS version the nsqd accept
      (the real nsqd's ``--tls-min-version``, the dev nsqd's ``minimum_version``).
    * ``unix_socket=True`` (classic): every nsqd serves its TCP protocol on a unix socket too,
      named by ``cluster.nsqd_unix_addresses`` (``unix:PATH``). The real nsqd listens on the
      socket instead of a TCP port (``--tcp-address=PATH``) and so cannot register with
      nsqlookupd: clients reach it through ``nsqd=``.
    * ``auth={secret: answer, ...}``: the dev cluster's secrets table; the real nsqd ask an
      :class:`~smartnsq.testing.realcluster.AuthHttpServer` answering from the same table
      (``--auth-http-address``).

    ``profile=`` (a fault timing) goes to the dev cluster only: the real servers have their
    own timing, which the profile models.

``nsq_any_mixed``
    a youzan cluster and a classic cluster side by side (:class:`ClusterPair`), on the dev
    clusters (``dev``) and on the real servers (``real``: the session's shared youzan and
    classic real clusters), for tests of one client given both kinds of lookupd.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from ..devcluster.cluster import DevCluster

try:
    import pytest_asyncio

    _async_fixture: Callable[..., Any] = pytest_asyncio.fixture
except ImportError:  # pragma: no cover - another async runner (anyio, trio) may drive them
    _async_fixture = pytest.fixture

DEFAULT_SHAPE: dict[str, Any] = {"nodes": 3, "lookupds": 2}

REAL_ONLY = ("fresh", "nsqd_args", "lookupd_args")
"""Marker arguments that only the real cluster takes (the dev cluster ignores them)."""

DEV_ONLY = ("profile", "nsqd_options")
"""Marker arguments that only the dev cluster takes (the real cluster ignores them): the fault
profile models the real servers' timing, which they have anyway; ``nsqd_options`` gives the
dev nodes what the real servers do by default, e.g.
``nsqd_options={"ordered_first_delivery_twice": True}``."""

TLS_POLICIES = (True, "require-verify")
TLS_MIN_VERSIONS = {"tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}


class TestTLS:
    """A throwaway CA (``trustme``) with a server certificate for 127.0.0.1 and a client
    certificate, as PEM files in ``folder`` and as ``ssl`` contexts."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, folder: Path) -> None:
        import trustme

        folder.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.client = self.ca.issue_cert("smartnsq-test-client")
        self.ca_file = str(folder / "ca.pem")
        self.cert_file = str(folder / "server.pem")
        self.key_file = str(folder / "server.key")
        self.client_cert_file = str(folder / "client.pem")
        self.client_key_file = str(folder / "client.key")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.server.cert_chain_pems[0].write_to_path(self.cert_file)
        for pem in self.server.cert_chain_pems[1:]:
            pem.write_to_path(self.cert_file, append=True)
        self.server.private_key_pem.write_to_path(self.key_file)
        self.client.cert_chain_pems[0].write_to_path(self.client_cert_file)
        self.client.private_key_pem.write_to_path(self.client_key_file)

    def server_context(self, verify_clients: bool = False,
                       min_version: str | None = None) -> ssl.SSLContext:
        """The nsqd side (for ``DevCluster(tls=...)``); ``min_version`` as nsqd's
        ``--tls-min-version`` names it."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        if min_version is not None:
            context.minimum_version = TLS_MIN_VERSIONS[min_version]
        self.server.configure_cert(context)
        if verify_clients:
            self.ca.configure_trust(context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self, with_cert: bool = True) -> ssl.SSLContext:
        """A verifying client context trusting the CA (with the client certificate)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        self.ca.configure_trust(context)
        if with_cert:
            self.client.configure_cert(context)
        return context

    def nsqd_args(self, policy: bool | str) -> list[str]:
        """The real nsqd's flags for a ``tls=`` shape value."""
        args = [f"--tls-cert={self.cert_file}", f"--tls-key={self.key_file}"]
        if policy == "require-verify":
            # a client auth policy makes nsqd 1.3 require TLS on every port, its plain HTTP
            # too (403), unless told otherwise: TLS on TCP only keeps /ping and /stats plain
            args += ["--tls-client-auth-policy=require-verify",
                     f"--tls-root-ca-file={self.ca_file}", "--tls-required=tcp-https"]
        return args


@dataclass
class ClusterPair:
    """A youzan and a classic cluster side by side (dev or real)."""

    youzan: Any
    classic: Any

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """Both clusters' lookupds, youzan's first: what a client of both is given."""
        return [*self.youzan.lookupd_http_addresses, *self.classic.lookupd_http_addresses]

_shared_real: dict[tuple[Any, ...], Any] = {}

ClusterFactory = Callable[..., Awaitable["DevCluster"]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nsq_cluster(**kwargs): DevCluster arguments for the nsq_cluster fixture "
        "(nodes, lookupds, classic_nodes, mode, tls, auth, proxied; tls_min_version, "
        "unix_socket with nsq_any_cluster; fresh, nsqd_args for its real cluster)")
    config.addinivalue_line(
        "markers",
        "real: runs against the real NSQ servers (binaries in $SMARTNSQ_REAL_NSQ); "
        "skipped without them")


def pytest_unconfigure(config: pytest.Config) -> None:
    while _shared_real:
        _, cluster = _shared_real.popitem()
        cluster.stop_now()


@_async_fixture
async def nsq_cluster_factory() -> AsyncIterator[ClusterFactory]:
    from ..devcluster.cluster import DevCluster

    made: list[DevCluster] = []

    async def make(**kwargs: Any) -> DevCluster:
        cluster = DevCluster(**{**DEFAULT_SHAPE, **kwargs})
        await cluster.start()
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in reversed(made):
            await cluster.stop()


@_async_fixture
async def nsq_cluster(request: pytest.FixtureRequest,
                      nsq_cluster_factory: ClusterFactory) -> DevCluster:
    marker = request.node.get_closest_marker("nsq_cluster")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    return await nsq_cluster_factory(**kwargs)


F = TypeVar("F", bound=Callable[..., Any])


def _on_dev_and_real(function: F) -> F:
    """An async fixture run twice: ``dev`` and ``real`` (marked ``real``)."""
    fixture: F = _async_fixture(params=[
        pytest.param("dev", id="dev"),
        pytest.param("real", id="real", marks=pytest.mark.real),
    ])(function)
    return fixture


def _shape(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("nsq_cluster")
    shape = dict(marker.kwargs) if marker is not None else {}
    tls = shape.get("tls")
    if tls is not None and tls is not False and tls not in TLS_POLICIES:
        raise pytest.UsageError(f"nsq_cluster tls= takes True or 'require-verify', not {tls!r}"
                                " (with nsq_any_cluster; nsq_cluster takes an SSLContext)")
    floor = shape.get("tls_min_version")
    if floor is not None and (not tls or floor not in TLS_MIN_VERSIONS):
        raise pytest.UsageError(f"nsq_cluster tls_min_version= takes {sorted(TLS_MIN_VERSIONS)}"
                                f" with tls=, not {floor!r}")
    return shape


@pytest.fixture(scope="session")
def nsq_test_tls(tmp_path_factory: pytest.TempPathFactory) -> TestTLS:
    """The session's throwaway CA and certificates (see :class:`TestTLS`)."""
    return TestTLS(tmp_path_factory.mktemp("nsq-tls"))


def _skip_without_real(mode: str) -> None:
    import os

    from ..errors import RealNsqdError
    from .realcluster import ENV, find_binaries

    if not os.environ.get(ENV):
        pytest.skip(f"real NSQ servers: set {ENV} to the folder of their binaries")
    try:
        find_binaries(None, mode)
    except RealNsqdError as exc:
        pytest.skip(str(exc))


async def _shared_real_cluster(kwargs: dict[str, Any], key_extra: tuple[Any, ...] = ()) -> Any:
    """The session's real cluster of this shape (started anew if a test damaged it).

    Its addresses are the ones earlier tests used, so the library's repeat filter (an
    identical warning held back for 10 s) is emptied first: a test waiting for a warning
    about one of them must not miss it because an earlier test logged the same line.
    """
    from ..observability import logs
    from .realcluster import RealCluster

    logs.reset()

    key = (*sorted((k, v) for k, v in kwargs.items() if k != "auth"), *key_extra)
    cluster = _shared_real.get(key)
    if cluster is not None and not cluster.healthy:
        await cluster.stop()
        cluster = None
    if cluster is None:
        cluster = RealCluster(**kwargs)
        await cluster.start()
        _shared_real[key] = cluster
    return cluster


@_on_dev_and_real
async def nsq_any_cluster(request: pytest.FixtureRequest,
                          nsq_cluster_factory: ClusterFactory) -> AsyncIterator[Any]:
    shape = _shape(request)
    tls = shape.pop("tls", None)
    tls_min_version = shape.pop("tls_min_version", None)
    unix_socket = bool(shape.pop("unix_socket", False))
    tls_files = request.getfixturevalue("nsq_test_tls") if tls else None
    if request.param == "dev":
        dev = {k: v for k, v in shape.items() if k not in REAL_ONLY}
        if unix_socket:
            dev["unix_sockets"] = True
        if tls_files is not None:
            dev["tls"] = tls_files.server_context(verify_clients=tls == "require-verify",
                                                  min_version=tls_min_version)
            if tls == "require-verify":  # as the real nsqd: TLS required on TCP
                dev["nsqd_options"] = {**dev.get("nsqd_options", {}), "tls_required": True}
        yield await nsq_cluster_factory(**dev)
        return
    from .realcluster import RealCluster

    mode = shape.get("mode", "youzan")
    _skip_without_real(mode)
    unknown = set(shape) - {"mode", "nodes", "lookupds", "auth", *REAL_ONLY, *DEV_ONLY}
    if unknown:
        raise pytest.UsageError(f"the real cluster has no {sorted(unknown)}: use nsq_cluster")
    nsqd_args = list(shape.get("nsqd_args", ()))
    if tls_files is not None:
        nsqd_args += tls_files.nsqd_args(tls)
    if tls_min_version is not None:
        nsqd_args.append(f"--tls-min-version={tls_min_version}")
    kwargs: dict[str, Any] = {
        "mode": mode, "nodes": shape.get("nodes", DEFAULT_SHAPE["nodes"]),
        "lookupds": shape.get("lookupds", DEFAULT_SHAPE["lookupds"]),
        "nsqd_args": tuple(nsqd_args), "lookupd_args": tuple(shape.get("lookupd_args", ())),
        "auth": shape.get("auth")}
    if unix_socket:
        kwargs["unix_sockets"] = True
    if mode == "classic":
        kwargs["lookupds"] = shape.get("lookupds", 1)
    if shape.get("fresh"):
        cluster = RealCluster(**kwargs)
        await cluster.start()
        try:
            yield cluster
        finally:
            cluster.kill_all()  # its data goes with it: no graceful exit to wait for
            await cluster.stop()
        return
    yield await _shared_real_cluster(
        kwargs, (("auth", json.dumps(kwargs["auth"], sort_keys=True)),))


@_on_dev_and_real
async def nsq_any_mixed(request: pytest.FixtureRequest,
                        nsq_cluster_factory: ClusterFactory) -> ClusterPair:
    if request.param == "dev":
        return ClusterPair(youzan=await nsq_cluster_factory(nodes=3, lookupds=2),
                           classic=await nsq_cluster_factory(mode="classic", nodes=1,
                                                             lookupds=1))
    _skip_without_real("youzan")
    _skip_without_real("classic")
    common: dict[str, Any] = {"nsqd_args": (), "lookupd_args": (), "auth": None}
    youzan = await _shared_real_cluster(
        {"mode": "youzan", "nodes": 3, "lookupds": 2, **common}, (("auth", "null"),))
    classic = await _shared_real_cluster(
        {"mode": "classic", "nodes": 1, "lookupds": 1, **common}, (("auth", "null"),))
    return ClusterPair(youzan=youzan, classic=classic)
