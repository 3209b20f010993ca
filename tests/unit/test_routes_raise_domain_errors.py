"""The coordinator's route modules refuse requests with errors of the ``flashruntime.errors``
family, never with a hand-made ``HTTPException``: the app answers each error once, from the
status its class carries, so a route cannot answer a refusal differently from another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

COORDINATOR = REPO_ROOT / "flashruntime" / "coordinator"
CHECKED = sorted(COORDINATOR.glob("routes_*.py")) + [COORDINATOR / "guard.py"]


def _http_exceptions_raised(source: str) -> list[int]:
    """Lines of ``raise`` statements whose exception is an ``HTTPException`` (by any import
    name: ``HTTPException``, ``StarletteHTTPException``, ``fastapi.HTTPException``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = raised.attr if isinstance(raised, ast.Attribute) else getattr(raised, "id", "")
        if name.endswith("HTTPException"):
            lines.append(node.lineno)
    return lines


def test_the_route_modules_are_found() -> None:
    assert {path.name for path in CHECKED} >= {"routes_jobs.py", "routes_fleet.py", "routes_meta.py", "guard.py"}


@pytest.mark.parametrize("path", CHECKED, ids=lambda path: path.name)
def test_a_route_module_raises_no_http_exception(path: Path) -> None:
    lines = _http_exceptions_raised(path.read_text(encoding="utf-8"))
    assert lines == [], (f"{path.name} raises HTTPException at lines {lines}: raise the error of "
                         "flashruntime.errors that says what was refused (its class carries the status)")


@pytest.mark.parametrize("statement", [
    "raise HTTPException(404, 'unknown job')",
    "raise fastapi.HTTPException(status_code=422, detail='no')",
    "raise StarletteHTTPException(400)",
    "def f():\n    try:\n        pass\n    except ValueError:\n        raise HTTPException(422, 'x') from None",
])
def test_the_check_finds_every_spelling(statement: str) -> None:
    assert _http_exceptions_raised(statement) != []


def test_the_check_lets_domain_errors_and_re_raises_pass() -> None:
    assert _http_exceptions_raised("raise NotFound('unknown job')\nraise\nraise refusal from None") == []
