"""pytest plugin shipped with smartnsq: ``nsq_cluster`` fixtures backed by the embedded dev cluster.

Registered through the ``pytest11`` entry point, so it loads in every pytest run where smartnsq
is installed; it must therefore import nothing heavy at module level.
"""

from __future__ import annotations
