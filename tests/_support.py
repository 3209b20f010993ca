"""Shared test helpers: a subprocess prelude that makes every non-core import fail.

"Core only" claims are checked in a subprocess whose ``sys.meta_path`` refuses every
third-party module except pydantic's own stack, so an accidental optional import
surfaces as ModuleNotFoundError instead of passing because it happens to be installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# pydantic and what it needs at runtime; everything else third-party is refused.
CORE_ALLOWED = (
    "flashruntime", "flashml_workloads", "pydantic", "pydantic_core", "typing_extensions",
    "annotated_types", "typing_inspection",
)


def blocking_prelude(allowed: Iterable[str] = CORE_ALLOWED, refuse: Iterable[str] = ()) -> str:
    """Python source to run first in a subprocess: refuses every import outside the
    standard library and ``allowed``, plus every name in ``refuse``."""
    return f"""
import sys
class _CoreOnly:
    allowed = set({sorted(set(allowed))!r})
    refuse = set({sorted(set(refuse))!r})
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        private = top.startswith("_")  # interpreter internals such as _sysconfigdata_*
        if top in self.refuse or not (private or top in sys.stdlib_module_names or top in self.allowed):
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused: core-only test)", name=name)
        return None
sys.meta_path.insert(0, _CoreOnly())
sys.path.insert(0, {str(REPO_ROOT)!r})
"""


def run_core_only(
    code: str,
    *,
    allowed: Iterable[str] = CORE_ALLOWED,
    refuse: Iterable[str] = (),
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after the blocking prelude in a fresh interpreter."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, *extra_args, "-c", blocking_prelude(allowed, refuse) + code],
        capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout, check=False,
    )


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False



def pids_with_environ_entry(entry: bytes) -> list[int]:
    """Every process whose environment holds ``entry`` (``b"NAME=value"``), by its pid on this
    host: how a test finds an attempt's processes from outside a pid namespace of its own,
    where the pids the task knows mean nothing."""
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and entry in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                found.append(int(name))
        except OSError:
            continue
    return sorted(found)

def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it holds; a hang guard, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class FakeClock:
    """A monotonic clock for injected ``clock``/``sleep`` pairs: ``sleep`` only advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def iris_csv() -> bytes:
    """The iris dataset as the CSV the ``sklearn_trial`` task module reads (scikit-learn ships it:
    no download)."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    lines = ["sepal_length,sepal_width,petal_length,petal_width,species"]
    lines += [",".join([*(f"{v:g}" for v in row), str(iris.target_names[label])])
              for row, label in zip(iris.data, iris.target, strict=True)]
    return ("\n".join(lines) + "\n").encode()
