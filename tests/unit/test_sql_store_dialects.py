"""The SQLite and PostgreSQL lease stores keep only their dialect: what they would share
(encoding, change detection, transactions, schema) lives once in their common base."""

from __future__ import annotations

import difflib

from tests._support import REPO_ROOT

LEASES = REPO_ROOT / "flashruntime" / "leases"
SHARED_RUN = 3  # consecutive identical lines that count as a copy
MOST_SHARED_LINES = 40


def _code_lines(name: str) -> list[str]:
    return [line.strip() for line in (LEASES / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_sqlite_and_postgresql_lease_stores_share_fewer_than_forty_lines() -> None:
    sqlite, postgres = _code_lines("sqlite_store.py"), _code_lines("postgres_store.py")
    matcher = difflib.SequenceMatcher(None, sqlite, postgres, autojunk=False)
    runs = [block for block in matcher.get_matching_blocks() if block.size >= SHARED_RUN]
    shared = sum(block.size for block in runs)
    assert shared < MOST_SHARED_LINES, "\n".join(
        f"sqlite_store.py line {block.a} ~ postgres_store.py line {block.b}: {block.size} lines, from "
        f"{sqlite[block.a]!r}" for block in runs)
