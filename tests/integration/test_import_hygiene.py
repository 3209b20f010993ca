"""``import flashruntime`` loads only pydantic and the stdlib, writes nothing,
and the core works with nothing else installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests._support import REPO_ROOT, run_core_only

FORBIDDEN = ["torch", "numpy", "sklearn", "transformers", "fastapi", "uvicorn", "httpx", "psutil", "yaml", "ray",
             "psycopg"]


def _tree_snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def test_import_loads_no_forbidden_module_and_writes_nothing(tmp_path: Path) -> None:
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    package_before = _tree_snapshot(REPO_ROOT / "flashruntime")
    code = (
        "import sys, json; sys.path.insert(0, %r); import flashruntime, flashruntime.protocol, flashruntime.errors; "
        "print(json.dumps(sorted(m for m in %r if m in sys.modules)))" % (str(REPO_ROOT), FORBIDDEN)
    )
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home)}
    out = subprocess.run([sys.executable, "-B", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == []
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
    assert _tree_snapshot(REPO_ROOT / "flashruntime") == package_before


def test_core_only_import_with_every_optional_dependency_refused() -> None:
    result = run_core_only(
        "import flashruntime as flash, flashruntime.protocol, flashruntime.errors, flashruntime.service.cli\n"
        "flash.PlanRequest, flash.Resources\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_service_modules_agents_use_import_with_only_the_core() -> None:
    """the service package and .cli, .worker, .auth, .modea, .ledger, .checkpoints
    import without the service extra (fastapi, uvicorn, httpx refused); only .app needs it."""
    result = run_core_only(
        "import flashruntime.service, flashruntime.service.cli, flashruntime.service.worker\n"
        "import flashruntime.service.auth, flashruntime.service.modea, flashruntime.service.ledger\n"
        "from flashruntime.service.checkpoints import CommitRequest, RegisterPartRequest\n"
        "from flashruntime.protocol import v1alpha1\n"
        "assert CommitRequest is v1alpha1.CommitRequest and RegisterPartRequest is v1alpha1.RegisterPartRequest\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    app = run_core_only("import flashruntime.service.app\n")
    assert app.returncode != 0 and "refused: core-only test" in app.stderr


def test_the_blocker_really_blocks() -> None:
    result = run_core_only("import yaml\n")
    assert result.returncode != 0 and "refused: core-only test" in result.stderr


def test_cli_help_works_with_only_the_core() -> None:
    result = run_core_only("from flashruntime.service.cli import main\nraise SystemExit(main(['--help']))\n")
    assert result.returncode == 0, result.stderr
    assert "usage: flashruntime" in result.stdout
    version = run_core_only("from flashruntime.service.cli import main\nmain(['--version'])\n")
    assert "flashruntime 0.5.0" in version.stdout


def test_the_ray_backend_imports_without_ray_and_using_it_names_the_extra() -> None:
    """Its modules (the launcher, the rules, the Ray side of a coordinator task, K-means on Ray)
    import with only the core; connecting raises ``ModuleUnavailable`` naming the extra."""
    result = run_core_only(
        "import flashruntime.ray_backend.launcher, flashruntime.ray_backend.resources\n"
        "import flashruntime.ray_backend.failures, flashruntime.agent.ray_task, flashml_workloads.sharded_kmeans\n"
        "from flashruntime.errors import ModuleUnavailable\n"
        "from flashruntime.ray_backend.cluster import connect\n"
        "try:\n"
        "    connect('local')\n"
        "except ModuleUnavailable as exc:\n"
        "    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "install the ray extra: pip install 'flashruntime[ray]'" in result.stdout


def test_flash_submit_on_ray_without_ray_says_what_to_install(tmp_path: Path) -> None:
    result = run_core_only(
        "import sys\n"
        "import flashruntime as flash\n"
        "from flashruntime.workloads.command import CommandWorkload, Source\n"
        f"workload = CommandWorkload(command=[sys.executable, '-c', 'pass'], source=Source(path={str(tmp_path)!r}))\n"
        "try:\n"
        f"    flash.submit(workload, output_dir={str(tmp_path / 'run')!r}, executor='ray', quiet=True, watch=False)\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ModuleUnavailable ") and "pip install 'flashruntime[ray]'" in result.stdout
    assert not (tmp_path / "run").exists()  # refused before anything was made
