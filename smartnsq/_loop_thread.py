"""Deprecated name of :mod:`smartnsq.loop_thread` (kept for code written before it was public).

At run time this name is the same module object, so ``_loop_thread.shared()`` and
``loop_thread.shared()`` hand out the same process-wide thread; the imports below are what
type checkers see.
"""

import sys

from . import loop_thread as _impl
from .loop_thread import LoopThread, LoopTimeout, release_shared, shared, shared_users

__all__ = ["LoopThread", "LoopTimeout", "release_shared", "shared", "shared_users"]

sys.modules[__name__] = _impl
