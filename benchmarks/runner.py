"""Runs scenarios, judges targets and writes the ``bench_v1`` result file atomically."""

from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.host import host_info, is_reference_host
from benchmarks.pace import WORKLOAD, pace_by_cpu
from benchmarks.registry import SCENARIOS
from benchmarks.rows import judge
from flashruntime.files import write_atomic

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def default_out() -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return RESULTS_DIR / f"{stamp}-{platform.node() or 'host'}.json"


def run_scenarios(names: list[str], repeats: int, smoke: bool, out: Path) -> tuple[dict[str, Any], bool]:
    """Run ``names`` in order; returns the result and whether every scenario ran without raising."""
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise KeyError(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    host = host_info(out.parent)
    reference = is_reference_host(host)
    rows: list[dict[str, Any]] = []
    clean = True
    for name in names:
        scenario = SCENARIOS[name]
        started = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        pace_before = pace_by_cpu()
        try:
            produced = scenario.run(1 if smoke else repeats, smoke)
        except Exception as exc:  # a scenario bug must not lose the other rows
            clean = False
            traceback.print_exc()
            produced = [{
                "scenario": name, "section": scenario.section, "metric": "run", "unit": "", "repeats": 0,
                "min": None, "median": None, "max": None, "p10": None, "p90": None, "status": "error",
                "comparator": None, "ratio": None, "target": None, "met": None,
                "skip_reason": f"scenario raised {type(exc).__name__}: {exc}", "notes": [],
            }]
        pace = {"before": pace_before, "after": pace_by_cpu()}
        for row in produced:
            row["host_pace_ms"] = pace
            rows.append(judge(row, reference))
        print(f"[bench] {name} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    result = {
        "schema": "bench_v1",
        "smoke": smoke,
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": host,
        "reference_host": reference,
        "host_pace_workload": WORKLOAD,
        "rows": rows,
    }
    write_atomic(out, json.dumps(result, indent=1) + "\n")
    return result, clean
