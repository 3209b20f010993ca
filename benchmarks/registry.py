"""The scenario registry: every module in ``benchmarks/scenarios/`` that defines
``SCENARIO`` is registered under its name.

A scenario's ``run(repeats, smoke)`` returns rows built with ``benchmarks.rows``;
heavy imports (torch, numpy, the code under test) happen inside ``run``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Section = Literal["performance", "resilience"]


@dataclass(frozen=True)
class Scenario:
    name: str
    hypothesis: str
    section: Section
    run: Callable[[int, bool], list[dict[str, Any]]]


def _discover() -> dict[str, Scenario]:
    from benchmarks import scenarios

    found: dict[str, Scenario] = {}
    for info in sorted(pkgutil.iter_modules(scenarios.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"benchmarks.scenarios.{info.name}")
        scenario = getattr(module, "SCENARIO", None)
        if isinstance(scenario, Scenario):
            if scenario.name in found:
                raise RuntimeError(f"benchmark scenario {scenario.name!r} is defined twice")
            found[scenario.name] = scenario
    return found


SCENARIOS: dict[str, Scenario] = _discover()
