"""The coordinator's job routes from a shell: ``submit-spec``, ``status``, ``events``,
``cancel``. Each prints what the coordinator answered for a person (the job in a few
aligned lines, with its tasks and the reason it failed; the events as a table, oldest
first), or with ``--json`` the answer itself (indent 2); ``submit-spec`` first warns on
stderr about each key JobSpec would ignore. Also the one way every coordinator command
(here and in ``job_output``) calls the client and turns its errors into exit codes.

Through ``flashruntime.client`` (standard library only), so these work without the
``service`` extra.
Exit codes: 0 success; 1 HTTP status >= 400 (status and FastAPI's ``detail`` printed)
or a spec file that cannot be read or is not an object; 2 coordinator unreachable,
``--api`` not a URL, or pyyaml missing for a YAML spec.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import http
import json
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from flashruntime.cli._api import TOKEN_HELP, auth_hint, resolve_api, resolve_token
from flashruntime.client import CoordinatorClient, RetryPolicy
from flashruntime.errors import (
    CommandError,
    CoordinatorHTTPError,
    CoordinatorUnavailable,
)

# Every command here asks the coordinator: --api is accepted after the command too.
TALKS_TO_A_COORDINATOR = True

EXIT_OK, EXIT_HTTP_ERROR, EXIT_UNREACHABLE = 0, 1, 2
EXIT_BAD_SPEC, EXIT_NO_YAML = 1, 2

TIMEOUT_S = 30.0
CLI_RETRY = RetryPolicy(attempts=2, backoff_s=0.5)  # one more try of what is safe to repeat; a person is waiting
JOBS_PATH = "/v1alpha1/jobs"
YAML_HINT = (
    "reading a YAML spec needs pyyaml: pip install 'flashruntime[service]' (or pip install pyyaml), "
    "or write the spec as JSON (.json)"
)

# command, method, path suffix after /v1alpha1/jobs/{id}, help
_JOB_COMMANDS: tuple[tuple[str, str, str, str], ...] = (
    ("status", "GET", "", "show a job (its JobRecord)"),
    ("events", "GET", "/events", "list a job's events in ledger order"),
    ("cancel", "POST", "/cancel", "cancel a job (every task; on Ray, its running Ray tasks are stopped)"),
)
T = TypeVar("T")


def add_token_option(parser: argparse.ArgumentParser) -> None:
    """``--token``, accepted before the command too: a value given there is kept unless repeated here."""
    parser.add_argument("--token", default=argparse.SUPPRESS, help=TOKEN_HELP)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON, for scripts")


def add_job_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", type=_job_id, help="the job's id (job_id in submit-spec's answer)")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "submit-spec", help="submit a JobSpec file to the coordinator (POST /v1alpha1/jobs)",
        description="Submit a JobSpec (.json, else YAML via pyyaml) to the coordinator at --api; "
                    "the coordinator validates it (422 when invalid).",
    )
    parser.add_argument("spec_file", help="JobSpec as JSON (.json), or YAML (any other suffix)")
    parser.add_argument("--sign-key", default=None, metavar="PATH",
                        help="sign the command job with this private key ('flashruntime keys generate'), so workers "
                             "that trust its public key run it (needs the signing extra)")
    add_token_option(parser)
    add_json_option(parser)
    parser.set_defaults(handler=handle_submit_spec)
    for name, method, suffix, help_text in _JOB_COMMANDS:
        parser = subparsers.add_parser(
            name, help=help_text,
            description=f"{help_text[0].upper()}{help_text[1:]}: {method} {JOBS_PATH}/{{job_id}}{suffix} "
                        "on the coordinator at --api.",
        )
        add_job_id(parser)
        add_token_option(parser)
        add_json_option(parser)
        parser.set_defaults(handler=functools.partial(_handle_job_route, name, method, suffix))


def _job_id(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("job_id must not be empty")
    return value


def load_spec(path: Path) -> dict[str, Any]:
    """The spec file as a dict: ``.json`` via the standard library, anything else as YAML."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CommandError(f"cannot read spec file {str(path)!r}: {reason}", EXIT_BAD_SPEC) from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CommandError(f"{path}: not valid JSON: {exc}", EXIT_BAD_SPEC) from None
    else:
        try:
            import yaml  # optional: the `service` extra
        except ImportError:
            raise CommandError(YAML_HINT, EXIT_NO_YAML) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CommandError(f"{path}: not valid YAML: {exc}", EXIT_BAD_SPEC) from None
    if not isinstance(data, dict):
        raise CommandError(f"{path}: a JobSpec must be an object (apiVersion, kind, metadata, spec), "
                           f"got {'an empty file' if data is None else type(data).__name__}", EXIT_BAD_SPEC)
    return data


def _json_default(value: Any) -> str:
    # YAML turns unquoted timestamps into date/datetime; the wire carries ISO 8601 strings.
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} value {value!r} cannot be sent as JSON")


def encode_spec(path: Path, data: dict[str, Any]) -> bytes:
    try:
        return json.dumps(data, default=_json_default, allow_nan=False).encode("utf-8")
    except TypeError as exc:
        raise CommandError(f"{path}: {exc}", EXIT_BAD_SPEC) from None
    except ValueError:
        raise CommandError(f"{path}: contains NaN or Infinity, which JSON cannot carry", EXIT_BAD_SPEC) from None


def request(api: str, method: str, path: str, body: bytes | None = None, *, timeout: float = TIMEOUT_S,
            token: str | None = None) -> Any:
    """One call to the coordinator through the client → the decoded JSON answer, with
    ``token`` as the bearer token when given; errors as ``coordinator_call`` raises them."""
    client = CoordinatorClient(api, token=token, timeout_s=timeout, retry=CLI_RETRY)
    payload = None if body is None else json.loads(body)
    if (method, path) == ("POST", JOBS_PATH):
        return coordinator_call(api, lambda: client.submit_job(payload))
    return coordinator_call(api, lambda: client.request_json(method, path, payload, idempotent=True))


def cli_client(api: str, args: argparse.Namespace) -> CoordinatorClient:
    """The client a command uses: ``--token`` (else ``FLASHML_TOKEN``), the CLI's timeout and retries."""
    return CoordinatorClient(api, token=resolve_token(getattr(args, "token", None)), timeout_s=TIMEOUT_S,
                             retry=CLI_RETRY)


def coordinator_call(api: str, call: Callable[[], T]) -> T:
    """``call()`` (a client call to the coordinator at ``api``). An HTTP status >= 400 raises
    ``CommandError`` with exit code 1 (a 401 or 403 also says what to do about the token); an
    unreachable server or an answer that is not JSON, code 2."""
    try:
        return call()
    except CoordinatorHTTPError as exc:
        url = api + exc.path
        if exc.status < 400:  # answered, but not with JSON
            raise CommandError(f"{exc.method} {url} {exc.detail}; is --api / FLASHML_RUNTIME_API the address of a "
                               "flashruntime coordinator?", EXIT_UNREACHABLE) from None
        raise CommandError(f"{exc.method} {url} -> {exc.status} {_phrase(exc.status)}: {exc.detail}"
                           f"{auth_hint(exc.status)}", EXIT_HTTP_ERROR) from None
    except CoordinatorUnavailable as exc:
        raise CommandError(
            f"cannot reach the coordinator at {api} ({exc}); start one with 'flashruntime serve', or point --api "
            "or FLASHML_RUNTIME_API at a running coordinator",
            EXIT_UNREACHABLE,
        ) from None


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _run(command: str, args: argparse.Namespace, method: str, path: str, body_from: Path | None = None,
         sign_key: str | None = None) -> int:
    try:
        api = resolve_api(getattr(args, "api", None))
    except ValueError as exc:
        print(f"flashruntime {command}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    token = resolve_token(getattr(args, "token", None))
    try:
        body = None if body_from is None else _spec_body(command, body_from, sign_key)
        answer = request(api, method, path, body, token=token)
    except CommandError as exc:
        print(f"flashruntime {command}: {exc}", file=sys.stderr)
        return exc.code
    if getattr(args, "json", False):
        print(json.dumps(answer, indent=2))
    elif command == "events":
        sys.stdout.write(events_text(answer if isinstance(answer, list) else [], dt.datetime.now(dt.timezone.utc)))
    elif isinstance(answer, dict):
        sys.stdout.write(job_text(command, answer, _tasks_of(api, answer, token), dt.datetime.now(dt.timezone.utc)))
    else:
        print(json.dumps(answer, indent=2))
    return EXIT_OK


def _tasks_of(api: str, record: dict[str, Any], token: str | None) -> list[dict[str, Any]] | None:
    """The job's task rows, for its summary line; None when they cannot be read (the record is shown anyway)."""
    job_id = record.get("job_id")
    if not isinstance(job_id, str):
        return None
    try:
        rows = request(api, "GET", f"{JOBS_PATH}/{urllib.parse.quote(job_id, safe='')}/tasks", token=token)
    except CommandError:
        return None
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else None


def ago(timestamp: Any, now: dt.datetime) -> str:
    """How long before ``now`` an ISO 8601 time was, as ``kubectl get`` says it (45s, 12m, 3h, 2d); "-" when unreadable."""
    try:
        then = dt.datetime.fromisoformat(str(timestamp))
    except ValueError:
        return "-"
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.timezone.utc)
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def job_text(command: str, record: dict[str, Any], tasks: list[dict[str, Any]] | None, now: dt.datetime) -> str:
    """A job record in aligned lines: what it is, its state and age, its tasks by state, its
    backend, why it failed, and what to type next."""
    job_id = str(record.get("job_id", "-"))
    name = ((record.get("spec") or {}).get("metadata") or {}).get("name") or record.get("name")
    owner = (record.get("submitted_by") or {}).get("name")
    state = str(record.get("state", "-"))
    when = ago(record.get("created_at"), now)
    lines = [("job", job_id + (f" ({name})" if name else "")),
             ("state", ", ".join(part for part in (state, f"submitted {when} ago" if when != "-" else "",
                                                   f"by {owner}" if owner else "") if part))]
    if tasks is not None:
        counts: dict[str, int] = {}
        for task in tasks:
            counts[str(task.get("state"))] = counts.get(str(task.get("state")), 0) + 1
        lines.append(("tasks", f"{len(tasks)}" + (": " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                                                  if counts else "")))
    if record.get("backend"):
        lines.append(("backend", str(record["backend"])))
    if record.get("error"):
        lines.append(("error", str(record["error"])))
    elif state == "FAILED":
        lines.append(("error", f"no reason recorded; flashruntime events {job_id} shows what happened"))
    width = max(len(label) for label, _ in lines)
    text = "".join(f"{label.ljust(width)}  {value}\n" for label, value in lines)
    follow = {"submit-spec": f"follow it: flashruntime logs {job_id} --follow; flashruntime status {job_id}",
              "cancel": f"cancel requested; flashruntime status {job_id} shows when its tasks have stopped"}
    return text + (f"{follow[command]}\n" if command in follow else "")


def events_text(events: list[Any], now: dt.datetime) -> str:
    """The events as a table, oldest first: how long ago, the type, the message."""
    rows = [(ago(event.get("timestamp"), now), str(event.get("type", "-")), str(event.get("message", "")))
            for event in events if isinstance(event, dict)]
    return table(("AGE", "TYPE", "MESSAGE"), rows) if rows else "no events\n"


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Aligned columns, two spaces apart, as ``kubectl get`` prints them."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n"
                   for row in (header, *rows))


def _spec_body(command: str, path: Path, sign_key: str | None = None) -> bytes:
    """The spec file as the request body, after a warning for each key JobSpec would ignore;
    signed with the private key at ``sign_key`` when given."""
    from flashruntime.cli._unknown_keys import print_warnings
    from flashruntime.protocol.v1alpha1 import JobSpec

    data = load_spec(path)
    print_warnings(command, JobSpec, data)
    if sign_key is not None:
        from flashruntime.errors import SigningError
        from flashruntime.signing import load_signing_key, sign_job_spec

        try:
            data = sign_job_spec(data, load_signing_key(sign_key))
        except SigningError as exc:
            raise CommandError(f"--sign-key: {exc}", EXIT_BAD_SPEC) from None
    return encode_spec(path, data)


def handle_submit_spec(args: argparse.Namespace) -> int:
    return _run("submit-spec", args, "POST", JOBS_PATH, body_from=Path(args.spec_file),
                sign_key=getattr(args, "sign_key", None))


def _handle_job_route(command: str, method: str, suffix: str, args: argparse.Namespace) -> int:
    job = urllib.parse.quote(args.job_id, safe="")
    return _run(command, args, method, f"{JOBS_PATH}/{job}{suffix}")
