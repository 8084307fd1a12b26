"""docs/sglang-vpp.md lists every flag refusal of ``validate.VPP_REFUSALS`` with its reason, and
nothing the list does not refuse (the table is read, not copied: a new refusal fails this test
until the docs name it)."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS

DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang-vpp.md"


def _refusal_table() -> dict[str, str]:
    """flag -> the "why" cell of its row in the "Refused at start-up" table."""
    section = DOC.read_text().split("## Refused at start-up", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("refused", "---"):
            continue
        for flag in re.findall(r"`(--[a-z-]+)`", cells[0]):
            rows[flag] = cells[1]
    return rows


def test_every_refusal_documented_with_its_reason():
    table = _refusal_table()
    for refusal in VPP_REFUSALS:
        assert refusal.flag in table, f"{refusal.flag} is refused but not listed in {DOC.name}"
        assert table[refusal.flag].startswith(refusal.reason), (refusal.flag, table[refusal.flag], refusal.reason)
    assert set(table) == {refusal.flag for refusal in VPP_REFUSALS}, "the docs list a flag the code does not refuse"
