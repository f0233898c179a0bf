"""``python -m smartnsq ...``: the same command line as the ``smartnsq`` script.

Run from the directory that *holds* a clone named ``smartnsq``, Python finds that folder first
(the current directory leads ``sys.path`` under ``-m``) and imports it as an empty namespace
package instead of the installed one. That is said in one line here, with what to do, instead
of an ImportError from deep inside.
"""

from __future__ import annotations

import os
import sys


def _shadowed() -> str | None:
    """The folder shadowing the package, when ``smartnsq`` was imported as a namespace."""
    package = sys.modules.get(__package__ or "smartnsq")
    if package is None or getattr(package, "__file__", None) is not None:
        return None
    paths = [p for p in getattr(package, "__path__", []) if os.path.isdir(p)]
    return paths[0] if paths else "smartnsq"


if __name__ == "__main__":
    folder = _shadowed()
    if folder is not None:
        sys.stderr.write(
            f"smartnsq: error: python -m smartnsq imported the folder {folder} (a clone?) "
            f"instead of the smartnsq package: run it from another directory (cd into the "
            f"clone, or anywhere else), or use the smartnsq command\n")
        sys.exit(1)
    from .cli import main

    sys.exit(main())
