"""Routes: who leads partition p of topic t, how sure we are, and when we ask again.

The one owner of failover knowledge, used by the pool and the producer's retries (the
:class:`RouteBook`), the consumer's discovery (the :class:`ViewChase`), the lookup manager
(lookupd health and racing) and the Spark driver (:func:`~smartnsq.routes.policy.leader_wait`):

* :mod:`~smartnsq.routes.table`: the values (:class:`TopicRoutes`, :class:`RouteSource`,
  :class:`StaticRouteSource`, addresses);
* :mod:`~smartnsq.routes.policy`: the pure decisions with time passed in (the chase and its
  fast poll, probe turns, holds, the wait for a leader);
* :mod:`~smartnsq.routes.health`: lookupd health and which lookupd to ask, pure;
* :mod:`~smartnsq.routes.race`: racing one request to several lookupds;
* :mod:`~smartnsq.routes.book`: :class:`RouteBook`, the publishers' asyncio shell;
* :mod:`~smartnsq.routes.chase`: :class:`ViewChase`, the consumers' asyncio shell.

No module here imports :mod:`smartnsq.lookup` or :mod:`smartnsq.pool`, even in a function:
the lookup manager imports the health rules from here and the pool the book, so the adapter
from a lookup manager to routes, :class:`~smartnsq.lookup_source.LookupRouteSource`, lives
beside them, not here; ``tests/test_architecture.py`` keeps it so. The names below load on
first use, so importing one module of the package loads only what that module needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "RouteBook": "book",
    "ViewChase": "chase",
    "LookupdHealth": "health",
    "LookupdStatus": "health",
    "targets": "health",
    "Chase": "policy",
    "Step": "policy",
    "holds": "policy",
    "leader_wait": "policy",
    "probe_turn": "policy",
    "wait_delay": "policy",
    "Address": "table",
    "RouteSource": "table",
    "RoutesCallback": "table",
    "StaticRouteSource": "table",
    "TopicRoutes": "table",
    "address_list": "table",
    "parse_address": "table",
}

if TYPE_CHECKING:
    from .book import RouteBook
    from .chase import ViewChase
    from .health import LookupdHealth, LookupdStatus, targets
    from .policy import Chase, Step, holds, leader_wait, probe_turn, wait_delay
    from .table import (
        Address,
        RoutesCallback,
        RouteSource,
        StaticRouteSource,
        TopicRoutes,
        address_list,
        parse_address,
    )

__all__ = [
    "Address",
    "Chase",
    "LookupdHealth",
    "LookupdStatus",
    "RouteBook",
    "RouteSource",
    "RoutesCallback",
    "StaticRouteSource",
    "Step",
    "TopicRoutes",
    "ViewChase",
    "address_list",
    "holds",
    "leader_wait",
    "parse_address",
    "probe_turn",
    "targets",
    "wait_delay",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'smartnsq.routes' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
