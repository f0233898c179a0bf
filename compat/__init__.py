"""Classic NSQ fallback, mixed clusters and a pynsq-style API (shipped as ``smartnsq.compat``).

* :mod:`~smartnsq.compat.detect` (and :mod:`~smartnsq.compat.probe`): which kind of server
  answered, from what it said;
* :class:`ClassicPolicy`: what youzan-only features become on classic nodes;
* :mod:`~smartnsq.compat.migration`: which cluster a topic on both kinds is written to;
* :mod:`~smartnsq.compat.pynsq`: ``Reader`` / ``Writer`` / ``run`` with pynsq's arguments.

See docs/compat.md.
"""

from .detect import Kind
from .migration import MigrationChooser, MigrationPolicy
from .policy import ClassicPolicy, ClassicSubscription

__all__ = ["ClassicPolicy", "ClassicSubscription", "Kind", "MigrationChooser", "MigrationPolicy"]
