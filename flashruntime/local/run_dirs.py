"""The runs root and new run directories, defined in ``flashruntime.run_dirs`` (the
profiler's calibration ledger lives under the same root) and importable from here too."""

from __future__ import annotations

from flashruntime.run_dirs import RUNS_DIR_ENV, new_run_dir, runs_root

__all__ = ["RUNS_DIR_ENV", "new_run_dir", "runs_root"]
