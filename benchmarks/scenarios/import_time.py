"""import_time: cold ``import flashruntime`` against ``import pydantic``.

Each sample is a fresh ``python -I -c`` process with bytecode already compiled; the
figure is perf_counter around the import statement inside that process. The two
imports alternate so drift hits both alike. The same processes report which
forbidden modules the import loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row
from benchmarks.targets import FORBIDDEN_MODULES, IMPORT_OVER_PYDANTIC

NAME = "import_time"
SECTION = "performance"
REPO_ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "numpy", "sklearn", "transformers", "fastapi", "uvicorn", "httpx", "psutil", "yaml")
MIN_SAMPLES = 21

_PROBE = """
import sys, time, json
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
import {module}
t1 = time.perf_counter()
loaded = sorted(m for m in {forbidden!r} if m in sys.modules)
print(json.dumps({{"ms": (t1 - t0) * 1000.0, "forbidden": loaded}}))
"""


def _probe(module: str) -> dict:
    code = _PROBE.format(root=str(REPO_ROOT), module=module, forbidden=FORBIDDEN)
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _process_wall_ms(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-c", code], check=True)
    return (time.perf_counter() - started) * 1000.0


def run(repeats: int, smoke: bool) -> list[dict]:
    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    # Warm-up: compile bytecode for both, discarded.
    _probe("flashruntime")
    _probe("pydantic")
    ours: list[float] = []
    theirs: list[float] = []
    forbidden_seen: set[str] = set()
    for _ in range(samples):
        probe = _probe("flashruntime")
        ours.append(probe["ms"])
        forbidden_seen.update(probe["forbidden"])
        theirs.append(_probe("pydantic")["ms"])
    protocol = [_probe("flashruntime.protocol")["ms"] for _ in range(samples)]
    import_line = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import flashruntime"
    wall_ours = [_process_wall_ms(import_line) for _ in range(samples)]
    wall_pass = [_process_wall_ms("pass") for _ in range(samples)]
    return [
        measured_row(
            NAME, SECTION, "import_ms", "ms", ours,
            comparator=("import pydantic", theirs),
            target=IMPORT_OVER_PYDANTIC,
            notes=["cold = fresh interpreter with compiled bytecode, not a cold page cache"],
        ),
        measured_row(
            NAME, SECTION, "forbidden_modules_loaded", "modules", [float(len(forbidden_seen))] * samples,
            target=FORBIDDEN_MODULES,
            notes=[f"loaded: {sorted(forbidden_seen)}" if forbidden_seen else f"none of {', '.join(FORBIDDEN)}"],
        ),
        measured_row(
            NAME, SECTION, "protocol_import_ms", "ms", protocol,
            comparator=("import pydantic", theirs),
            notes=["informational: every wire model (schemas deferred), paid on first use"],
        ),
        measured_row(
            NAME, SECTION, "process_wall_ms", "ms", wall_ours,
            comparator=("python -c pass", wall_pass),
            notes=["informational: whole-process spawn-to-exit"],
        ),
    ]


SCENARIO = Scenario(
    name=NAME,
    hypothesis="import flashruntime costs at most 1.5x import pydantic and loads no optional dependency",
    section=SECTION,
    run=run,
)
