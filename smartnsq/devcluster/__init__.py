"""An embedded NSQ cluster (youzan or classic) for tests, demos and local development.

``async with DevCluster(nodes=3, lookupds=2) as cluster:`` starts nsqlookupds and nsqd nodes
on loopback that speak the real wire protocols; ``python -m smartnsq.devcluster`` runs one in
the foreground; the ``nsq_cluster`` pytest fixture comes with smartnsq. See docs/devcluster.md.
"""

from __future__ import annotations

from typing import Any

from .cluster import DevCluster, NodeProxies
from .lookupd import Lookupd
from .proxy import TCPProxy
from .state import ClusterState, NodeInfo, TopicInfo

__all__ = [
    "ClusterState",
    "DevCluster",
    "Lookupd",
    "NodeInfo",
    "NodeProxies",
    "TCPProxy",
    "TopicInfo",
    "main",
]


def __getattr__(name: str) -> Any:
    # imported on demand: ``python -m smartnsq.devcluster`` must find __main__ not yet loaded
    if name == "main":
        from .__main__ import main

        return main
    raise AttributeError(name)
