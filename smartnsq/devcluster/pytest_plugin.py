"""pytest plugin shipped with smartnsq: ``nsq_cluster`` fixtures backed by the embedded dev cluster.

Registered through the ``pytest11`` entry point, so it loads in every pytest run where smartnsq
is installed; it imports the dev cluster only when a fixture is used.

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
    :class:`~smartnsq.realcluster.RealCluster` from the binaries in ``$SMARTNSQ_REAL_NSQ``.
    Without that variable the ``real`` case is skipped with one line naming it. The
    ``nsq_cluster`` marker gives the shape (``mode`` youzan or classic, ``nodes``,
    ``lookupds``); the real servers start in seconds and create topics in seconds too, so one
    real cluster of each shape serves every test of the session, and tests give their topics
    names of their own. A test that damages its cluster (kills, leaves) says ``fresh=True``
    in the marker and gets a real cluster of its own::

        @pytest.mark.nsq_cluster(nodes=3, fresh=True)
        async def test_leader_loss(nsq_any_cluster): ...

    ``-m real`` selects the real cases, ``-m 'not real'`` leaves them out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .cluster import DevCluster

try:
    import pytest_asyncio

    _async_fixture: Callable[..., Any] = pytest_asyncio.fixture
except ImportError:  # pragma: no cover - another async runner (anyio, trio) may drive them
    _async_fixture = pytest.fixture

DEFAULT_SHAPE: dict[str, Any] = {"nodes": 3, "lookupds": 2}

REAL_ONLY = ("fresh", "nsqd_args", "lookupd_args")
"""Marker arguments that only the real cluster takes (the dev cluster ignores them)."""

_shared_real: dict[tuple[Any, ...], Any] = {}

ClusterFactory = Callable[..., Awaitable["DevCluster"]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nsq_cluster(**kwargs): DevCluster arguments for the nsq_cluster fixture "
        "(nodes, lookupds, classic_nodes, mode, tls, auth, proxied; fresh, nsqd_args for "
        "the real cluster of nsq_any_cluster)")
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
    from .cluster import DevCluster

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


def _shape(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("nsq_cluster")
    return dict(marker.kwargs) if marker is not None else {}


@_async_fixture(params=[  # type: ignore[untyped-decorator]
    pytest.param("dev", id="dev"),
    pytest.param("real", id="real", marks=pytest.mark.real),
])
async def nsq_any_cluster(request: pytest.FixtureRequest,
                          nsq_cluster_factory: ClusterFactory) -> AsyncIterator[Any]:
    shape = _shape(request)
    if request.param == "dev":
        yield await nsq_cluster_factory(
            **{k: v for k, v in shape.items() if k not in REAL_ONLY})
        return
    import os

    from ..realcluster import ENV, RealCluster, RealNsqdError, find_binaries

    mode = shape.get("mode", "youzan")
    if not os.environ.get(ENV):
        pytest.skip(f"real NSQ servers: set {ENV} to the folder of their binaries")
    try:
        find_binaries(None, mode)
    except RealNsqdError as exc:
        pytest.skip(str(exc))
    unknown = set(shape) - {"mode", "nodes", "lookupds", *REAL_ONLY}
    if unknown:
        raise pytest.UsageError(f"the real cluster has no {sorted(unknown)}: use nsq_cluster")
    kwargs = {"mode": mode, "nodes": shape.get("nodes", DEFAULT_SHAPE["nodes"]),
              "lookupds": shape.get("lookupds", DEFAULT_SHAPE["lookupds"]),
              "nsqd_args": tuple(shape.get("nsqd_args", ())),
              "lookupd_args": tuple(shape.get("lookupd_args", ()))}
    if mode == "classic":
        kwargs["lookupds"] = shape.get("lookupds", 1)
    if shape.get("fresh"):
        own = RealCluster(**kwargs)
        await own.start()
        try:
            yield own
        finally:
            await own.stop()
        return
    key = tuple(sorted(kwargs.items()))
    shared: RealCluster | None = _shared_real.get(key)
    if shared is not None and not shared.healthy:
        await shared.stop()
        shared = None
    if shared is None:
        shared = RealCluster(**kwargs)
        await shared.start()
        _shared_real[key] = shared
    yield shared
