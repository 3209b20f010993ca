"""The ``command`` recipe: the user's own argv, fanned out over ``task_params``.

Argv tasks run without a container on volunteer machines only in narrow cases, so
expansion refuses, in this order: the sandbox waiver outside a team pool, a
non-sandboxed tier without the coordinator's opt-in, then malformed parameters.
Importing this module registers ``CommandRecipe``.
"""

from __future__ import annotations

import copy
import os
import re
import string
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from flashruntime.protocol.gang import (
    DEFAULT_LAST_CALL_S,
    GANG_KEY,
    MAX_GANG_NODES,
    MAX_GANG_RESTARTS,
    MAX_LAST_CALL_S,
    MAX_NPROC_PER_NODE,
    Gang,
)
from flashruntime.protocol.lease_rules import (
    DEFAULT_LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    bounded_lease_seconds,
)
from flashruntime.protocol.v1alpha1 import JobSpec, TaskSpec
from flashruntime.recipes.base import WorkloadRecipe, lease_task, output_prefix, register_recipe

__all__ = ["CommandRecipe"]

# Coordinator environment variable; "1" admits command jobs whose tier is not "sandboxed".
_ALLOW_UNSANDBOXED_ENV = "FLASHML_ALLOW_UNSANDBOXED_ARGV"

_ARTIFACT_SCHEME = "artifact://"
_FORMATTER = string.Formatter()
_PLACEHOLDER_ERRORS = (KeyError, IndexError, ValueError, AttributeError, TypeError)
# The largest width or precision a placeholder's format spec may ask for: enough for any
# zero-padded index or printed number, too little to grow a token without bound.
MAX_FORMAT_NUMBER = 1000
# A task's argv and env together: Linux's execve takes at most ARG_MAX (2 MiB with the default
# 8 MiB stack) of both, so no task over this can start anyway.
MAX_TASK_ARGV_ENV_BYTES = 2 * 1024 * 1024
# All tasks of one job together: placeholders repeat a value, so a small body could otherwise
# make the coordinator store (and serve on every claim) far more than it received.
MAX_JOB_ARGV_ENV_BYTES = 64 * 1024 * 1024


def _given(params: Mapping[str, Any], key: str, default: Any) -> Any:
    """A parameter's value; absent and ``None`` both mean "not set"."""
    value = params.get(key)
    return default if value is None else value


def _input_name_problem(name: object) -> str | None:
    """Input names become file names under the worker's ``inputs/``: plain names only."""
    if not isinstance(name, str) or not name:
        return f"input name {name!r} must be a non-empty string"
    if "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        return f"input name {name!r} must be a plain file name (no '/', '\\\\', '.' or '..'), e.g. 'dataset'"
    return None


def _inputs_problems(inputs: object) -> list[str]:
    if not isinstance(inputs, dict):
        return [f"parameters.inputs must be a mapping of input name to artifact:// URI, got {type(inputs).__name__}"]
    problems = []
    for name, uri in inputs.items():
        name_problem = _input_name_problem(name)
        if name_problem is not None:
            problems.append(f"parameters.inputs: {name_problem}")
        if not isinstance(uri, str) or not uri.startswith(_ARTIFACT_SCHEME) or uri == _ARTIFACT_SCHEME:
            problems.append(
                f"parameters.inputs[{name!r}] is {uri!r}; inputs must be artifact:// URIs "
                "(e.g. 'artifact://datasets/train.csv')"
            )
    return problems


def _env_problems(env: object) -> list[str]:
    if not isinstance(env, dict):
        return [f"parameters.env must be a mapping of variable name to string value, got {type(env).__name__}"]
    problems = []
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name:
            problems.append(f"parameters.env: variable name {name!r} must be a non-empty string without '='")
        if not isinstance(value, str):
            problems.append(
                f"parameters.env[{name!r}] is {value!r}; environment values must be strings (e.g. '1')"
            )
    return problems


def _format(template: str, values: Mapping[str, Any] | None, task_index: int, where: str) -> str:
    """``template.format_map(values)``, after refusing what an untrusted template could abuse.

    Any submitter can send a command job (POST /v1alpha1/jobs needs no token in open mode),
    so a field may not read an attribute (``{x.__class__}`` renders the coordinator's own
    objects), nest a field in its format spec, or ask for a width or precision over
    ``MAX_FORMAT_NUMBER`` (``{x:>20000000}`` grows a token without bound). Everything else
    ``str.format`` does is kept: specs such as ``{lr:.3g}`` or ``{i:05d}``, conversions, and
    indexing such as ``{xs[0]}`` or ``{cfg[lr]}``."""
    if values is None:
        return template  # no task_params: tokens are taken verbatim
    keys = sorted(map(str, values))
    try:
        fields = [(field, spec) for _, field, spec, _ in _FORMATTER.parse(template) if field is not None]
    except ValueError as exc:  # a lone '{' or '}'
        fields, parse_error = [], exc
    else:
        parse_error = None
    for field, spec in fields:
        problem = _unsafe_field(field, spec or "")
        if problem is not None:
            raise ValueError(
                f"task {task_index}: placeholder in {where} {template!r} is not allowed: {problem}; a placeholder "
                "names a task_params key, optionally indexed ('{xs[0]}', '{cfg[lr]}'), with an optional conversion "
                f"and a format spec whose widths and precisions are at most {MAX_FORMAT_NUMBER} ('{{lr:.3g}}', "
                "'{i:05d}'); write literal braces as '{{' and '}}'"
            )
    try:
        if parse_error is not None:
            raise parse_error
        return template.format_map(values)
    except _PLACEHOLDER_ERRORS as exc:
        detail = f"no value for {exc}" if isinstance(exc, KeyError) else str(exc) or type(exc).__name__
        raise ValueError(
            f"task {task_index}: placeholder in {where} {template!r} cannot be filled from "
            f"task_params[{task_index}] (keys: {keys}): {detail}; "
            "add the missing key to that parameter set, or write literal braces as '{{' and '}}'"
        ) from None


def _unsafe_field(field: str, spec: str) -> str | None:
    """Why the replacement field ``{field:spec}`` may not be filled, or None."""
    depth = 0
    for char in field:  # '.' outside brackets is attribute access; inside, part of an index key
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "." and depth == 0:
            return f"{{{field}}} reads an attribute"
    if "{" in spec or "}" in spec:
        return f"{{{field}:{spec}}} takes part of its format spec from another field"
    too_big = [number for number in re.findall(r"\d+", spec) if int(number) > MAX_FORMAT_NUMBER]
    if too_big:
        return f"{{{field}:{spec}}} asks for a width or precision of {too_big[0]}"
    return None


def _argv_env_bytes(argv: list[str], env: Mapping[str, str]) -> int:
    """What ``execve`` copies for this argv and env: each string, its NUL, and ``=``."""
    return sum(len(token.encode("utf-8", "surrogatepass")) + 1 for token in argv) + sum(
        len(name.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass")) + 2
        for name, value in env.items()
    )


def command_task_id(index: int) -> str:
    """The id of a command job's task for ``task_params[index]``."""
    return f"task-{index:03d}"


def node_task_id(index: int) -> str:
    """The id of a multi-node job's task for node slot ``index``."""
    return f"node-{index:03d}"


def fill_task(command: list[str], env: Mapping[str, str], values: Mapping[str, Any] | None,
              index: int) -> tuple[list[str], dict[str, str]]:
    """Task ``index``'s argv and env: the templates filled from its parameter set ``values``
    (None: no ``task_params``, taken verbatim). A worker checking signed work fills them the
    same way. ``ValueError`` when a placeholder cannot or may not be filled."""
    argv = [_format(token, values, index, "argv token") for token in command]
    task_env = {name: _format(value, values, index, f"env {name}") for name, value in env.items()}
    return argv, task_env


def _signature_problems(signature: object, task_count: int | None) -> list[str]:
    """A ``parameters.signature`` must be a ``WorkSignature`` with one signature per task."""
    from pydantic import ValidationError

    from flashruntime.protocol.signed_work import WorkSignature

    try:
        parsed = WorkSignature.model_validate(signature)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the object)"
        return [(f"parameters.signature.{where}: {first['msg']}; sign the job with 'flashruntime submit-spec "
                 "--sign-key' (or flashruntime.signing.sign_job_spec) instead of writing the signature by hand")]
    if task_count is not None and len(parsed.task_signatures) != task_count:
        return [(f"parameters.signature holds {len(parsed.task_signatures)} task signatures for {task_count} "
                 "tasks; sign the job again after changing task_params")]
    return []


def _signed_task(signature: Mapping[str, Any], index: int, count: int, command: list[str],
                 env: Mapping[str, str], values: Mapping[str, Any] | None) -> dict[str, Any]:
    """``payload.signed_work`` of task ``index``: the stored signature's fields, unchanged,
    with what the task's signature covers besides its payload."""
    return {
        **{key: signature[key] for key in ("format", "key_id", "submitter", "job_name", "nonce")},
        "task_index": index, "task_count": count, "command": list(command), "env": dict(env),
        "params": copy.deepcopy(values), "signature": signature["task_signatures"][index],
    }


class CommandRecipe(WorkloadRecipe):
    """``workload.type == "command"``: one argv task per ``task_params`` entry (or one task)."""

    kind = "command"
    task_module = ""

    def validate_params(self, params: Mapping[str, Any]) -> list[str]:
        if not isinstance(params, Mapping):
            return [f"workload.parameters must be a mapping, got {type(params).__name__}"]
        problems: list[str] = []
        command = params.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(token, str) for token in command):
            problems.append(
                f"parameters.command is {command!r}; it must be a non-empty list of strings, "
                "e.g. ['python', 'train.py', '--lr', '{lr}']"
            )
        if params.get("env") is not None:
            problems.extend(_env_problems(params["env"]))
        inputs = _given(params, "inputs", {})
        problems.extend(_inputs_problems(inputs))
        task_params = params.get("task_params")
        if task_params is not None:
            if not isinstance(task_params, list):
                problems.append(
                    f"parameters.task_params must be a list of dicts (one per task), got {type(task_params).__name__}"
                )
            else:
                problems.extend(
                    f"parameters.task_params[{i}] is {entry!r}; every entry must be a dict of placeholder values"
                    for i, entry in enumerate(task_params)
                    if not isinstance(entry, dict)
                )
        if params.get("unpack_inputs") is not None:
            problems.extend(_unpack_problems(params["unpack_inputs"], inputs))
        if params.get("workdir") is not None:
            problems.extend(_workdir_problems(params["workdir"], params.get("unpack_inputs")))
        problems.extend(_gang_problems(params))
        if params.get("signature") is not None:
            problems.extend(_signature_problems(params["signature"], self.task_count(params)))
        return problems

    def task_count(self, params: Mapping[str, Any]) -> int | None:
        """One task per ``task_params`` entry, one per node of a multi-node job, or one task."""
        task_params = params.get("task_params") if isinstance(params, Mapping) else None
        if task_params is None:
            nodes = params.get("nodes") if isinstance(params, Mapping) else None
            if nodes is None:
                return 1
            most = nodes.get("max") if isinstance(nodes, Mapping) else None
            return most if isinstance(most, int) and not isinstance(most, bool) and most >= 1 else None
        return len(task_params) if isinstance(task_params, list) else None

    def expand(self, job_id: str, spec: JobSpec) -> list[TaskSpec]:
        return list(self.iter_tasks(job_id, spec))

    def iter_tasks(self, job_id: str, spec: JobSpec) -> Iterator[TaskSpec]:
        """The tasks one at a time, each built only when asked for; the refusals of the
        parameters come with the first."""
        inner = spec.spec
        isolation, pool = inner.isolation, inner.placement.pool
        # 1. The waiver is acceptable only inside a team pool, to which gate 7 confines the task.
        if isolation.allowFallback and pool == "any":
            raise ValueError(
                "isolation.allowFallback is true but placement.pool is 'any': the sandbox waiver is accepted "
                "only inside a team pool; set placement.pool to your team pool id, or set allowFallback to false"
            )
        # 2. Unsandboxed argv needs the operator's opt-in, read now rather than at import.
        if isolation.tier != "sandboxed" and os.environ.get(_ALLOW_UNSANDBOXED_ENV) != "1":
            raise ValueError(
                f"command jobs need isolation.tier 'sandboxed' (got {str(isolation.tier)!r}); set the tier to "
                f"'sandboxed', or have the coordinator's operator set {_ALLOW_UNSANDBOXED_ENV}=1 to admit "
                "unsandboxed argv"
            )
        # 3. Parameter shapes.
        params = inner.workload.parameters
        problems = self.validate_params(params)
        if problems:
            raise ValueError("; ".join(problems))
        try:
            lease_seconds = bounded_lease_seconds(params.get("lease_seconds"), DEFAULT_LEASE_SECONDS)
        except ValueError as exc:
            raise ValueError(
                f"parameters.{exc}; give a number of seconds >= {MIN_LEASE_SECONDS:g} (values above {MAX_LEASE_SECONDS} are capped)"
            ) from None
        # A multi-node job's nodes must be able to run on some worker: a sandboxed one needs the
        # network, and sees no shared checkpoint directory, which only trusted workers (the waiver) do.
        if params.get("nodes") is not None and not isolation.allowFallback:
            if isolation.tier == "sandboxed" and not isolation.network:
                raise ValueError("a multi-node job's nodes reach each other and the coordinator's rendezvous store, "
                                 "which a sandboxed worker allows only with isolation.network: true; set it, or set "
                                 "isolation.allowFallback with a team pool for trusted workers")
            if params.get("checkpoint_dir") is not None and isolation.tier == "sandboxed":
                raise ValueError("parameters.checkpoint_dir is a path outside every sandbox: only trusted workers "
                                 "run a multi-node job with it; set isolation.allowFallback with a team pool, or drop "
                                 "checkpoint_dir")
        # 4. One task per parameter set.
        command: list[str] = params["command"]
        env: dict[str, str] = _given(params, "env", {})
        common = _common_payload(params, spec)
        job_bytes = 0
        signature = params.get("signature")
        gang = _gang_of(job_id, params)
        parameter_sets = params.get("task_params") or [None] * (1 if gang is None else gang.max_nodes)
        for i, values in enumerate(parameter_sets):
            task_id = command_task_id(i) if gang is None else node_task_id(i)
            argv, task_env = fill_task(command, env, values, i)
            task_bytes = _argv_env_bytes(argv, task_env)
            if task_bytes > MAX_TASK_ARGV_ENV_BYTES:
                raise ValueError(
                    f"task {i}: its argv and env come to {task_bytes} bytes once filled from task_params[{i}], "
                    f"more than the {MAX_TASK_ARGV_ENV_BYTES} a task may have (no worker could start it); "
                    "pass large values as an input artifact (parameters.inputs) instead"
                )
            job_bytes += task_bytes
            if job_bytes > MAX_JOB_ARGV_ENV_BYTES:
                raise ValueError(
                    f"the argv and env of tasks 0..{i} come to {job_bytes} bytes, more than the "
                    f"{MAX_JOB_ARGV_ENV_BYTES} one job's tasks may have together; pass large values as an input "
                    "artifact (parameters.inputs), or split the job"
                )
            payload: dict[str, Any] = {
                "argv": argv,
                "env": task_env,
                "inputs": dict(_given(params, "inputs", {})),
                "output_prefix": output_prefix(job_id, task_id),
                "task_id": task_id,
                **copy.deepcopy(common),
            }
            if gang is not None:
                payload[GANG_KEY] = gang.model_dump(exclude_none=True)
            if signature is not None:
                payload["signed_work"] = _signed_task(signature, i, len(parameter_sets), command, env, values)
            yield lease_task(job_id, task_id, spec, payload, lease_seconds)

    def validate_output(self, metrics: Mapping[str, Any]) -> None:
        if not isinstance(metrics, Mapping):
            raise ValueError(
                f"metrics.json must hold a JSON object, got {type(metrics).__name__}; write e.g. {{\"loss\": 0.1}}"
            )
        bad = [key for key in metrics if not isinstance(key, str)]
        if bad:
            raise ValueError(f"metrics.json keys must be strings, got {bad!r}")


_LAUNCHER_TOKENS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate")
_GANG_ONLY = ("nproc_per_node", "max_restarts", "checkpoint_dir", "last_call_s")


def _names_a_launcher(token: str) -> bool:
    """Whether an argv token starts a launcher: its name, or a shell line that runs one."""
    words = token.replace(";", " ").replace("&", " ").split()
    return any(word.rsplit("/", 1)[-1] in _LAUNCHER_TOKENS for word in words)


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _gang_problems(params: Mapping[str, Any]) -> list[str]:
    """What is wrong with a multi-node job's ``nodes`` and the parameters that go with it."""
    nodes = params.get("nodes")
    if nodes is None:
        given = [key for key in _GANG_ONLY if params.get(key) is not None]
        return [f"parameters.{key} is for a multi-node job; add parameters.nodes = {{'min': 1, 'max': 2}} or "
                "drop it" for key in given]
    example = "e.g. {'min': 1, 'max': 2}"
    if not isinstance(nodes, Mapping) or set(nodes) != {"min", "max"}:
        return [f"parameters.nodes is {nodes!r:.120}; it must be {{'min': MIN, 'max': MAX}}, {example}"]
    low, high = nodes["min"], nodes["max"]
    problems = []
    if not (_whole(low, 1, MAX_GANG_NODES) and _whole(high, 1, MAX_GANG_NODES) and low <= high):
        problems.append(f"parameters.nodes is {dict(nodes)!r}; min and max must be whole numbers with "
                        f"1 <= min <= max <= {MAX_GANG_NODES}, {example}")
    if params.get("task_params") is not None:
        problems.append("parameters.nodes and parameters.task_params cannot go together: a multi-node job is one "
                        "training run over several nodes; submit the parameter sets as separate jobs")
    command = params.get("command")
    if isinstance(command, list) and any(isinstance(token, str) and _names_a_launcher(token) for token in command):
        problems.append("parameters.command starts a launcher (torchrun, torch.distributed.run or accelerate); with "
                        "parameters.nodes give the command of one rank (e.g. ['python', 'train.py']): each node "
                        "runs it under torchrun --nnodes=MIN:MAX itself")
    if params.get("signature") is not None:
        problems.append("a multi-node job cannot be signed: how its nodes meet is the coordinator's to say, which "
                        "a submitter's signature cannot cover; submit it unsigned to workers that run unsigned work")
    nproc = params.get("nproc_per_node")
    if nproc is not None and not _whole(nproc, 1, MAX_NPROC_PER_NODE):
        problems.append(f"parameters.nproc_per_node is {nproc!r}; give the ranks each node runs, a whole number "
                        f"from 1 to {MAX_NPROC_PER_NODE}")
    restarts = params.get("max_restarts")
    if restarts is not None and not _whole(restarts, 0, MAX_GANG_RESTARTS):
        problems.append(f"parameters.max_restarts is {restarts!r}; give how many failures of the group torchrun "
                        f"restarts it after, a whole number from 0 to {MAX_GANG_RESTARTS}")
    last_call = params.get("last_call_s")
    if last_call is not None and not _whole(last_call, 1, MAX_LAST_CALL_S):
        problems.append(f"parameters.last_call_s is {last_call!r}; give the seconds a rendezvous waits for more "
                        f"nodes once min are in, a whole number from 1 to {MAX_LAST_CALL_S}")
    directory = params.get("checkpoint_dir")
    if directory is not None and not (isinstance(directory, str) and directory.startswith("/")
                                      and "\x00" not in directory and len(directory) <= 4096):
        problems.append(f"parameters.checkpoint_dir is {directory!r:.120}; give an absolute path every node sees "
                        "(a shared file system), e.g. '/shared/checkpoints/run-1'")
    return problems


def _gang_of(job_id: str, params: Mapping[str, Any]) -> Gang | None:
    """The ``gang`` of every node's task of a (validated) multi-node job, or None."""
    nodes = params.get("nodes")
    if nodes is None:
        return None
    return Gang(run_id=job_id, min_nodes=nodes["min"], max_nodes=nodes["max"],
                nproc_per_node=_given(params, "nproc_per_node", 1), max_restarts=_given(params, "max_restarts", 3),
                checkpoint_dir=params.get("checkpoint_dir"),
                last_call_s=_given(params, "last_call_s", DEFAULT_LAST_CALL_S))


def _unpack_problems(unpack: object, inputs: object) -> list[str]:
    if not isinstance(unpack, list) or not all(isinstance(name, str) for name in unpack):
        return [f"parameters.unpack_inputs is {unpack!r}; it must be a list of input names, e.g. ['dataset']"]
    problems = []
    duplicates = sorted(name for name, times in Counter(unpack).items() if times > 1)
    if duplicates:
        problems.append(f"parameters.unpack_inputs names {duplicates} more than once; list each input once")
    declared = inputs if isinstance(inputs, dict) else {}
    undeclared = [name for name in dict.fromkeys(unpack) if name not in declared]
    if undeclared:
        problems.append(
            f"parameters.unpack_inputs names {undeclared}, which are not declared in 'inputs' (parameters.inputs "
            f"declares {sorted(map(str, declared))}); declare them there or remove them"
        )
    return problems


def _workdir_problems(workdir: object, unpack: object) -> list[str]:
    """``parameters.workdir`` names the unpacked input the command runs in (its source directory)."""
    unpacked = unpack if isinstance(unpack, list) else []
    if not isinstance(workdir, str) or workdir not in unpacked:
        return [(f"parameters.workdir is {workdir!r}; it must name an input listed in parameters.unpack_inputs "
                 f"(an archive the worker unpacks; listed: {sorted(map(str, unpacked))}), e.g. 'source'")]
    return []


def _common_payload(params: Mapping[str, Any], spec: JobSpec) -> dict[str, Any]:
    """The payload keys every task of the job shares; optional keys only when set."""
    inner = spec.spec
    payload: dict[str, Any] = {
        "isolation": {"tier": str(inner.isolation.tier), "allowFallback": inner.isolation.allowFallback},
    }
    if inner.isolation.network:  # only when asked: a payload without it is the one workers always got
        payload["isolation"]["network"] = True
    if inner.image is not None:  # for container agents; the bundled worker ignores it
        payload["image"] = inner.image.reference
    if params.get("checkpoint") is not None:
        payload["checkpoint"] = params["checkpoint"]
    if params.get("unpack_inputs") is not None:
        payload["unpack_inputs"] = list(params["unpack_inputs"])
    if params.get("workdir") is not None:
        payload["workdir"] = params["workdir"]
    local_inputs = params.get("local_inputs")
    if local_inputs is not None:
        # A non-list is stamped unchanged: gate 4 then refuses it on every node (fail-closed).
        payload["local_inputs"] = list(local_inputs) if isinstance(local_inputs, list) else local_inputs
    gpus = int(inner.resources.gpuPerTask)
    if gpus:
        payload["gpus"] = gpus
    if inner.placement.pool != "any":
        payload["pool"] = inner.placement.pool
    return payload


register_recipe(CommandRecipe())
