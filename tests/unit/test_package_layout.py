"""the module path of every public name, pinned (the table users import from).

A name missing here is a broken ``from X import Y`` for someone. Modules that need an
optional dependency skip without it (which under ``CI=true`` fails the run)."""

from __future__ import annotations

import importlib

import pytest

LAYOUT: dict[str, tuple[str, ...]] = {
    "flashruntime.sdk": ("submit", "Run"),
    "flashruntime.workloads": ("CommandWorkload", "Source", "OutputSpec", "to_jobspec"),
    "flashruntime.workloads.command": ("CommandWorkload", "Source", "OutputSpec", "to_jobspec"),
    "flashruntime.providers": ("Requirements",),
    "flashruntime.strategies": ("LaunchSpec", "StrategyCompiler", "register_compiler", "compiler_for", "CompileError"),
    "flashruntime.strategies.command": ("compile_workload",),
    "flashruntime.launchers": ("LaunchState", "LaunchHandle", "Launcher", "LaunchError"),
    "flashruntime.launchers.local": ("LocalProcessLauncher", "LocalLaunchHandle"),
    "flashruntime.integrations.sklearn": ("sweep", "hpo"),
    "flashruntime.integrations.pytorch": ("ddp",),
    "flashruntime.integrations.huggingface": ("trainer", "latest_checkpoint", "flashruntime_callback"),
    "flashruntime.torch": ("prepare", "checkpoint", "log_metrics", "rank", "world_size", "is_main", "start_step",
                           "device", "backend"),
    "flashruntime.planner": ("plan", "render", "PLANNER_VERSION"),
    "flashruntime.planner.explain": ("render_report",),
    "flashruntime.leases": ("LeaseManager", "LeaseError", "TaskRecord", "LeaseStore", "InMemoryLeaseStore",
                            "SqliteLeaseStore", "MAX_LEASE_SECONDS", "bounded_lease_seconds"),
    "flashruntime.scheduler": ("NodeView", "PlacementPolicy", "FifoPlacement", "IsolationAwarePlacement"),
    "flashruntime.checkpoint": ("MANIFEST_NAME", "open_part", "write_manifest", "verify_manifest",
                                "latest_valid_manifest", "CheckpointCatalog", "CheckpointError", "ManifestStore",
                                "InMemoryManifestStore", "SqliteManifestStore"),
    "flashruntime.recovery": ("POLICY_VERSION", "CORRELATED_THRESHOLD", "FailureSignals", "classify", "decide",
                              "explain", "replay", "from_local_launch", "describe_launch"),
    "flashruntime.recipes": ("WorkloadRecipe", "register_recipe", "recipe_for"),
    "flashruntime.recipes.command": ("CommandRecipe",),
    "flashruntime.monitor": ("ResourceSampler", "evidence_from_telemetry"),
    "flashruntime.viewer": ("RunViewerServer", "collect", "render", "TOKENS"),
    "flashruntime.viewer.server": ("RunViewerServer",),
    "flashruntime.viewer.state": ("collect",),
    "flashruntime.viewer.page": ("render", "TOKENS"),
    "flashruntime.service.app": ("create_app", "RuntimeSettings", "app"),
    "flashruntime.service.auth": ("NodeAuthenticator", "OpenAuthenticator", "StaticTokenAuthenticator",
                                  "authenticator_from_env", "AuthConfigError"),
    "flashruntime.service.modea": ("expand_tasks", "ExpansionError", "ALLOWED_TASK_MODULES", "MAX_LEASE_SECONDS",
                                   "FEDAVG_WORKER_PARAM_KEYS", "FEDAVG_DRIVER_SUPPLIED_KEYS", "ClaimRequest",
                                   "CompleteRequest", "FailRequest"),
    "flashruntime.service.checkpoints": ("RegisterPartRequest", "CommitRequest"),
    "flashruntime.service.ledger": ("Ledger",),
    "flashruntime.service.worker": ("WorkerAgent", "main"),
    "flashruntime.service.cli": ("main",),
    "flashruntime.service.dashboard": ("DASHBOARD_HTML",),
}

NEEDS = {"flashruntime.service.app": "fastapi"}


@pytest.mark.parametrize("module_name", sorted(LAYOUT))
def test_every_public_name_lives_where_the_spec_says(module_name: str) -> None:
    if module_name in NEEDS:
        pytest.importorskip(NEEDS[module_name])
    module = importlib.import_module(module_name)
    missing = [name for name in LAYOUT[module_name] if not hasattr(module, name)]
    assert not missing, f"{module_name} lacks {missing}"


def test_re_exports_are_the_defining_objects() -> None:
    from flashruntime.planner import render
    from flashruntime.planner.explain import render_report
    from flashruntime.protocol import v1alpha1
    from flashruntime.service import checkpoints, modea

    assert render_report is render
    assert checkpoints.CommitRequest is v1alpha1.CommitRequest
    assert checkpoints.RegisterPartRequest is v1alpha1.RegisterPartRequest
    assert modea.ClaimRequest is v1alpha1.ClaimRequest


# Earlier releases' import paths -> where the code lives now; each name must be the same object.
COMPAT: dict[str, tuple[str, tuple[str, ...]]] = {
    "flashruntime.sdk": ("flashruntime.local.submit", ("submit",)),
    "flashruntime.service.app": ("flashruntime.coordinator.app", ("create_app",)),
    "flashruntime.service.auth": ("flashruntime.coordinator.auth", (
        "NodeAuthenticator", "OpenAuthenticator", "StaticTokenAuthenticator", "authenticator_from_env",
        "AuthConfigError", "resolve_identity", "Identity")),
    "flashruntime.service.modea": ("flashruntime.coordinator.expansion", (
        "expand_tasks", "ExpansionError", "ALLOWED_TASK_MODULES", "MAX_LEASE_SECONDS", "FEDAVG_WORKER_PARAM_KEYS",
        "FEDAVG_DRIVER_SUPPLIED_KEYS", "ClaimRequest", "CompleteRequest", "FailRequest")),
    "flashruntime.service.ledger": ("flashruntime.coordinator.ledger", ("Ledger",)),
    "flashruntime.service.settings": ("flashruntime.coordinator.settings", ("RuntimeSettings",)),
    "flashruntime.service.worker": ("flashruntime.agent", ("WorkerAgent", "main")),
    "flashruntime.service.cli": ("flashruntime.cli", ("main",)),
    "flashruntime.service.dashboard": ("flashruntime.coordinator.dashboard", ("DASHBOARD_HTML",)),
    "flashruntime.sqlite_database": ("flashruntime.db", ("SqliteDatabase", "has_table", "recorded_version")),
    "flashruntime.sqlite_errors": ("flashruntime.db", ("translate_sqlite_errors",)),
    "flashruntime.postgres_database": ("flashruntime.db", (
        "PostgresDatabase", "SessionLock", "is_retryable", "translate_postgres_errors")),
    "flashruntime.database_url": ("flashruntime.db.url", (
        "FORMS", "DatabaseURL", "mask_password", "parse_database_url", "sqlite_url")),
    "flashruntime.job_goodput": ("flashruntime.goodput", ("JobGoodput", "JobRecovery", "job_goodput",
                                                          "job_goodput_lines")),
    "flashruntime.local.run_dirs": ("flashruntime.run_dirs", ("RUNS_DIR_ENV", "new_run_dir", "runs_root")),
    "flashruntime.local.goodput": ("flashruntime.goodput.run", (
        "METRICS_FILE", "AttemptSteps", "GoodputLedger", "Recovery", "attempt_steps", "goodput_ledger",
        "ledger_lines", "ledger_of_run", "step_records")),
}


@pytest.mark.parametrize("old_path", sorted(COMPAT))
def test_compatibility_paths_import_the_same_objects(old_path: str) -> None:
    new_path, names = COMPAT[old_path]
    if old_path.endswith(".app"):
        pytest.importorskip("fastapi")
    old, new = importlib.import_module(old_path), importlib.import_module(new_path)
    different = [name for name in names if getattr(old, name) is not getattr(new, name)]
    assert not different, f"{old_path} re-exports other objects than {new_path}: {different}"


def test_the_service_app_compatibility_path_forwards_the_lazy_app(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi")
    import flashruntime.coordinator.app as app_module
    import flashruntime.service.app as compat

    monkeypatch.setitem(app_module._cached, "app", sentinel := object())
    assert compat.app is sentinel
