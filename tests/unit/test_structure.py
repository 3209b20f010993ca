"""The architecture as tests: which package may import which, no import cycle, no
reaching into another package's private modules or names.

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ...
import`` of ``flashruntime`` and ``flashml_workloads`` (relative ones resolved), with the
line it is on and whether it runs at import time, later, or never (``TYPE_CHECKING``).
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
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
    "trackers": "metrics written to the trackers teams compare runs in (TensorBoard, MLflow)",
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
    type_checking: bool = False  # under ``if TYPE_CHECKING:``: read by type checkers, never executed


def _module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    return {_module_name(path, root): path for package in PACKAGES if (root / package).is_dir()
            for path in (root / package).rglob("*.py") if "__pycache__" not in path.parts}


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


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes inside an ``if TYPE_CHECKING:`` body, at any depth (its ``else`` runs)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                or isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"):
            found.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return found


def _from_module(module: str, path: Path, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from ... import`` names; relative forms resolved against ``module``."""
    if node.level == 0:
        return node.module
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else [])) or None


def _imports(modules: dict[str, Path] = MODULES) -> list[Import]:
    found: list[Import] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level_nodes(tree)
        typing_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            at = {"line": node.lineno, "top_level": id(node) in top, "type_checking": id(node) in typing_only}
            if isinstance(node, ast.Import):
                found += [Import(module, alias.name, None, **at) for alias in node.names]
            elif named := _from_module(module, path, node):
                for alias in node.names:
                    candidate = f"{named}.{alias.name}"
                    target = candidate if candidate in modules else named
                    found.append(Import(module, target, alias.name, **at))
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


# --- import cycles ---------------------------------------------------------------------------
# A deferred import (inside a function or a try block) closes a circle as surely as one at the
# top: the two modules still cannot be understood, tested or moved apart. Only imports under
# ``if TYPE_CHECKING:`` are exempt, as they never run.

Graph = dict[str, dict[str, list[Import]]]  # node -> the nodes it imports -> the import lines


def _graph(imports: list[Import], modules: Iterable[str], node: Callable[[str], str] = lambda module: module) -> Graph:
    """The runtime import graph over ``node(module)``: a module's own name, or its package."""
    known = set(modules)
    graph: Graph = {node(module): {} for module in known}
    for edge in imports:
        if edge.type_checking or edge.target not in known:
            continue
        source, target = node(edge.source), node(edge.target)
        if source != target:
            graph[source].setdefault(target, []).append(edge)
    return graph


def _reachable(graph: Graph, start: str) -> set[str]:
    """The nodes reachable from ``start`` in one step or more (``start`` itself when on a cycle)."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(graph[current])
    return seen


def _shortest_cycle(graph: Graph, start: str, group: set[str]) -> list[str]:
    """``[start, ..., start]``, breadth first through ``group`` (a strongly connected one)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        for target in sorted(graph[current]):
            if target == start:
                path = [current]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if target in group and target not in parent:
                parent[target] = current
                queue.append(target)
    raise AssertionError(f"{start} is on no cycle")


def _circles(graph: Graph) -> list[tuple[list[str], set[str]]]:
    """Every group of nodes that import each other, directly or not, with one shortest cycle through it."""
    reach = {node: _reachable(graph, node) for node in graph}
    placed: set[str] = set()
    circles = []
    for node in sorted(graph):
        if node in placed or node not in reach[node]:
            continue
        group = {other for other in reach[node] if node in reach[other]}
        placed |= group
        circles.append((_shortest_cycle(graph, node, group), group))
    return circles


def _cycles(graph: Graph) -> list[list[str]]:
    return [cycle for cycle, _ in _circles(graph)]


def _cycle_report(graph: Graph, shown_per_step: int = 5) -> list[str]:
    """Each cycle as ``a -> b -> a`` followed by the import lines that form it."""
    report = []
    for cycle, group in _circles(graph):
        lines = [" -> ".join(cycle)]
        for source, target in pairwise(cycle):
            edges = list(dict.fromkeys(  # one line per statement, not per name it imports
                f"    {edge.source}:{edge.line} imports {edge.target}"
                f" ({'at import time' if edge.top_level else 'deferred'})" for edge in graph[source][target]))
            lines += edges[:shown_per_step]
            if len(edges) > shown_per_step:
                lines.append(f"    ... and {len(edges) - shown_per_step} more from {source} to {target}")
        if len(group) > len(cycle) - 1:
            lines.append(f"    (one cycle among {len(group)} that import each other: {', '.join(sorted(group))})")
        report.append("\n".join(lines))
    return report


def test_no_import_cycle() -> None:
    report = _cycle_report(_graph(IMPORTS, MODULES))
    assert not report, ("import cycles (deferred imports count; move what both sides need into a module of "
                        "its own):\n" + "\n".join(report))


def test_no_import_cycle_between_packages() -> None:
    """Package A depends on B when any module of A imports one of B; top-level modules
    (``flashruntime.errors``) are nodes of their own."""
    report = _cycle_report(_graph(IMPORTS, MODULES, _package))
    assert not report, ("import cycles between packages (deferred imports count; move what both need into a "
                        "package or top-level module of its own):\n" + "\n".join(report))


_PLANTED = {
    "flashruntime/__init__.py": "",
    "flashruntime/alpha/__init__.py": "",
    "flashruntime/alpha/one.py": "from flashruntime.beta.two import helper\n",
    "flashruntime/beta/__init__.py": "",
    "flashruntime/beta/two.py": (
        "from typing import TYPE_CHECKING\n"
        "\n"
        "if TYPE_CHECKING:\n"
        "    from flashruntime.gamma import three\n"
        "\n"
        "\n"
        "def helper():\n"
        "    from flashruntime.alpha import one\n"
        "\n"
        "    return one\n"
    ),
    "flashruntime/gamma/__init__.py": "",
    "flashruntime/gamma/three.py": "try:\n    from flashruntime.beta import two\nexcept ImportError:\n    two = None\n",
    "flashruntime/gamma/four.py": "try:\n    from . import five\nexcept ImportError:\n    five = None\n",
    "flashruntime/gamma/five.py": "def back():\n    from .four import five\n\n    return five\n",
}


def test_the_cycle_detector_finds_circles_closed_by_deferred_imports(tmp_path: Path) -> None:
    for relative, text in _PLANTED.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")
    modules = _modules(tmp_path)
    imports = _imports(modules)

    assert _cycles(_graph(imports, modules)) == [
        ["flashruntime.alpha.one", "flashruntime.beta.two", "flashruntime.alpha.one"],
        ["flashruntime.gamma.five", "flashruntime.gamma.four", "flashruntime.gamma.five"],
    ]
    # beta -> gamma only under TYPE_CHECKING: gamma's try-block import of beta closes no circle
    assert _cycles(_graph(imports, modules, _package)) == [
        ["flashruntime.alpha", "flashruntime.beta", "flashruntime.alpha"]]
    report = _cycle_report(_graph(imports, modules))
    assert report[0] == ("flashruntime.alpha.one -> flashruntime.beta.two -> flashruntime.alpha.one\n"
                         "    flashruntime.alpha.one:1 imports flashruntime.beta.two (at import time)\n"
                         "    flashruntime.beta.two:8 imports flashruntime.alpha.one (deferred)")
    assert "flashruntime.gamma.five:2 imports flashruntime.gamma.four (deferred)" in report[1]
    assert "flashruntime.gamma.four:2 imports flashruntime.gamma.five (at import time)" in report[1]


def test_the_cycle_detector_finds_a_deferred_edge_planted_in_the_real_graph() -> None:
    """One function-level import back along a real edge between packages closes a circle at both levels."""
    graph = _graph(IMPORTS, MODULES)
    source, target = next((source, target) for source in sorted(graph) for target in sorted(graph[source])
                          if _package(source) != _package(target))
    planted = [*IMPORTS, Import(target, source, None, line=1, top_level=False)]
    closing = f"{target}:1 imports {source} (deferred)"

    module_cycles = [cycle for cycle in _cycle_report(_graph(planted, MODULES)) if closing in cycle]
    package_cycles = [cycle for cycle in _cycle_report(_graph(planted, MODULES, _package)) if closing in cycle]

    assert len(module_cycles) == 1
    assert len(package_cycles) == 1


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
