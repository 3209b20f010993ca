"""The product speaks of itself only: no pointer to a design document outside it, no
development history (work items, sessions, reviews) in code, docs, examples, tests,
benchmarks or the CLI's help texts. Rules are stated where they are enforced."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

# A pointer to the design document the project was built from (its section sign, its file
# name, "as SPEC says"), and development history: work items, sessions, reviews, targets
# said to come from an issue.
POINTER = re.compile(r"SPEC\s?§|SPEC\.md|\bSPEC'?s\b|\b(as|by|in|of) SPEC\b")
HISTORY = re.compile(r"\bissues? \d+\b|\bsessions? \d+\b|\b(a|the) review(er)? (found|said)\b|\bwork[- ]items?\b"
                     r"|\bthe issues?(['’]s|s['’])|\bissues? that set\b|\b(no|an) issue sets?\b|\bfrom an issue\b",
                     re.IGNORECASE)
# A section sign before a number (raw, JSON-escaped or as an HTML entity) is a citation only
# when an external document is named right before it: an RFC, a year ("Kaplan et al. 2020
# §2.1", "IEEE 754-2008 §3.6"), "et al.", a quoted title and a comma with an optional venue
# ("...", VLDB, §3.2), or a paper known by its name (ZeRO §3.1). Any other is a bare pointer
# into a document the reader does not have: say what the rule is instead.
SECTION = re.compile(r"(?:§|\\u00a7|&sect;|&#167;)\s?\d")
CITED = re.compile(r"(?:\bRFC \d+|\b(?:19|20)\d\d,?|\bet al\.,?|(?:[\"”]|&quot;),(?: [A-Z][A-Za-z]*,)?"
                   r"|\b(?:ZeRO|ZeRO-Offload|QLoRA|LoRA))\s?$")
NO_HISTORY_CHECK = {"CHANGELOG.md"}  # history is what a changelog is for
ROOTS = ("flashruntime", "flashml_workloads", "docs", "examples", "benchmarks", "tests", "scripts")
SUFFIXES = {".py", ".md", ".html", ".json", ".yaml", ".yml", ".txt", ".toml"}
THIS_FILE = Path(__file__).resolve()


def _bare_section_pointer(line: str) -> bool:
    """Whether ``line`` has a section sign and number that no external citation precedes."""
    return any(not CITED.search(line[:found.start()]) for found in SECTION.finditer(line))


def _files() -> list[Path]:
    found = [REPO_ROOT / "README.md", REPO_ROOT / "CHANGELOG.md", REPO_ROOT / "pyproject.toml"]
    for root in ROOTS:
        for path in (REPO_ROOT / root).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts \
                    and path.resolve() != THIS_FILE and "results" not in path.parts:
                found.append(path)
    return found


def test_no_pointer_to_an_outside_document_and_no_development_history() -> None:
    hits = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if POINTER.search(line) or _bare_section_pointer(line) \
                    or (path.name not in NO_HISTORY_CHECK and HISTORY.search(line)):
                hits.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits[:40])


@pytest.mark.parametrize("command", ["", "submit", "chaos", "runs", "view", "demo", "plan", "submit-spec", "status", "events",
                                     "logs", "tasks", "goodput", "artifacts", "cancel", "serve", "worker", "db",
                                     "db check", "db upgrade"])
def test_help_texts_speak_of_the_product(command: str) -> None:
    argv = [sys.executable, "-m", "flashruntime.cli", *command.split(), "--help"]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)
    assert shown.returncode == 0, shown.stderr
    assert not POINTER.search(shown.stdout) and not HISTORY.search(shown.stdout), shown.stdout
    assert not any(_bare_section_pointer(line) for line in shown.stdout.splitlines()), shown.stdout


def test_every_environment_variable_is_listed_once_and_every_listed_one_is_read() -> None:
    from flashruntime.coordinator.settings import variables
    from flashruntime.environment import VARIABLES

    listed = [variable.name for variable in VARIABLES]
    assert len(listed) == len(set(listed))
    used: set[str] = set()
    for root in ("flashruntime", "flashml_workloads"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            if path.name != "environment.py":
                text = path.read_text(encoding="utf-8")
                used |= set(re.findall(r"FLASHML_[A-Z_]+[A-Z]", text))
                used |= set(re.findall(r'_ENV = "(MLFLOW_[A-Z_]+[A-Z])"', text))  # MLflow's, honoured as it does
    assert used - set(listed) == set(), "read but not listed in flashruntime.environment"
    assert set(listed) - used == set(), "listed but read nowhere"
    assert set(variables().values()) <= set(listed)  # the coordinator's typed settings among them
