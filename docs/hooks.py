"""mkdocs hook: render the configuration and error references from the code at build time."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # mkdocs loads hooks by path, not as a package

from reference import expand_markers  # docs/reference.py, beside this file


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand_markers(markdown)
