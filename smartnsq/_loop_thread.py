"""Deprecated name of :mod:`smartnsq.loop_thread` (kept for code written before it was public).

The module object is the same one, so ``_loop_thread.shared()`` and ``loop_thread.shared()``
hand out the same process-wide thread.
"""

import sys

from . import loop_thread

sys.modules[__name__] = loop_thread
