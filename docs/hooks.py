"""mkdocs hook: render the configuration and error references from the code at build time."""

from __future__ import annotations

from typing import Any

from smartnsq.reference import expand_markers


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand_markers(markdown)
