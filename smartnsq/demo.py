"""``python -m smartnsq.demo`` is ``smartnsq demo``.

The demo is a command of the command line and lives there (:mod:`smartnsq.cli.demo` for its
arguments, :mod:`smartnsq.cli.demo_scenario` for the run); this module keeps the old name
working, for ``python -m`` and for code that imported the demo from here. It imports the
command line and nothing there imports it back, so the two are no longer a circle.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .cli.demo_scenario import DemoOptions, DemoReport, render, report_json, run_demo

__all__ = ["DemoOptions", "DemoReport", "main", "render", "report_json", "run_demo"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m smartnsq.demo [ARGS]``: ``smartnsq demo [ARGS]``."""
    from .cli import main as cli_main

    return cli_main(["demo", *(argv or [])])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
