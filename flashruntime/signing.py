"""Signed work: ed25519 keys of submitters, the bytes a command task's signature covers,
signing a command job and verifying one task of it.

A submitter signs each parameter set of a command job: the argv and env templates, the
parameter set, its index and the job's task count, the inputs, datasets and sandbox tier
the task will carry, the submitter's name, and the job's name with a fresh nonce, so no
signature fits another job or another command. A worker that trusts the key re-derives
what it runs from that document (``flashruntime.agent.signed_work``), so a coordinator
cannot change it. ``cryptography`` (the ``signing`` extra) is imported only when a key is used.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.errors import SigningError
from flashruntime.protocol.signed_work import SIGNED_COMMAND_FORMAT, SIGNED_PAYLOAD_KEYS, SignedTask, WorkSignature

__all__ = [
    "PUBLIC_KEY_PREFIX",
    "PublicKey",
    "SigningKey",
    "canonical_bytes",
    "generate_key_pair",
    "load_signing_key",
    "load_trusted_keys",
    "sign_job_spec",
    "signed_payload_fields",
    "task_document",
    "verify_task",
]

PUBLIC_KEY_PREFIX = "flashruntime-ed25519"
_DOMAIN = b"flashruntime signed command v1\n"  # a signature over these bytes means nothing elsewhere
_KEY_HEADER = "# flashruntime signing key of "
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
_INSTALL_HINT = "signing needs the cryptography package: pip install 'flashruntime[signing]'"


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningError(_INSTALL_HINT) from None
    return ed25519


def key_id_of(raw_public_key: bytes) -> str:
    """A public key's id: ``ed25519:`` and the first 16 bytes of its sha256, in hex."""
    return "ed25519:" + hashlib.sha256(raw_public_key).hexdigest()[:32]


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return (f"signer name {name!r} must be 1 to 128 letters, digits and '.', '_', '@', '+', '-', starting "
                "with a letter or digit (e.g. 'alice')")
    return None


@dataclass(frozen=True)
class PublicKey:
    """A trusted submitter's public key: whose it is and its 32 raw bytes."""

    name: str
    raw: bytes

    @property
    def key_id(self) -> str:
        return key_id_of(self.raw)

    def line(self) -> str:
        """The key as one line of a trusted-keys file."""
        return f"{PUBLIC_KEY_PREFIX} {base64.b64encode(self.raw).decode('ascii')} {self.name}"


@dataclass(frozen=True)
class SigningKey:
    """A submitter's private key (a ``cryptography`` ``Ed25519PrivateKey``) and its name."""

    name: str
    private: Any

    @property
    def public(self) -> PublicKey:
        from cryptography.hazmat.primitives import serialization

        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey(self.name, raw)

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.private.sign(data)).decode("ascii")


def generate_key_pair(out_dir: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """A new key pair in ``out_dir``: ``<name>.key`` (PKCS#8 PEM, mode 0600) and ``<name>.pub``
    (one trusted-keys line). Never overwrites an existing file."""
    problem = _name_problem(name)
    if problem is not None:
        raise SigningError(problem)
    from cryptography.hazmat.primitives import serialization

    private = _ed25519().Ed25519PrivateKey.generate()
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (key_path, pub_path):
        if path.exists():
            raise SigningError(f"{path} exists already; remove it or choose another --name or --out")
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    # O_EXCL with the mode: the private key is never readable by others, not even for a moment.
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(f"{_KEY_HEADER}{name}\n".encode("ascii") + pem)
    pub_path.write_text(SigningKey(name, private).public.line() + "\n", encoding="ascii")
    return key_path, pub_path


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """The private key ``generate_key_pair`` wrote (its first line names the signer)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningError(f"cannot read signing key {os.fspath(path)!r}: {exc.strerror or exc}") from None
    first, _, rest = data.partition(b"\n")
    header = first.decode("ascii", "replace")
    if not header.startswith(_KEY_HEADER):
        raise SigningError(f"{os.fspath(path)} is not a flashruntime signing key (its first line should be "
                           f"'{_KEY_HEADER}<name>'); create one with 'flashruntime keys generate --out DIR --name NAME'")
    name = header[len(_KEY_HEADER):].strip()
    problem = _name_problem(name)
    if problem is not None:
        raise SigningError(f"{os.fspath(path)}: {problem}")
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    try:
        private = serialization.load_pem_private_key(rest, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{os.fspath(path)}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise SigningError(f"{os.fspath(path)} holds a {type(private).__name__}, not an ed25519 key")
    return SigningKey(name, private)


def _parse_public_line(line: str, where: str) -> PublicKey:
    parts = line.split()
    if len(parts) != 3 or parts[0] != PUBLIC_KEY_PREFIX:
        raise SigningError(f"{where}: expected '{PUBLIC_KEY_PREFIX} <base64 key> <name>' (a .pub file "
                           "'flashruntime keys generate' wrote)")
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise SigningError(f"{where}: the key is not 32 bytes of base64 (an ed25519 public key)")
    problem = _name_problem(parts[2])
    if problem is not None:
        raise SigningError(f"{where}: {problem}")
    return PublicKey(parts[2], raw)


def load_trusted_keys(path: str | os.PathLike[str]) -> dict[str, PublicKey]:
    """Trusted submitter keys by key id, from a file of key lines (blank lines and ``#``
    comments skipped) or a directory of such ``*.pub`` files. No key at all, a malformed
    line, or one key id under two names is a ``SigningError``."""
    _ed25519()  # a worker that cannot verify must not start believing it can
    root = Path(os.path.expanduser(os.fspath(path)))
    if root.is_dir():
        files = sorted(root.glob("*.pub"))
    elif root.is_file():
        files = [root]
    else:
        raise SigningError(f"trusted submitter keys {os.fspath(path)!r}: no such file or directory")
    keys: dict[str, PublicKey] = {}
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SigningError(f"cannot read trusted key file {file}: {exc}") from None
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key = _parse_public_line(line, f"{file} line {number}")
            other = keys.get(key.key_id)
            if other is not None and other.name != key.name:
                raise SigningError(f"{file} line {number}: key {key.key_id} is trusted as {other.name!r} already; "
                                   "one key has one name")
            keys[key.key_id] = key
    if not keys:
        where = f"no *.pub file in {root}" if root.is_dir() else f"no key line in {root}"
        raise SigningError(f"trusted submitter keys: {where}; add a .pub file 'flashruntime keys generate' wrote")
    return keys


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: a domain line, then the document as JSON with sorted
    keys, no spaces and ASCII escapes (one spelling for one document, on every machine)."""
    try:
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SigningError(f"the signed document is not plain JSON: {exc}") from None
    return _DOMAIN + text.encode("ascii")


def task_document(signed: SignedTask, payload_fields: Mapping[str, Any]) -> dict[str, Any]:
    """What task ``signed.task_index``'s signature covers: ``signed`` without its signature,
    plus the payload's ``SIGNED_PAYLOAD_KEYS`` (``payload_fields``; absent = None)."""
    document = signed.model_dump(mode="json", exclude={"signature"})
    document["payload"] = {key: payload_fields.get(key) for key in SIGNED_PAYLOAD_KEYS}
    return document


def verify_task(signed: SignedTask, payload_fields: Mapping[str, Any], key: PublicKey) -> bool:
    """Whether ``signed.signature`` is ``key``'s signature of ``task_document(signed, payload_fields)``."""
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature

    try:
        signature = base64.b64decode(signed.signature, validate=True)
        data = canonical_bytes(task_document(signed, payload_fields))
    except (binascii.Error, SigningError, ValueError):  # not base64, or a document no signer could have signed
        return False
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key.raw).verify(signature, data)
    except InvalidSignature:
        return False
    return True


def signed_payload_fields(parameters: Mapping[str, Any], isolation: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SIGNED_PAYLOAD_KEYS`` of every task of a command job, as the command recipe
    writes them into its payloads (keys it omits are None)."""
    local_inputs = parameters.get("local_inputs")
    unpack = parameters.get("unpack_inputs")
    confinement = {"tier": str(isolation.get("tier", "sandboxed")),
                   "allowFallback": isolation.get("allowFallback", False) is True}
    if isolation.get("network") is True:  # written only when asked, as the recipe does
        confinement["network"] = True
    return {
        "inputs": dict(parameters.get("inputs") or {}),
        "unpack_inputs": None if unpack is None else list(unpack),
        "local_inputs": list(local_inputs) if isinstance(local_inputs, list) else local_inputs,
        "checkpoint": copy.deepcopy(parameters.get("checkpoint")),
        "params": None,  # a command's payload has none: its parameters are signed_work.params
        "isolation": confinement,
    }


def sign_job_spec(spec: Mapping[str, Any], key: SigningKey, *, nonce: str | None = None) -> dict[str, Any]:
    """A copy of the command JobSpec ``spec`` with ``workload.parameters.signature``: ``key``'s
    signature of each parameter set. The job must be a command job whose parameters the
    coordinator would take (a malformed one is refused there; nothing here fixes it)."""
    from flashruntime.protocol.v1alpha1 import JobSpec

    try:
        job = JobSpec.model_validate(spec)
    except ValueError as exc:
        raise SigningError(f"cannot sign an invalid JobSpec: {exc}") from None
    workload = job.spec.workload
    if workload.type != "command":
        raise SigningError(f"only command jobs are signed (workload.type 'command'); this one is {workload.type!r}")
    parameters = workload.parameters
    command, env, task_params = parameters.get("command"), parameters.get("env") or {}, parameters.get("task_params")
    if not isinstance(command, list) or not command or not all(isinstance(token, str) for token in command):
        raise SigningError("parameters.command must be a non-empty list of strings to be signed")
    if not isinstance(env, dict) or not all(isinstance(value, str) for value in env.values()):
        raise SigningError("parameters.env must map names to strings to be signed")
    if task_params is not None and (not isinstance(task_params, list)
                                    or not all(isinstance(entry, dict) for entry in task_params)):
        raise SigningError("parameters.task_params must be a list of dicts to be signed")
    if "signature" in parameters:
        raise SigningError("parameters.signature is set: the job is signed already; sign the spec without it")
    sets: list[dict[str, Any] | None] = list(task_params) if task_params else [None]
    isolation = job.spec.isolation.model_dump(mode="json")
    fields = signed_payload_fields(parameters, isolation)
    common = {"format": SIGNED_COMMAND_FORMAT, "key_id": key.public.key_id, "submitter": key.name,
              "job_name": job.metadata.name, "nonce": nonce or secrets.token_hex(16)}
    signatures = []
    for index, values in enumerate(sets):
        # The document leaves the signature out, so the task is built without one here.
        unsigned = SignedTask.model_construct(**common, task_index=index, task_count=len(sets),
                                              command=list(command), env=dict(env), params=values, signature="")
        signatures.append(key.sign(canonical_bytes(task_document(unsigned, fields))))
    signed_spec = copy.deepcopy(dict(spec))
    signature = WorkSignature(**common, task_signatures=signatures)
    signed_spec["spec"]["workload"].setdefault("parameters", {})["signature"] = signature.model_dump(mode="json")
    return signed_spec
