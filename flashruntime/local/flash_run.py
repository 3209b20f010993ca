"""``flash.run``: carry out a planner ``StrategyPlan`` for the user's command.

The plan says how, the workload says what. ``local`` and ``coordinated_training`` plans
launch here through ``flash.submit`` (the latter under single-node torchrun with one rank
per planned worker); ``independent_tasks`` plans become a lease job POSTed to a coordinator.
The workload and JobSpec building are pure functions; ``run`` adds the launch or the POST.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flashruntime.client import CoordinatorClient
from flashruntime.errors import CoordinatorUnavailable
from flashruntime.integrations.pytorch import ddp
from flashruntime.local.submit import Run, submit
from flashruntime.protocol.plan_v1alpha1 import StrategyPlan
from flashruntime.protocol.v1alpha1 import ImageSpec, JobRecord, JobSpec, ResourcesSpec
from flashruntime.workloads.command import CommandWorkload, to_jobspec

__all__ = ["run"]

RUNTIME_API_ENV = "FLASHML_RUNTIME_API"
TOKEN_ENV = "FLASHML_TOKEN"
_TIMEOUT_S = 60.0
_LAUNCHER_TOKENS = ("torchrun", "accelerate")


def run(
    plan: StrategyPlan,
    coordinator_url: str | None = None,
    *,
    workload: CommandWorkload | None = None,
    command: str | list[str] | None = None,
    output_dir: str | Path | None = None,
    max_restarts: int = 0,
    wait: bool = True,
    watch: bool | None = None,
    image: ImageSpec | str | None = None,
    name: str | None = None,
    headers: dict[str, str] | None = None,
    pool: str | None = None,
    ledger: Any = None,
) -> Run | JobRecord:
    """Run ``workload`` (or ``command``) the way ``plan`` says: a local ``Run`` for ``local`` and
    ``coordinated_training`` plans, the coordinator's ``JobRecord`` for ``independent_tasks``.

    Arguments that the plan's mode does not use are ignored, so one call serves every plan:
    ``coordinator_url``, ``image``, ``name``, ``headers`` and ``pool`` matter only to
    ``independent_tasks``; ``output_dir``, ``max_restarts``, ``wait`` and ``watch`` only to the
    local modes. ``pool`` confines the job's tasks to the workers of that team pool
    (``placement.pool``); with ``isolation.allowFallback`` on the workload, that is what lets
    the bundled ``flashruntime worker --runner trusted --pools <pool>`` run them. Without an
    ``Authorization`` header in ``headers``, the token in ``FLASHML_TOKEN`` (if set) is sent:
    a coordinator with tokens configured takes jobs from submitters and operators only, and
    a command job only from one granted code execution.

    A local run that ends SUCCEEDED is recorded in the calibration ledger under the plan's key
    (``plan_key(plan.plan_id, plan.strategy_family, plan.workers)``): its median step time from
    the ``ts`` of its ``metrics.jsonl`` records and the largest ``peak_vram_gb`` they carry, so
    ``flash.plan(request, ledger=...)`` for the same request uses them. ``ledger`` is a
    ``CalibrationLedger`` or a path; None takes ``default_ledger_path()``
    (``$FLASHML_CALIBRATION_LEDGER``, else ``calibration.sqlite`` under the runs root) unless
    that variable is ``off``; False records nothing.
    """
    if plan is None:
        raise ValueError("run() got plan=None: the planner selected nothing; read report.no_valid_strategy_hint")
    if not isinstance(plan, StrategyPlan):
        raise TypeError(f"run() takes a StrategyPlan (e.g. flash.plan(request).selected), got {type(plan).__name__}")
    chosen = plan_workload(plan, workload=workload, command=command)
    if plan.workload_mode in ("coordinated_training", "local"):
        launched = (coordinated_workload(plan, chosen) if plan.workload_mode == "coordinated_training"
                    else chosen.model_copy(update={"mode": "local"}))
        target = calibration_ledger(ledger)
        key = None if target is None else _plan_key(plan)
        return submit(launched, output_dir=output_dir, wait=wait, max_restarts=max_restarts, watch=watch,
                      ledger=target, plan_key=key)
    if plan.workload_mode != "independent_tasks":
        raise ValueError(
            f"plan {plan.plan_id} has workload_mode={plan.workload_mode!r}; flash.run carries out 'local', "
            "'coordinated_training' and 'independent_tasks' plans"
        )
    url = resolve_coordinator_url(coordinator_url, os.environ)
    return post_job(url, independent_jobspec(plan, chosen, name=name, image=image, pool=pool),
                    with_env_token(headers, os.environ))


def calibration_ledger(ledger: Any) -> Any:
    """The ledger a plan's run is recorded into: ``ledger`` itself, a ``CalibrationLedger`` at
    a path, the default one for None (None when ``$FLASHML_CALIBRATION_LEDGER`` is off), or
    None for False."""
    if ledger is False:
        return None
    from flashruntime.profiling.calibration import CalibrationLedger, ledger_disabled

    if isinstance(ledger, CalibrationLedger):
        return ledger
    if ledger is None or ledger is True:
        return None if ledger_disabled() else CalibrationLedger()
    if isinstance(ledger, (str, os.PathLike)):
        return CalibrationLedger(ledger)
    raise TypeError(f"ledger must be a CalibrationLedger, a path, None (the default ledger) or False (record "
                    f"nothing), got {type(ledger).__name__}")


def _plan_key(plan: StrategyPlan) -> str:
    from flashruntime.profiling.calibration import plan_key

    return plan_key(plan.plan_id, plan.strategy_family, plan.workers)


def with_env_token(headers: Mapping[str, str] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer $FLASHML_TOKEN`` when they carry none and the
    variable is set (and not blank)."""
    merged = dict(headers or {})
    token = environ.get(TOKEN_ENV, "").strip()
    if token and not any(name.lower() == "authorization" for name in merged):
        merged["Authorization"] = f"Bearer {token}"
    return merged


def plan_workload(
    plan: StrategyPlan, *, workload: CommandWorkload | None = None, command: str | list[str] | None = None
) -> CommandWorkload:
    """Exactly one of ``workload`` / ``command``; the plan's checkpoint policy fills a workload
    without one (a copy: the caller's workload is never changed)."""
    if (workload is None) == (command is None):
        raise ValueError(
            "run() needs exactly one of workload=CommandWorkload(...) or command='python train.py' "
            f"(got {'both' if workload is not None else 'neither'}): the plan says how to run, not what"
        )
    if workload is None:
        workload = CommandWorkload(command=command)  # type: ignore[arg-type]
    elif not isinstance(workload, CommandWorkload):
        raise TypeError(f"workload must be a CommandWorkload, got {type(workload).__name__}")
    if workload.checkpoint is None and plan.checkpoint is not None:
        return workload.model_copy(update={"checkpoint": plan.checkpoint.model_copy(deep=True)})
    return workload


def coordinated_workload(plan: StrategyPlan, workload: CommandWorkload) -> CommandWorkload:
    """``workload`` under single-node torchrun with ``plan.workers`` ranks (pure)."""
    if not plan.colocated:
        raise ValueError(
            f"plan {plan.plan_id} spans several hosts (colocated=False, {plan.workers} workers); flash.run launches "
            "on this host only. On every host, submit integrations.pytorch.ddp(script, nproc_per_node=<ranks per "
            "host>, nnodes=..., rdzv_endpoint='host:port') with flash.submit"
        )
    if plan.workers < 1:
        raise ValueError(f"plan {plan.plan_id} has workers={plan.workers}; a coordinated plan needs workers >= 1")
    argv = workload.argv()
    carried: dict[str, str] = {}
    if argv and argv[0] in ("python", "python3", sys.executable):
        argv, carried = _interpreter_options(argv[1:], workload.command, workload.env)
    if not argv:
        raise ValueError(f"command {workload.command!r} names no script; pass e.g. command='python train.py'")
    if argv[0] in _LAUNCHER_TOKENS:
        raise ValueError(
            f"command {workload.command!r} already starts {argv[0]}; give the bare script (e.g. 'python train.py') "
            f"and the plan supplies the launcher with nproc_per_node={plan.workers}"
        )
    wrapped = ddp(argv[0], nproc_per_node=plan.workers, script_args=shlex.join(argv[1:]))
    env = {**workload.env, **carried, "FLASHML_PLAN_ID": plan.plan_id, "FLASHML_STRATEGY_FAMILY": plan.strategy_family}
    return workload.model_copy(update={"command": wrapped.argv(), "env": env, "mode": "coordinated"})


# python's own options, which torchrun cannot take: each is carried to the ranks (and to
# torchrun itself) by the environment variable with the same effect, or dropped where it
# has none outside an interactive session; any other one is refused.
_FLAG_ENV: dict[str, tuple[str, str] | None] = {
    "u": ("PYTHONUNBUFFERED", "1"), "B": ("PYTHONDONTWRITEBYTECODE", "1"), "s": ("PYTHONNOUSERSITE", "1"),
    "d": ("PYTHONDEBUG", "1"), "v": ("PYTHONVERBOSE", "1"), "P": ("PYTHONSAFEPATH", "1"), "q": None, "R": None,
}
_X_ENV = {"dev": "PYTHONDEVMODE", "utf8": "PYTHONUTF8", "faulthandler": "PYTHONFAULTHANDLER",
          "importtime": "PYTHONPROFILEIMPORTTIME", "tracemalloc": "PYTHONTRACEMALLOC",
          "pycache_prefix": "PYTHONPYCACHEPREFIX", "warn_default_encoding": "PYTHONWARNDEFAULTENCODING",
          "int_max_str_digits": "PYTHONINTMAXSTRDIGITS"}


def _interpreter_options(
    args: list[str], command: str | list[str], env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """Split python's options off ``args`` (what followed the interpreter): returns the
    script onward (``-m module`` kept: torchrun takes it the same way) and the environment
    carrying the options' effect. ``ValueError`` for an option that cannot be carried (pure)."""
    carried: dict[str, str] = {}
    filters: list[str] = []
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "-":
        token = args[index]
        if token == "--":
            index += 1
            break
        if token.startswith("--"):
            raise _option_error(token, command)
        for position, letter in enumerate(token[1:], start=1):
            if letter in "WXcm":  # takes a value: the rest of the token, else the next argument
                value = token[position + 1:]
                if not value:
                    index += 1
                    if index == len(args):
                        raise ValueError(f"command {command!r}: python's option -{letter} needs a value")
                    value = args[index]
                if letter == "m":
                    return ["-m", value, *args[index + 1:]], _with_filters(carried, filters, env)
                if letter == "c":
                    raise ValueError(f"command {command!r} runs code given with -c; torchrun launches a script or "
                                     "a module: put the code in a file, e.g. command='python train.py'")
                if letter == "W":
                    filters.append(value)
                else:
                    carried.update(_x_option(value, command))
                break
            if letter == "O":  # -O, -OO: one optimisation level each
                carried["PYTHONOPTIMIZE"] = str(int(carried.get("PYTHONOPTIMIZE", "0")) + 1)
            elif letter not in _FLAG_ENV:
                raise _option_error(f"-{letter}", command)
            elif (setting := _FLAG_ENV[letter]) is not None:
                carried[setting[0]] = setting[1]
        index += 1
    return args[index:], _with_filters(carried, filters, env)


def _x_option(value: str, command: str | list[str]) -> dict[str, str]:
    name, has_setting, setting = value.partition("=")
    if name not in _X_ENV:
        raise _option_error(f"-X {value}", command)
    return {_X_ENV[name]: setting if has_setting else "1"}


def _with_filters(carried: dict[str, str], filters: list[str], env: Mapping[str, str]) -> dict[str, str]:
    if filters:  # -W filters come after PYTHONWARNINGS' ones, as on a command line
        carried["PYTHONWARNINGS"] = ",".join([*filter(None, [env.get("PYTHONWARNINGS", "")]), *filters])
    return carried


def _option_error(option: str, command: str | list[str]) -> ValueError:
    return ValueError(
        f"command {command!r} gives python the option {option}, which cannot be carried to the ranks torchrun "
        "starts (each runs the script with an interpreter of its own); drop it, or set the matching PYTHON* "
        "variable in the workload's env"
    )


def resolve_coordinator_url(argument: str | None, environ: Mapping[str, str]) -> str:
    """The coordinator's base URL: ``argument``, else ``environ[FLASHML_RUNTIME_API]`` (pure)."""
    url = argument if argument is not None else environ.get(RUNTIME_API_ENV) or None
    if url is None:
        raise ValueError(
            "an independent_tasks plan runs on a coordinator: pass coordinator_url='http://host:8000' "
            f"or set {RUNTIME_API_ENV}"
        )
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"coordinator URL must be an http(s) URL such as 'http://host:8000', got {url!r}")
    return url.rstrip("/")


def _image_spec(image: ImageSpec | str | None) -> ImageSpec | None:
    if image is None or isinstance(image, ImageSpec):
        return image
    if not isinstance(image, str):
        raise TypeError(f"image must be an ImageSpec or 'repository:tag', got {type(image).__name__}")
    repository, sep, tag = image.rpartition(":")
    if "@" in image or not sep or not repository or "/" in tag:
        raise ValueError(f"image {image!r} is not 'repository:tag'; write e.g. 'ghcr.io/acme/train:1.2'")
    return ImageSpec(repository=repository, tag=tag)


def independent_jobspec(
    plan: StrategyPlan, workload: CommandWorkload, *, name: str | None = None, image: ImageSpec | str | None = None,
    pool: str | None = None,
) -> JobSpec:
    """The lease job for an ``independent_tasks`` plan (pure)."""
    if pool is not None and (not isinstance(pool, str) or not pool.strip()):
        raise ValueError(f"pool must be a team pool id such as 'team-7', or None for any worker; got {pool!r}")
    job_name = name if name is not None else "plan-" + plan.plan_id[3:]
    spec = to_jobspec(workload.model_copy(update={"mode": "independent_tasks"}), job_name, _image_spec(image))
    if pool is not None:
        spec.spec.placement.pool = pool
    current = spec.spec.resources
    spec.spec.resources = ResourcesSpec(
        minimumWorkers=1,
        maximumWorkers=max(1, plan.workers),
        cpuPerTask=current.cpuPerTask,
        memoryPerTask=current.memoryPerTask,
        gpuPerTask=plan.gpus_per_worker,
    )
    return spec


def post_job(url: str, spec: JobSpec, headers: Mapping[str, str] | None = None) -> JobRecord:
    """``POST <url>/v1alpha1/jobs`` → the coordinator's ``JobRecord``. An HTTP error status
    raises ``CoordinatorHTTPError`` (a ``RuntimeError``); an unreachable coordinator
    ``CoordinatorUnavailable``."""
    client = CoordinatorClient(url, headers=headers, timeout_s=_TIMEOUT_S)
    try:
        answer = client.submit_job(spec.model_dump(mode="json"))
    except CoordinatorUnavailable as exc:
        raise CoordinatorUnavailable(
            f"coordinator at {url} is unreachable ({exc}); check coordinator_url or {RUNTIME_API_ENV}"
        ) from exc
    return JobRecord.model_validate(answer)
