"""What a lease runs and with what environment: the command a payload names, whether this
worker may run it (runner, code-execution grant, submitter signature), and the task's
environment, built from an allowlist so a task never holds the worker's credentials.
Pure but for ``build_command`` preparing the task's own directories.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from flashruntime.agent.gang_command import gang_argv, gang_env, gang_of, rendezvous_host
from flashruntime.agent.inputs import LeaseDirs, TaskRefused
from flashruntime.agent.sandbox import Confinement, confine, prepare_task_dirs, task_home, task_tmp
from flashruntime.agent.signed_work import signature_problem
from flashruntime.protocol.task_modules import ALLOWED_TASK_MODULES
from flashruntime.protocol.v1alpha1 import Lease
from flashruntime.recovery.preemption import GRACE_ENV, SIGNAL_ENV
from flashruntime.signing import PublicKey

__all__ = ["CONTRACT_VARIABLES", "CREDENTIAL_VARIABLES", "INHERITED_PREFIXES", "INHERITED_VARIABLES",
           "LOADER_VARIABLES", "RUNNERS", "build_command", "child_env", "code_grant_problem", "is_credential_name",
           "is_loader_name"]

# subprocess: allowlisted task modules only; sandboxed: those and sandboxed-tier commands, in
# the bubblewrap sandbox; trusted: any command, sharing the filesystem and network.
RUNNERS = ("subprocess", "sandboxed", "trusted")
# The documented variables the agent sets in every task; a job's own env cannot replace them.
CONTRACT_VARIABLES = ("FLASHML_OUTPUT_DIR", "FLASHML_CKPT_DIR", "FLASHML_JOB_ID", "FLASHML_ATTEMPT_ID",
                      "FLASHML_TASK_ID", "FLASHML_INPUTS_FILE")
# What a task takes from the worker's own environment: the search paths (PYTHONPATH: where the
# worker's Python finds the task modules it runs), whether Python output is unbuffered (so a
# log streams as it is written), locale, terminal, and the GPU selection and driver libraries
# the machine needs, and the preemption notice the worker forwards (so the ranks catch the
# signal it sends and save within its grace). Nothing else: the worker's environment holds its credentials.
INHERITED_VARIABLES = ("PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "LANG", "LANGUAGE", "TZ", "TERM",
                       "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES",
                       "NVIDIA_DRIVER_CAPABILITIES", "LD_LIBRARY_PATH", SIGNAL_ENV, GRACE_ENV)
INHERITED_PREFIXES = ("LC_",)
# Credentials of workers and clients: never in a task's environment, from either side.
CREDENTIAL_VARIABLES = ("FLASHML_NODE_TOKEN", "FLASHML_NODE_TOKEN_FILE", "FLASHML_TOKEN", "FLASHML_JOIN_CODE")
_CREDENTIAL_SUFFIXES = ("_TOKEN", "_TOKENS", "_TOKEN_FILE", "_JOIN_CODE")
# What the C library and its dynamic loader act on before a program's own code runs: glibc
# drops these for set-user-ID programs. A job's env reaches the confinement's own launcher
# (bwrap, the task-user switch) outside or before the sandbox, so it may not set them.
LOADER_VARIABLES = ("GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
                    "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR")
_LOADER_PREFIXES = ("LD_", "MALLOC_")


def code_grant_problem(payload: Mapping[str, Any]) -> str | None:
    """Why a worker that authenticates to its coordinator must not run this ``argv`` payload,
    or None. Such a worker runs commands only for a submitter or operator whose token holds
    the code-execution permission, as the coordinator stamps it on every task
    (``submitted_by``): a job from a coordinator in open mode, or from one that stamps
    nothing, could have come from anyone."""
    grant = payload.get("submitted_by")
    if not isinstance(grant, Mapping):
        return ("the lease does not say who submitted its job, so nothing shows the submitter may run code; "
                "this worker authenticates with a token and runs commands only for submitters granted code "
                "execution (FLASHML_ARGV_SUBMITTERS on the coordinator)")
    role, name = grant.get("role"), grant.get("name")
    if role not in ("submitter", "operator"):
        return (f"the job was submitted by {role or 'nobody'!s} (a coordinator in open mode), so anyone could "
                "have sent this command; this worker authenticates with a token and runs commands only for "
                "submitters granted code execution (FLASHML_ARGV_SUBMITTERS on the coordinator)")
    if grant.get("may_run_code") is not True:
        return (f"{role} {name!r} does not hold the code-execution permission (FLASHML_ARGV_SUBMITTERS on the "
                "coordinator)")
    return None


def is_credential_name(name: str) -> bool:
    """Whether an environment variable's name is one of a worker's or client's credentials."""
    return name in CREDENTIAL_VARIABLES or (name.startswith("FLASHML_") and name.endswith(_CREDENTIAL_SUFFIXES))


def is_loader_name(name: str) -> bool:
    """Whether an environment variable's name is one the dynamic loader or C library acts on."""
    return name in LOADER_VARIABLES or name.startswith(_LOADER_PREFIXES)


def _payload_network(payload: Mapping[str, Any]) -> bool:
    isolation = payload.get("isolation")
    return isinstance(isolation, Mapping) and isolation.get("network") is True


def _payload_tier(payload: Mapping[str, Any]) -> str:
    isolation = payload.get("isolation")
    tier = isolation.get("tier") if isinstance(isolation, Mapping) else None
    return tier if isinstance(tier, str) and tier else "standard"


def build_command(payload: Mapping[str, Any], runner: str, dirs: LeaseDirs, *,
                  require_code_grant: bool = False,
                  confinement: Confinement | None = None,
                  trusted_submitter_keys: Mapping[str, PublicKey] | None = None,
                  coordinator_url: str | None = None,
                  node_addr: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, payload env) for the lease; ``TaskRefused`` when this agent must not run it.
    ``require_code_grant``: an ``argv`` payload must carry a code-execution grant
    (``code_grant_problem``); a worker that authenticates with a token sets it.
    ``confinement``: the argv returned is the final one, inside the worker's namespaces and
    as its task user (the task's home, temp and checkpoint directories are made ready).
    ``trusted_submitter_keys``: an ``argv`` payload must be signed by one of them, exactly as
    it is (``signature_problem``). ``coordinator_url``: where this agent reaches its
    coordinator, whose rendezvous store a multi-node job's node joins (``gang_command``), and
    ``node_addr`` the address the other nodes reach this one at."""
    sandboxed = confinement is not None and confinement.mode == "sandbox"
    argv, env = _task_command(payload, runner, dirs, require_code_grant=require_code_grant,
                              trusted_submitter_keys=trusted_submitter_keys, sandboxed=sandboxed)
    gang = gang_of(payload)
    if gang is not None:
        if "argv" not in payload:
            raise TaskRefused("payload gang is for a command (argv) task, and this one runs a module")
        if trusted_submitter_keys is not None:
            raise TaskRefused("this worker runs only signed work, and how a multi-node job's nodes meet (its "
                              "payload gang) is not covered by a signature; run multi-node jobs on workers "
                              "without --trusted-submitter-keys")
        if sandboxed and not _payload_network(payload):
            raise TaskRefused("a multi-node job's nodes reach each other and the coordinator's rendezvous store, "
                              "and this sandbox has no network; set isolation.network to true")
        if gang.checkpoint_dir is not None and sandboxed:
            raise TaskRefused(f"the job's shared checkpoint_dir {gang.checkpoint_dir!r} is outside this agent's "
                              "sandbox (--runner sandboxed); run multi-node jobs with a shared checkpoint_dir on "
                              "agents started with --runner trusted, or drop checkpoint_dir")
        argv = gang_argv(argv, gang, rendezvous_host(coordinator_url or ""), node_addr)
        env = {**env, **{name: value for name, value in gang_env(gang).items() if name != "FLASHML_CKPT_DIR"}}
    if confinement is None:
        prepare_task_dirs(dirs)
        return argv, env
    prepare_task_dirs(dirs, confinement.task_user, confinement.work_root)
    return confine(argv, dirs, payload, confinement), env


def _task_command(payload: Mapping[str, Any], runner: str, dirs: LeaseDirs, *, require_code_grant: bool,
                  sandboxed: bool, trusted_submitter_keys: Mapping[str, PublicKey] | None = None,
                  ) -> tuple[list[str], dict[str, str]]:
    if "module" in payload and "argv" in payload:
        raise TaskRefused("payload carries both 'module' and 'argv'; exactly one is expected")
    if "module" in payload:
        module = payload["module"]
        if not isinstance(module, str) or module not in ALLOWED_TASK_MODULES:
            raise TaskRefused(f"module {module!r} is not in ALLOWED_TASK_MODULES "
                              f"({', '.join(sorted(ALLOWED_TASK_MODULES))})")
        return [sys.executable, "-m", module, "--spec", str(dirs.spec_file), "--out", str(dirs.out)], {}
    if "argv" in payload:
        if runner == "sandboxed":
            if not sandboxed:
                raise TaskRefused("this agent (--runner sandboxed) has no working sandbox, so it runs no argv "
                                  "payloads")
            if _payload_tier(payload) != "sandboxed":
                raise TaskRefused(f"argv payloads of isolation tier {_payload_tier(payload)!r} run only on an agent "
                                  "started with --runner trusted; this agent (--runner sandboxed) runs commands of "
                                  "tier 'sandboxed'")
        elif runner != "trusted":
            raise TaskRefused(f"argv payloads run only on an agent started with --runner sandboxed (tier "
                              f"'sandboxed') or --runner trusted (this agent: --runner {runner})")
        if require_code_grant:
            problem = code_grant_problem(payload)
            if problem is not None:
                raise TaskRefused(f"refused to run the command: {problem}")
        if trusted_submitter_keys is not None:
            problem = signature_problem(payload, trusted_submitter_keys)
            if problem is not None:
                raise TaskRefused(f"refused to run the command: {problem}")
        argv = payload["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(token, str) for token in argv):
            raise TaskRefused(f"payload argv must be a non-empty list of strings, got {argv!r}")
        env = payload.get("env") or {}
        if not isinstance(env, dict):
            raise TaskRefused(f"payload env must be an object of name -> value, got {env!r}")
        credentials = sorted(str(key) for key in env if is_credential_name(str(key)))
        if credentials:
            # A task never holds a worker's or client's credential by those names, so a job
            # cannot make code inside it take one of its own values for the node's.
            raise TaskRefused(f"payload env sets {', '.join(credentials)}, a credential name the agent keeps out of "
                              "every task; pass the value under another name")
        loader = sorted(str(key) for key in env if is_loader_name(str(key)))
        if loader:
            # Taken from the job's env they would act on the sandbox's launcher, outside the sandbox.
            raise TaskRefused(f"payload env sets {', '.join(loader)}, which the C library's loader acts on before the "
                              "task is confined; set it inside the command instead (argv ['env', 'NAME=value', ...])")
        return list(argv), {str(key): str(value) for key, value in env.items()}
    raise TaskRefused("payload carries neither 'module' nor 'argv'")


def child_env(payload_env: Mapping[str, str], dirs: LeaseDirs, lease: Lease,
              environ: Mapping[str, str] = os.environ, *, checkpoint_dir: str | None = None) -> dict[str, str]:
    """A task's whole environment: from the worker's ``environ`` only ``INHERITED_VARIABLES``
    (and ``LC_*``), a ``HOME`` and ``TMPDIR`` inside the lease's directory, then the job's own
    ``payload_env``, then the contract variables, which therefore win. No credential name
    survives from either side. ``checkpoint_dir``: the ``FLASHML_CKPT_DIR`` of a multi-node
    job's node, shared by all of them, instead of this machine's own."""
    inherited = {name: value for name, value in environ.items()
                 if name in INHERITED_VARIABLES or name.startswith(INHERITED_PREFIXES)}
    inherited.setdefault("PATH", os.defpath)
    own = {name: value for name, value in payload_env.items() if not is_credential_name(name)}
    return {
        **inherited,
        "HOME": str(task_home(dirs)),
        "TMPDIR": str(task_tmp(dirs)),
        **own,
        "FLASHML_OUTPUT_DIR": str(dirs.out),
        "FLASHML_CKPT_DIR": checkpoint_dir or str(dirs.ckpt),
        "FLASHML_JOB_ID": lease.job_id,
        "FLASHML_ATTEMPT_ID": lease.lease_id,
        "FLASHML_TASK_ID": lease.task_id,
        "FLASHML_INPUTS_FILE": str(dirs.inputs_file),
    }
