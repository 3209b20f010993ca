"""The security page's threat tables name, for every "cannot", a test that shows it: each
named test must exist, so the page cannot promise what no test drives."""

from __future__ import annotations

import ast
import re

from tests._support import REPO_ROOT

PARTIES = ("A submitter", "A node", "Job code", "The operator of a worker", "The coordinator, seen from a worker",
           "The network")
_NAMED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _section() -> str:
    text = (REPO_ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    return text.split("## Threats by party", 1)[1].split("\n## ", 1)[0]


def _rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] not in ("can", "---"):
            rows.append(cells)
    return rows


def _test_functions(path: str) -> set[str]:
    tree = ast.parse((REPO_ROOT / path).read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_party_has_its_table() -> None:
    headings = re.findall(r"^### (.+)$", _section(), flags=re.MULTILINE)
    assert [heading.split(" (")[0] for heading in headings] == list(PARTIES)


def test_every_cannot_names_a_test_that_exists() -> None:
    rows = _rows(_section())
    assert len(rows) >= 25
    missing = []
    for can, cannot, shown_by in rows:
        named = _NAMED_TEST.findall(shown_by)
        assert named, f"the row {can!r} / {cannot!r} names no test"
        for path, name in named:
            if not (REPO_ROOT / path).is_file() or name not in _test_functions(path):
                missing.append(f"{path}::{name}")
    assert not missing, f"the security page names tests that do not exist: {missing}"
