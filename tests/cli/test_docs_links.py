"""The docs stand alone: every referenced repository file exists, and nothing points outside."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# `docs/x.md`, `benchmarks/y.py`, markdown link targets: whatever names a file of the repository.
_REFERENCE = re.compile(r"`((?:docs|benchmarks|scripts)/[\w./-]+\.(?:md|py|sh|json|png))`|\]\(([^)#\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_links_stay_inside_the_repository(page):
    text = page.read_text()
    for outside in ("../shared", "shared/docs", "../../"):
        assert outside not in text, f"{page.name} refers outside the repository ({outside})"
    for match in _REFERENCE.finditer(text):
        target = match.group(1) or match.group(2)
        if "://" in target:
            continue
        path = ((ROOT if match.group(1) else page.parent) / target).resolve()
        assert path.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert path.exists(), f"{page.name} refers to {target}, which does not exist"
