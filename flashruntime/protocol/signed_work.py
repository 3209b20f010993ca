"""Wire shapes of signed work: a command job its submitter signed with an ed25519 key.

``WorkSignature`` travels in the job's ``workload.parameters.signature``, one signature
per parameter set; the coordinator stores it and hands each task its ``SignedTask``
(``payload.signed_work``), from which a worker that trusts the key re-derives the task's
argv and env. What the bytes are and how they are signed is ``flashruntime.signing``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from flashruntime.protocol.base import WireModel

__all__ = ["SIGNED_COMMAND_FORMAT", "SIGNED_PAYLOAD_KEYS", "SignedTask", "WorkSignature"]

SIGNED_COMMAND_FORMAT = "flashruntime-signed-command/v1"
# The payload keys a task's signature covers besides its command, env and parameters: what
# the worker reads to prepare and confine the command (inputs, datasets, the checkpoint it
# resumes from, spec.json's params, sandbox tier and network). A key the job's payloads do
# not carry is signed as absent, so a coordinator cannot add it.
SIGNED_PAYLOAD_KEYS = ("inputs", "unpack_inputs", "local_inputs", "checkpoint", "params", "isolation")
# An ed25519 signature is 64 bytes: 88 characters of base64.
_SIGNATURE_CHARS = 88


class _Signed(WireModel):
    model_config = ConfigDict(defer_build=True, extra="forbid")

    format: Literal["flashruntime-signed-command/v1"] = SIGNED_COMMAND_FORMAT
    key_id: str = Field(min_length=1, max_length=128)
    submitter: str = Field(min_length=1, max_length=128)
    job_name: str = Field(min_length=1, max_length=253)
    nonce: str = Field(min_length=16, max_length=128)


class WorkSignature(_Signed):
    """``workload.parameters.signature``: who signed, with which key, the job's name and a
    nonce of its own, and one base64 signature per ``task_params`` entry (one when none)."""

    task_signatures: list[str] = Field(min_length=1)


class SignedTask(_Signed):
    """``payload.signed_work`` of one task: its signature, and what was signed that the
    payload does not carry as signed (the argv template, the env template, the task's
    parameter set, its index among the job's ``task_count`` tasks)."""

    task_index: int = Field(ge=0)
    task_count: int = Field(ge=1)
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    params: dict[str, Any] | None = None
    signature: str = Field(min_length=_SIGNATURE_CHARS, max_length=_SIGNATURE_CHARS)
