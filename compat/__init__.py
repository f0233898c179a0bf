"""Classic NSQ fallback, mixed clusters and a pynsq-style API (shipped as ``smartnsq.compat``).

* :mod:`~smartnsq.compat.detect` (and :mod:`~smartnsq.compat.probe`): which kind of server
  answered, from what it said;
* :class:`ClassicPolicy`: what youzan-only features become on classic nodes (the Producer's
  ``classic=`` option; the Consumer's hook);
* :class:`MigrationPolicy`: which cluster a topic found on both kinds is written to (the
  Producer's ``migration=`` option);
* :mod:`~smartnsq.compat.pynsq`: pynsq's ``nsq`` package (``Reader`` / ``Writer`` / ``run``
  with pynsq's arguments, ``AsyncConn`` and its events, the protocol helpers, pynsq's
  modules); ``Reader``, ``Writer``, ``run``... are also importable from here
  (``from smartnsq.compat import Reader, Writer, run``).

See docs/compat.md and docs/migration-pynsq.md.
"""

from typing import Any

from smartnsq.model.dialect import ClassicPolicy, ClassicSubscription

from .detect import Kind
from .migration import MigrationChooser, MigrationPolicy

__all__ = [
    "ClassicPolicy",
    "ClassicSubscription",
    "Error",
    "Kind",
    "Message",
    "MigrationChooser",
    "MigrationPolicy",
    "Reader",
    "Writer",
    "run",
    "stop",
]

_PYNSQ = frozenset({"Reader", "Writer", "Message", "Error", "run", "stop"})


def __getattr__(name: str) -> Any:
    # the pynsq layer pulls in the consumer and the sync facades: load it on first use only,
    # so the core's lazy import of ClassicPolicy stays cheap
    if name in _PYNSQ:
        from . import pynsq

        return getattr(pynsq, name)
    raise AttributeError(f"module 'smartnsq.compat' has no attribute {name!r}")
