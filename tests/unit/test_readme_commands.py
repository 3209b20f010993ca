"""README's two fresh-machine commands exist, and CI runs exactly them."""

from __future__ import annotations

import pytest

from scripts.readme_commands import readme_command
from tests._support import REPO_ROOT


def test_readme_has_both_commands() -> None:
    assert readme_command("a") == "pip install . && flashruntime demo"
    assert readme_command("b").endswith("python -m pytest")
    assert 'pip install -e ".[service,monitor,dev]"' in readme_command("b")
    assert "pip install torch==2.13.0" in readme_command("b")


def test_ci_runs_the_readme_commands() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "scripts/readme_commands.py a" in ci and "scripts/readme_commands.py b" in ci
    assert 'bash -c "$cmd_a"' in ci and 'bash -c "$cmd_b"' in ci


def test_parser_refuses_missing_or_multiline_blocks() -> None:
    with pytest.raises(LookupError, match=r"no ```bash block"):
        readme_command("a", "# nothing here\n")
    with pytest.raises(LookupError, match="exactly one line"):
        readme_command("a", "(a) two:\n\n```bash\npip install .\nflashruntime demo\n```\n")
