"""numpy is optional: with numpy refused by an import hook, the pure path does all the work.

Each case runs in a fresh interpreter whose ``sys.meta_path`` refuses ``numpy``, so the
library under test sees exactly what a machine without numpy would show.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BLOCK_NUMPY = textwrap.dedent(
    """
    import sys
    class _RefuseNumpy:
        def find_spec(self, name, path=None, target=None):
            if name == "numpy" or name.startswith("numpy."):
                raise ImportError("numpy is blocked in this test")
            return None
    sys.meta_path.insert(0, _RefuseNumpy())
    """
)


def run_python(code: str, tmp_path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_NUMPY + textwrap.dedent(code)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pure_path_works_and_auto_falls_back_without_numpy(tmp_path):
    out = run_python(
        """
        import json, math, sys
        from flashml_workloads.fedavg_weights import decode, encode, reduce_deltas_with_report
        honest = [({"w": {"shape": [2], "data": [0.5, -0.25]}}, 4) for _ in range(4)]
        attack = (encode({"w": ([2], [5e5, 5e5])}, compact=True), 4)
        auto, auto_events = reduce_deltas_with_report(honest + [attack])
        pure, pure_events = reduce_deltas_with_report(honest + [attack], accel="pure")
        try:
            reduce_deltas_with_report(honest, accel="numpy")
            error = None
        except ImportError as exc:
            error = str(exc)
        print(json.dumps({
            "auto": auto, "pure": pure, "events": [list(e) for e in auto_events],
            "same_events": auto_events == pure_events, "error": error,
            "numpy_loaded": "numpy" in sys.modules,
            "compact": list(decode(attack[0])["w"][1]),
        }))
        """,
        tmp_path,
    )
    assert out["numpy_loaded"] is False
    assert out["auto"] == out["pure"] and out["same_events"] is True
    assert [e[0] for e in out["events"]] == [4]
    assert "accel" in out["error"] and "numpy" in out["error"]
    assert out["compact"] == [5e5, 5e5]


def test_importing_the_weights_module_and_pure_reduce_never_import_numpy(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import json, sys
            import flashml_workloads.fedavg_weights as fw
            import flashml_workloads.fedavg_driver
            import flashml_workloads.fedavg_worker
            after_import = sorted(m for m in ("numpy", "torch") if m in sys.modules)
            fw.reduce_deltas([({"w": {"shape": [1], "data": [1.0]}}, 1)], accel="pure")
            print(json.dumps({"after_import": after_import, "after_pure": "numpy" in sys.modules}))
            """
        )],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"after_import": [], "after_pure": False}


def test_auto_takes_the_numpy_fast_path_when_numpy_imports():
    pytest.importorskip("numpy")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import json, sys
            from flashml_workloads.fedavg_weights import reduce_deltas
            reduce_deltas([({"w": {"shape": [1], "data": [1.0]}}, 1)])
            print(json.dumps("flashml_workloads._fedavg_numpy" in sys.modules))
            """
        )],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) is True
