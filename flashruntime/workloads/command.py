"""The user's own command as a workload: what to run, where its source lives, what
to collect, and how to fan it out over parameter sets. Never run through a shell.
"""

from __future__ import annotations

import re
import shlex
import string
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flashruntime.protocol.plan_v1alpha1 import CheckpointPolicy
from flashruntime.protocol.v1alpha1 import (
    ExecutionSpec,
    ImageSpec,
    IsolationSpec,
    JobMetadata,
    JobSpec,
    JobSpecInner,
    WorkloadSpec,
)
from flashruntime.providers import Requirements

__all__ = ["CommandWorkload", "OutputSpec", "Source", "to_jobspec"]

_LAUNCHERS_OF_COORDINATED_JOBS = ("torchrun", "accelerate")
_FORMATTER = string.Formatter()
_LITERAL_BRACES = "write literal braces as '{{' and '}}'"


class Source(BaseModel):
    model_config = ConfigDict(defer_build=True)

    path: str = "."  # "~" is expanded at launch, not here
    git_revision: str | None = None  # reserved


def collect_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be an ``outputs.collect`` glob (relative to the source
    directory and inside it), or None when it can (pure). ``submit()`` refuses such a
    pattern before launching; building an ``OutputSpec`` with one stays allowed,
    as ``to_jobspec`` never reads it."""
    parts = PurePath(pattern).parts
    if not parts:
        return (f"outputs.collect pattern {pattern!r} names no file; give a glob relative to the source "
                "directory, e.g. 'metrics.json' or 'results/*.csv'")
    if PurePath(pattern).anchor:
        return (f"outputs.collect pattern {pattern!r} is absolute; patterns are globs relative to the source "
                "directory (Source.path), e.g. 'metrics.json' or 'results/*.csv'")
    if ".." in parts:
        return (f"outputs.collect pattern {pattern!r} reaches outside the source directory with '..'; "
                "collected files must lie inside it: have the command write them there (or straight into "
                "its FLASHML_OUTPUT_DIR)")
    return None


class OutputSpec(BaseModel):
    model_config = ConfigDict(defer_build=True)

    prefix: str = "artifact://jobs/{job_id}/"
    collect: list[str] = Field(default_factory=lambda: ["metrics.json"])
    primary_metric: str | None = None
    maximize: bool = True

    def maximize_if_set(self) -> bool | None:
        """``maximize`` when it was given, else None: the metric's name then decides
        (``flashruntime.workloads.ranking.resolve_mode``)."""
        return self.maximize if "maximize" in self.model_fields_set else None


class CommandWorkload(BaseModel):
    model_config = ConfigDict(defer_build=True)

    command: str | list[str]
    source: Source = Field(default_factory=Source)
    image: ImageSpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(default_factory=dict)
    outputs: OutputSpec = Field(default_factory=OutputSpec)
    resources: Requirements = Field(default_factory=Requirements)
    isolation: IsolationSpec = Field(default_factory=IsolationSpec)
    mode: Literal["auto", "local", "independent_tasks", "coordinated"] = "auto"
    checkpoint: CheckpointPolicy | None = None
    task_params: list[dict[str, Any]] | None = None
    # (min, max): an elastic local run, relaunched on the ranks available (see flashruntime.local.elastic).
    ranks: tuple[int, int] | None = None

    @field_validator("ranks")
    @classmethod
    def _ranks_are_a_range(cls, ranks: tuple[int, int] | None) -> tuple[int, int] | None:
        if ranks is not None and not 1 <= ranks[0] <= ranks[1]:
            raise ValueError(f"ranks {ranks} must be (min, max) with 1 <= min <= max, e.g. (1, 2)")
        return ranks

    @field_validator("inputs")
    @classmethod
    def _inputs_are_artifacts(cls, inputs: dict[str, str]) -> dict[str, str]:
        for name, uri in inputs.items():
            if not uri.startswith("artifact://"):
                raise ValueError(
                    f"input {name!r} is {uri!r}; inputs must be artifact:// URIs (e.g. 'artifact://datasets/x.csv')"
                )
        return inputs

    def argv(self, params: dict[str, Any] | None = None) -> list[str]:
        """The argument vector; with ``params`` every token is ``str.format``-ed (a missing
        placeholder raises KeyError unchanged)."""
        tokens = shlex.split(self.command) if isinstance(self.command, str) else list(self.command)
        if params is None:
            return tokens
        return [token.format(**params) for token in tokens]

    def resolved_mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        if self.task_params:
            return "independent_tasks"
        tokens = self.argv()
        if tokens and tokens[0] in _LAUNCHERS_OF_COORDINATED_JOBS:
            return "coordinated"
        return "local"


def _fill_problem(template: str, params: dict[str, Any], index: int, where: str) -> str | None:
    """Why ``template.format(**params)``, what the launch does, fails (naming the placeholder
    that cannot be filled), or None when it fills."""
    try:
        template.format(**params)
        return None
    except Exception as exc:  # noqa: BLE001  (a value's own __format__ may raise anything: the launch would too)
        failure: Exception = exc
    keys = sorted(params)
    try:
        fields = [(field, spec, conv) for _, field, spec, conv in _FORMATTER.parse(template) if field is not None]
    except ValueError as exc:  # a lone '{' or '}'
        return f"task_params[{index}] cannot fill {where} {template!r}: {exc}; {_LITERAL_BRACES}"
    culprit = ""
    for field, spec, conv in fields:
        placeholder = "{" + field + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
        key = re.split(r"[.\[]", field, maxsplit=1)[0]  # '{cfg[lr]}' and '{x.real}' read the key 'cfg', 'x'
        if key == "" or key.isdigit():
            example = "{" + (keys[0] if keys else "lr") + "}"
            return (f"task_params[{index}]: the placeholder {placeholder} in {where} {template!r} is positional; "
                    f"name a key of the parameter set (keys: {keys}), e.g. {example}, or {_LITERAL_BRACES}")
        if key not in params:
            return (f"task_params[{index}] has no key {key!r} for the placeholder {placeholder} in {where} "
                    f"{template!r} (keys: {keys}); add it to every parameter set, or {_LITERAL_BRACES}")
        try:
            placeholder.format(**params)
        except Exception as exc:  # noqa: BLE001  (as above)
            failure, culprit = exc, f"the placeholder {placeholder} in "
            break
    detail = f"no key {failure}" if isinstance(failure, KeyError) else str(failure) or type(failure).__name__
    return (f"task_params[{index}] cannot fill {culprit}{where} {template!r} (keys: {keys}): {detail}; "
            f"fix the placeholder or that parameter set, or {_LITERAL_BRACES}")


def unfilled_placeholders(workload: CommandWorkload) -> list[str]:
    """The named placeholders (``{lr}``) in the command of a workload that fans out over no
    parameter sets, where they are passed on as written (pure)."""
    if workload.task_params:
        return []
    found: list[str] = []
    for token in workload.argv():
        try:
            fields = [field for _, field, _, _ in _FORMATTER.parse(token) if field]
        except ValueError:  # a lone brace: no placeholder
            continue
        found += ["{" + field + "}" for field in fields if re.match(r"[A-Za-z_]", field)]
    return list(dict.fromkeys(found))


def task_params_problem(workload: CommandWorkload) -> str | None:
    """Why a parameter set of ``workload`` cannot fill a placeholder of its command or env
    (task index, token, missing key, fix), or None (pure). Only a fan-out formats; without
    one, braces are taken verbatim. ``submit()`` refuses such a workload before launching."""
    if workload.resolved_mode() != "independent_tasks" or not workload.task_params:
        return None
    tokens = workload.argv()
    for index, params in enumerate(workload.task_params):
        for token in tokens:
            problem = _fill_problem(token, params, index, "argv token")
            if problem is not None:
                return problem
        for name, value in workload.env.items():
            problem = _fill_problem(value, params, index, f"env {name}")
            if problem is not None:
                return problem
    return None


def to_jobspec(workload: CommandWorkload, name: str, image: ImageSpec | None = None) -> JobSpec:
    """The coordinator JobSpec for ``workload`` (placeholders left intact for expansion). The
    image is ``image``, else ``workload.image``, else none: the bundled worker runs the
    command without a container."""
    if workload.ranks is not None:
        raise ValueError(f"ranks={workload.ranks} makes an elastic local run; a coordinator task runs at the size its "
                         "command gives: drop ranks to submit it to the coordinator")
    chosen = image or workload.image
    parameters: dict[str, Any] = {"command": workload.argv(), "env": dict(workload.env), "inputs": dict(workload.inputs)}
    if workload.task_params is not None:
        parameters["task_params"] = [dict(p) for p in workload.task_params]
    if workload.checkpoint is not None:
        parameters["checkpoint"] = workload.checkpoint.model_dump()
    return JobSpec(
        metadata=JobMetadata(name=name),
        spec=JobSpecInner(
            execution=ExecutionSpec(backend="leases"),
            image=chosen,
            workload=WorkloadSpec(type="command", parameters=parameters),
            isolation=workload.isolation.model_copy(deep=True),
        ),
    )
