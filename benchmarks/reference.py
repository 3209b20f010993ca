"""One reference result per scenario, kept in git, and the docs page made from them.

``python -m benchmarks run`` writes every run to ``benchmarks/results/`` (not kept).
``python -m benchmarks adopt RESULT...`` makes each scenario of those files its
reference (``benchmarks/reference/<scenario>.json``: that scenario's rows and the host
they ran on) and regenerates ``docs/benchmarks.md``, which is nothing but these
references rendered: a test holds the page to them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.report import render_markdown
from benchmarks.rows import Target
from flashruntime.files import write_atomic

__all__ = ["DOCS_PAGE", "REFERENCE_DIR", "adopt", "load_references", "render_page"]

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def adopt(results: list[Path], reference_dir: Path = REFERENCE_DIR) -> list[str]:
    """Make every scenario of ``results`` (later files win) its reference; → the scenarios
    adopted. A smoke run is refused: it is labelled not representative."""
    adopted: dict[str, dict[str, Any]] = {}
    for path in results:
        result = json.loads(path.read_text(encoding="utf-8"))
        if result.get("smoke"):
            raise ValueError(f"{path} is a smoke run (one sample at a tiny scale): run without --smoke to adopt it")
        for scenario in dict.fromkeys(row["scenario"] for row in result["rows"]):
            rows = [row for row in result["rows"] if row["scenario"] == scenario]
            adopted[scenario] = {**{k: v for k, v in result.items() if k != "rows"}, "rows": rows}
    reference_dir.mkdir(parents=True, exist_ok=True)
    for scenario, document in adopted.items():
        write_atomic(reference_dir / f"{scenario}.json", json.dumps(document, indent=1) + "\n")
    return sorted(adopted)


def load_references(reference_dir: Path = REFERENCE_DIR) -> list[dict[str, Any]]:
    """Every reference result, in scenario order."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(reference_dir.glob("*.json"))]


def _targets_table() -> list[str]:
    from benchmarks import targets

    lines = ["| target | what it holds, and why |", "|---|---|"]
    for name in targets.__all__:
        value = getattr(targets, name)
        if isinstance(value, Target):
            lines.append(f"| `{name}`: {value.op} {value.value:g} {value.unit} | {value.source} |")
    return lines


def render_page(references: list[dict[str, Any]]) -> str:
    """``docs/benchmarks.md``: how to reproduce, the targets and their reasons, then each
    scenario's reference result."""
    lines = [
        "# Benchmarks",
        "",
        "Every scenario runs side by side with a named comparator in the same process tree, and reports "
        "min / median / max over its repetitions and the ratio to the comparator. This page shows the "
        "reference result of each scenario, on the host named with it; `met` is judged only on the 2-core "
        "development host the targets were set on.",
        "",
        "Reproduce a figure:",
        "",
        "```bash",
        "python -m benchmarks list                          # the scenarios and what each tests",
        "python -m benchmarks run --scenario lease_throughput --repeats 5",
        "python -m benchmarks report benchmarks/results/<file>.json",
        "python -m benchmarks adopt benchmarks/results/<file>.json   # make it the reference; regenerates this page",
        "```",
        "",
        "That host slows 1.6-2x for minutes at a time; each scenario's notes give a fixed reference "
        "workload's pace just before and after it, and the targets that matter are ratios to a comparator "
        "measured in the same run.",
        "",
        "## Targets",
        "",
        *_targets_table(),
        "",
    ]
    if not references:
        lines += ["No reference result is recorded yet: run the scenarios and adopt the result.", ""]
    for reference in references:
        scenario = reference["rows"][0]["scenario"] if reference["rows"] else "?"
        body = render_markdown(reference).replace("### Performance", "Performance:").replace(
            "### Resilience", "Resilience:")
        lines += [f"## `{scenario}`", "", body.rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"
