"""The pages say what is true now, to anyone who cloned the repository: no issue numbers (the
tracker is not theirs to read; history lives in git and the CHANGELOG) and no paths outside
the repository (a clone has nothing beside it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("examples/*.py")])
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)")
OUTSIDE = re.compile(r"\.\./shared\b|/work/|\]\(\.\./\.\./")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_no_issue_and_no_file_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = [f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for pattern in (ISSUE, OUTSIDE) for m in pattern.finditer(text)]
    assert not found, found
