"""smartnsq: a partition-aware smart client for youzan's redesigned NSQ (and classic NSQ).

The client's public names live here, and here only (``docs/api.md`` lists every public name
and its one import path; the exceptions are in :mod:`smartnsq.errors`). They load on first
use, so ``import smartnsq`` stays cheap for code that needs one submodule (the dev cluster,
the codec).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from . import extensions as _extensions

_extensions.install()  # before anything imports a module that may run compiled

from .observability import logs as _logs  # noqa: E402 - after the extensions' decision

_logs.install()

_EXPORTS = {
    "Producer": "smartnsq.producer.producer",
    "ProducerConfig": "smartnsq.producer.config",
    "BodyCompression": "smartnsq.producer.config",
    "PublishResult": "smartnsq.producer.results",
    "BatchResult": "smartnsq.producer.results",
    "Consumer": "smartnsq.consumer.core",
    "ConsumerConfig": "smartnsq.consumer.config",
    "Message": "smartnsq.message",
    "StartPosition": "smartnsq.protocol.commands",
    "ConnectionConfig": "smartnsq.config",
    "BackoffPolicy": "smartnsq.model.backoff",
    "RequeuePolicy": "smartnsq.model.backoff",
    "LookupManager": "smartnsq.discovery.lookup",
    "LookupConfig": "smartnsq.discovery.lookup",
    "TopicView": "smartnsq.protocol.lookup",
    "Admin": "smartnsq.admin",
    "AsyncAdmin": "smartnsq.admin",
    "LoopThread": "smartnsq.transport.loop_thread",
}

__all__ = [
    "Admin",
    "AsyncAdmin",
    "BackoffPolicy",
    "BatchResult",
    "BodyCompression",
    "ConnectionConfig",
    "Consumer",
    "ConsumerConfig",
    "LookupConfig",
    "LookupManager",
    "LoopThread",
    "Message",
    "Producer",
    "ProducerConfig",
    "PublishResult",
    "RequeuePolicy",
    "StartPosition",
    "TopicView",
    "__version__",
]

if TYPE_CHECKING:
    from .admin import Admin, AsyncAdmin
    from .config import ConnectionConfig
    from .consumer.config import ConsumerConfig
    from .consumer.core import Consumer
    from .discovery.lookup import LookupConfig, LookupManager
    from .message import Message
    from .model.backoff import BackoffPolicy, RequeuePolicy
    from .producer.config import BodyCompression, ProducerConfig
    from .producer.producer import Producer
    from .producer.results import BatchResult, PublishResult
    from .protocol.commands import StartPosition
    from .protocol.lookup import TopicView
    from .transport.loop_thread import LoopThread


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'smartnsq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
