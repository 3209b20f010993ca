"""The worker's check of signed work: a worker started with trusted submitter keys runs a
command only when a trusted key signed it, and only as signed.

The coordinator hands each task its signature and what it covers (``payload.signed_work``).
The worker checks the signature over that and over the payload's inputs, datasets,
checkpoint, params and sandbox (tier and network), then fills the signed templates from the signed parameter set with the
command recipe's own formatting and requires exactly the payload's argv and env. So a
coordinator that alters argv, env, parameters or inputs, moves a signature to another
task or job, or signs with a key of its own, is refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flashruntime.protocol.signed_work import SIGNED_PAYLOAD_KEYS, SignedTask
from flashruntime.signing import PublicKey, verify_task

__all__ = ["signature_problem"]

_HOW_TO_SIGN = "submit it with 'flashruntime submit-spec --sign-key KEY' using a key this worker trusts"


def signature_problem(payload: Mapping[str, Any], trusted_keys: Mapping[str, PublicKey]) -> str | None:
    """Why this worker must not run the ``argv`` payload, or None when a key of
    ``trusted_keys`` (key id -> key) signed exactly this task."""
    from pydantic import ValidationError

    from flashruntime.recipes.command import command_task_id, fill_task

    block = payload.get("signed_work")
    if block is None:
        return f"the command is not signed, and this worker runs only signed commands; {_HOW_TO_SIGN}"
    try:
        signed = SignedTask.model_validate(block)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the object)"
        return f"the command's signature is malformed (signed_work.{where}: {first['msg']}); {_HOW_TO_SIGN}"
    key = trusted_keys.get(signed.key_id)
    if key is None:
        trusted = ", ".join(sorted(f"{k.name} ({k.key_id})" for k in trusted_keys.values())) or "none"
        return (f"the command is signed with key {signed.key_id}, which this worker does not trust (trusted: "
                f"{trusted}); {_HOW_TO_SIGN}")
    if signed.submitter != key.name:
        return (f"the signature names submitter {signed.submitter!r}, but key {signed.key_id} is trusted as "
                f"{key.name!r}")
    fields = {name: payload.get(name) for name in SIGNED_PAYLOAD_KEYS}
    if not verify_task(signed, fields, key):
        return (f"the signature of {key.name!r} does not verify: the command, its env, its parameters, inputs, "
                "checkpoint or sandbox were changed after signing")
    expected_task = command_task_id(signed.task_index)
    if payload.get("task_id") != expected_task:
        return (f"the signature is for {expected_task} of job {signed.job_name!r}, but the payload is task "
                f"{payload.get('task_id')!r}")
    try:
        argv, env = fill_task(signed.command, signed.env, signed.params, signed.task_index)
    except ValueError as exc:
        return f"the signed command cannot be filled from its signed parameters: {exc}"
    if payload.get("argv") != argv:
        return "the payload's argv is not the signed command filled from its signed parameters"
    if (payload.get("env") or {}) != env:
        return "the payload's env is not the signed env filled from its signed parameters"
    return None
