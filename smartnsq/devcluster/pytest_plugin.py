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

ClusterFactory = Callable[..., Awaitable["DevCluster"]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nsq_cluster(**kwargs): DevCluster arguments for the nsq_cluster fixture "
        "(nodes, lookupds, classic_nodes, mode, tls, auth, proxied)")


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
