"""The architecture as tests: which package may import which, no import cycle, no
reaching into another package's private modules or names.

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ...
import`` of ``flashruntime`` and ``flashml_workloads``, with the line it is on.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

PACKAGES = ("flashruntime", "flashml_workloads")
# The packages of the layout, by program and layer: each a directory under flashruntime/.
LAYOUT = {
    "coordinator": "the coordinator service",
    "agent": "the worker agent",
    "cli": "the flashruntime command",
    "local": "flash.submit, Run, the run guard, flash.run",
    "protocol": "wire models",
    "leases": "the lease state machine and its stores",
    "scheduler": "placement policies",
    "checkpoint": "verified checkpoints and their catalog",
    "recovery": "failure classification and the recovery policy",
    "planner": "the strategy planner",
    "profiling": "measuring a few real steps, the profile cache and the calibration ledger",
    "launchers": "starting and stopping local processes",
    "strategies": "compiling a workload into a launch",
    "workloads": "the command workload",
    "recipes": "job recipes",
    "monitor": "resource telemetry",
    "viewer": "the live run page and the offline docs",
    "integrations": "framework helpers",
    "torch": "the in-script torch helper",
    "demo": "the demo's training script",
    "ray_backend": "running work on a Ray cluster",
    "service": "compatibility import paths",
    "db": "the SQLite and PostgreSQL databases under every store",
    "goodput": "the goodput ledgers of coordinator jobs and local runs",
}
CORE_LOGIC = ("leases", "scheduler", "checkpoint", "recovery", "planner")
HEAVY = ("fastapi", "starlette", "uvicorn", "httpx", "torch", "numpy", "ray", "psycopg")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module named (``from a.b import c`` names a.b, or a.b.c when that is a module)
    name: str | None  # for ``from a import name``
    line: int
    top_level: bool  # executed when the module is imported (not inside a function or TYPE_CHECKING)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py")
            if "__pycache__" not in path.parts}


MODULES = _modules()


def _top_level_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes that run at import time."""
    found: set[int] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.add(id(node))
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.Try,)):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With,)):
                visit(node.body)

    visit(tree.body)
    return found


def _imports() -> list[Import]:
    found: list[Import] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(Import(module, alias.name, None, node.lineno, id(node) in top))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    candidate = f"{node.module}.{alias.name}"
                    target = candidate if candidate in MODULES else node.module
                    found.append(Import(module, target, alias.name, node.lineno, id(node) in top))
    return found


IMPORTS = _imports()


def _package(module: str) -> str:
    """``flashruntime.<package>`` (or the top-level module), the unit the rules speak of."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "flashruntime" and len(parts) > 1 else parts[0]


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def test_the_layout_by_program_exists() -> None:
    present = {path.name for path in (REPO_ROOT / "flashruntime").iterdir()
               if path.is_dir() and (path / "__init__.py").is_file()}
    assert present == set(LAYOUT), (
        f"packages not in the layout: {sorted(present - set(LAYOUT))}; missing: {sorted(set(LAYOUT) - present)}")
    assert (REPO_ROOT / "flashruntime" / "client.py").is_file()
    assert (REPO_ROOT / "flashruntime" / "errors.py").is_file()


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for edge in IMPORTS:
        if edge.top_level and edge.target in MODULES and edge.target != edge.source:
            graph[edge.source].add(edge.target)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles[:10])


@pytest.mark.parametrize(("importer", "forbidden"), [
    ("flashruntime.agent", ("flashruntime.coordinator", "flashruntime.cli", "flashruntime.local")),
    ("flashruntime.local", ("flashruntime.coordinator", "flashruntime.agent", "flashruntime.cli")),
    ("flashruntime.client", ("flashruntime.coordinator", "flashruntime.agent", "flashruntime.cli",
                             "flashruntime.local")),
    ("flashml_workloads", ("flashruntime.coordinator", "flashruntime.agent", "flashruntime.cli")),
])
def test_programs_stay_apart(importer: str, forbidden: tuple[str, ...]) -> None:
    wrong = [f"{edge.source}:{edge.line} imports {edge.target}" for edge in IMPORTS
             if (edge.source == importer or edge.source.startswith(importer + "."))
             and any(edge.target == f or edge.target.startswith(f + ".") for f in forbidden)]
    assert not wrong, "\n".join(wrong)


# The commands that run the coordinator or tend its database; they import it inside their handlers.
COORDINATOR_COMMANDS = ("flashruntime.cli.serve", "flashruntime.cli.db")


def test_the_cli_imports_the_coordinator_only_inside_serve_and_db() -> None:
    wrong = [f"{edge.source}:{edge.line}" for edge in IMPORTS if edge.source.startswith("flashruntime.cli")
             and edge.target.startswith("flashruntime.coordinator")
             and (edge.top_level or edge.source not in COORDINATOR_COMMANDS)]
    assert not wrong, wrong


def test_no_module_reaches_into_another_packages_private_parts() -> None:
    wrong = []
    for edge in IMPORTS:
        if not _ours(edge.target):
            continue
        parts = edge.target.split(".")
        private_at = next((i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")),
                          None)
        if private_at is not None:
            owner = ".".join(parts[:private_at])
            if not (edge.source == owner or edge.source.startswith(owner + ".")):
                wrong.append(f"{edge.source}:{edge.line} imports the private module {edge.target}")
        if edge.name and edge.name.startswith("_") and not edge.name.startswith("__") \
                and _package(edge.source) != _package(edge.target):
            wrong.append(f"{edge.source}:{edge.line} imports the private name {edge.target}.{edge.name}")
    assert not wrong, "\n".join(wrong)


def test_core_logic_imports_no_framework() -> None:
    wrong = [f"{edge.source}:{edge.line} imports {edge.target}" for edge in IMPORTS
             if _package(edge.source).split(".")[-1] in CORE_LOGIC
             and edge.target.split(".")[0] in HEAVY]
    assert not wrong, "\n".join(wrong)


def test_only_the_coordinator_imports_fastapi() -> None:
    wrong = [f"{edge.source}:{edge.line}" for edge in IMPORTS
             if edge.target.split(".")[0] in ("fastapi", "starlette", "uvicorn")
             and not edge.source.startswith("flashruntime.coordinator")
             and not (edge.source == "flashruntime.cli.serve" and not edge.top_level)]
    assert not wrong, wrong


def test_no_module_but_the_client_speaks_urllib_to_a_coordinator() -> None:
    wrong = [f"{edge.source}:{edge.line}" for edge in IMPORTS
             if edge.target in ("urllib.request", "http.client") and edge.source != "flashruntime.client"]
    assert not wrong, wrong


def test_the_wheel_holds_no_build_time_code() -> None:
    """The docs are built by scripts/build_docs.py (not packaged); the package only serves them."""
    tomllib = pytest.importorskip("tomllib")
    wrong = [f"{edge.source}:{edge.line}" for edge in IMPORTS if edge.target.split(".")[0] in ("markdown_it", "scripts")]
    assert not wrong, wrong
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["flashruntime*", "flashml_workloads*"]


def test_nothing_outside_a_module_touches_a_runs_private_members() -> None:
    """The drive loop and the guard change a ``Run`` through ``run.recorder`` only."""
    wrong = []
    for module, path in MODULES.items():
        if module == "flashruntime.local.run":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if re.search(r"\brun\._[a-z]", line):
                wrong.append(f"{module}:{number}: {line.strip()}")
    assert not wrong, "\n".join(wrong)


# Ray is the ray extra's: these modules import it, each inside functions only, so that
# ``import flashruntime`` and everything it loads stay Ray-free.
RAY_USERS = ("flashruntime.ray_backend", "flashruntime.coordinator.ray_dispatch", "flashruntime.agent.ray_task",
             "flashml_workloads.sharded_kmeans")


def test_ray_is_imported_inside_functions_of_the_ray_backend_only() -> None:
    wrong = [f"{edge.source}:{edge.line}" + (" (at import time)" if edge.top_level else "") for edge in IMPORTS
             if edge.target.split(".")[0] == "ray"
             and (edge.top_level or not edge.source.startswith(RAY_USERS))]
    assert not wrong, wrong
    assert any(edge.target.split(".")[0] == "ray" for edge in IMPORTS)  # the rule has something to check
