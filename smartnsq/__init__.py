"""smartnsq: a partition-aware smart client for youzan's redesigned NSQ (and classic NSQ).

The names below load on first use, so ``import smartnsq`` stays cheap for code that only needs
a submodule (the dev cluster, the codec).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from . import logs as _logs

_logs.install()

_EXPORTS = {
    "Admin": "smartnsq.admin",
    "AsyncAdmin": "smartnsq.admin",
    "AdminError": "smartnsq.admin",
    "LoopThread": "smartnsq.loop_thread",
    "Producer": "smartnsq.producer",
    "ProducerConfig": "smartnsq.producer",
    "PublishResult": "smartnsq.producer",
    "BatchResult": "smartnsq.producer",
    "Consumer": "smartnsq.consumer",
    "Message": "smartnsq.message",
    "AlreadyResponded": "smartnsq.message",
    "StartPosition": "smartnsq.protocol.commands",
    "LookupManager": "smartnsq.lookup",
    "LookupConfig": "smartnsq.lookup",
    "TopicView": "smartnsq.lookup",
    "ConnectionConfig": "smartnsq.config",
    "BackoffPolicy": "smartnsq.backoff",
    "RequeuePolicy": "smartnsq.backoff",
    "NSQError": "smartnsq.errors",
    "InvalidArgument": "smartnsq.errors",
    "ServerError": "smartnsq.errors",
    "Timeout": "smartnsq.errors",
    "TopicNotFound": "smartnsq.errors",
}

__all__ = [
    "Admin",
    "AdminError",
    "AlreadyResponded",
    "AsyncAdmin",
    "BackoffPolicy",
    "BatchResult",
    "ConnectionConfig",
    "Consumer",
    "InvalidArgument",
    "LookupConfig",
    "LookupManager",
    "LoopThread",
    "Message",
    "NSQError",
    "Producer",
    "ProducerConfig",
    "PublishResult",
    "RequeuePolicy",
    "ServerError",
    "StartPosition",
    "Timeout",
    "TopicNotFound",
    "TopicView",
    "__version__",
]

if TYPE_CHECKING:
    from .admin import Admin, AdminError, AsyncAdmin
    from .backoff import BackoffPolicy, RequeuePolicy
    from .config import ConnectionConfig
    from .consumer import Consumer
    from .errors import InvalidArgument, NSQError, ServerError, Timeout, TopicNotFound
    from .lookup import LookupConfig, LookupManager, TopicView
    from .loop_thread import LoopThread
    from .message import AlreadyResponded, Message
    from .producer import BatchResult, Producer, ProducerConfig, PublishResult
    from .protocol.commands import StartPosition


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'smartnsq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
