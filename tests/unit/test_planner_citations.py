"""Every numeric constant of the planner sits under (or beside) a comment naming its
published source, and the planner imports no ML framework."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import flashruntime.planner

PLANNER_DIR = Path(flashruntime.planner.__file__).parent
SOURCE = re.compile(
    r"(19|20)\d\d|datasheet|whitepaper|IEEE|JEDEC|PCI-SIG|config\.json|model card|guide|docs|"
    r"PyTorch|DeepSpeed|tuning\.cc|ITU-T"
)
CITED_MODULES = ("constants.py", "catalog_models.py", "catalog_gpus.py", "catalog_links.py")
FRAMEWORKS = ("torch", "numpy", "transformers", "peft", "deepspeed", "accelerate", "bitsandbytes", "yaml")


def _has_number(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
               for n in ast.walk(node))


def _citation_above(lines: list[str], lineno: int) -> str | None:
    """The comment block governing the code at 1-based ``lineno``: inline, or the nearest one above
    (walking over the contiguous code lines of sibling constants)."""
    code, _, inline = lines[lineno - 1].partition("  # ")
    if inline:
        return inline
    block: list[str] = []
    index = lineno - 2
    while index >= 0:
        stripped = lines[index].strip()
        if stripped.startswith("#"):
            block.append(stripped)
        elif block or not stripped:
            break
        index -= 1
    return " ".join(reversed(block)) or None


def _numeric_sites(tree: ast.Module) -> list[tuple[str, int]]:
    sites: list[tuple[str, int]] = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _has_number(node.value):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = ast.unparse(target)
            if isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values):
                    if key is not None and _has_number(value):
                        sites.append((f"{name}[{ast.unparse(key)}]", key.lineno))
            else:
                sites.append((name, node.lineno))
    return sites


@pytest.mark.parametrize("module", CITED_MODULES)
def test_every_numeric_constant_is_cited(module: str) -> None:
    source = (PLANNER_DIR / module).read_text(encoding="utf-8")
    lines = source.splitlines()
    sites = _numeric_sites(ast.parse(source))
    assert sites, module
    uncited = [name for name, lineno in sites if not SOURCE.search(_citation_above(lines, lineno) or "")]
    assert uncited == [], f"{module}: constants without a cited source: {uncited}"


def test_planner_modules_import_no_ml_framework() -> None:
    for path in PLANNER_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FRAMEWORKS, f"{path.name} imports {name}"
