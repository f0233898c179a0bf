"""An embedded NSQ cluster (youzan or classic) for tests, demos and local development.

``async with DevCluster(nodes=3, lookupds=2) as cluster:`` starts nsqlookupds and nsqd nodes
on loopback that speak the real wire protocols; ``smartnsq dev-cluster`` runs one in the
foreground; the ``nsq_cluster`` pytest fixture is in :mod:`smartnsq.testing.pytest_plugin`.
See docs/devcluster.md. The names below are the dev cluster's public ones; they load on first
use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DevCluster": "smartnsq.devcluster.cluster",
    "NodeProxies": "smartnsq.devcluster.cluster",
    "Lookupd": "smartnsq.devcluster.lookupd",
    "TCPProxy": "smartnsq.devcluster.proxy",
    "ClusterState": "smartnsq.devcluster.state",
    "NodeInfo": "smartnsq.devcluster.state",
    "TopicInfo": "smartnsq.devcluster.state",
}

__all__ = ["ClusterState", "DevCluster", "Lookupd", "NodeInfo", "NodeProxies", "TCPProxy",
           "TopicInfo"]

if TYPE_CHECKING:
    from .cluster import DevCluster, NodeProxies
    from .lookupd import Lookupd
    from .proxy import TCPProxy
    from .state import ClusterState, NodeInfo, TopicInfo


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'smartnsq.devcluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
