"""``flashruntime plan REQUEST [--json] [--profile CMD] [--ledger PATH] [--explain]``: read a
PlanRequest (JSON, or YAML via pyyaml), plan it (measuring a few steps of CMD, and taking
finished runs' figures from a calibration ledger, when asked), print the rendered report or
the report as JSON. A key the request model would ignore (a misspelling, say) gets a warning
on stderr first.

Exit codes: 0 a plan was selected; 3 no valid strategy; 1 invalid or unreadable
request; 2 pyyaml missing for a YAML file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_SELECTED = 0
EXIT_INVALID = 1
EXIT_NO_YAML = 2
EXIT_NO_STRATEGY = 3

YAML_HINT = (
    "reading a YAML request needs pyyaml: pip install 'flashruntime[service]' (or pip install pyyaml), "
    "or write the request as JSON"
)


class _RequestError(Exception):
    """The request file cannot be read or parsed; carries the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan a run: strategy, memory per GPU, time and cost, and why the alternatives lost",
        description="Plan a training or task run from a PlanRequest file (.json, or .yaml/.yml with pyyaml).",
    )
    parser.add_argument("request_file", help="PlanRequest as JSON, or YAML (.yaml/.yml)")
    parser.add_argument("--json", action="store_true", help="print the PlanReport as JSON instead of text")
    parser.add_argument("--profile", metavar="CMD", default=None,
                        help="measure a few real steps of CMD (a script using flashruntime.torch, plain or torchrun) "
                             "in a temporary directory and plan with the measured figures")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="optimizer steps of the full run: turns a measured step time into time and cost")
    parser.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                        help="wall-clock limit of the profile (default 300); past it the plan stays static")
    parser.add_argument("--ledger", metavar="PATH", default=None,
                        help="calibration ledger of finished runs (SQLite; default: $FLASHML_CALIBRATION_LEDGER, else "
                             "calibration.sqlite under the runs directory, when it exists)")
    parser.add_argument("--mtbf-hours", type=float, default=None, metavar="H",
                        help="mean time between failures of the fleet, for the checkpoint-interval advice")
    parser.add_argument("--explain", action="store_true",
                        help="after the report, list where each measured figure came from (profile or ledger runs)")
    parser.set_defaults(handler=handle)


def _load(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _RequestError(f"cannot read request file {str(path)!r}: {exc.strerror or exc}", EXIT_INVALID) from None
    except UnicodeDecodeError as exc:
        raise _RequestError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save the request "
            "as UTF-8 JSON or YAML",
            EXIT_INVALID,
        ) from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml  # optional: the `service` extra
        except ImportError:
            raise _RequestError(YAML_HINT, EXIT_NO_YAML) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise _RequestError(f"{path}: not valid YAML: {exc}", EXIT_INVALID) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _RequestError(f"{path}: not valid JSON: {exc}", EXIT_INVALID) from None


def handle(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from flashruntime.cli._unknown_keys import print_warnings
    from flashruntime.planner import plan, render
    from flashruntime.protocol.plan_v1alpha1 import PlanRequest

    path = Path(args.request_file)
    try:
        data = _load(path)
    except _RequestError as exc:
        print(f"flashruntime plan: {exc}", file=sys.stderr)
        return exc.code
    print_warnings("plan", PlanRequest, data)  # ignored by the model, so said here
    try:
        request = PlanRequest.model_validate(data)
    except ValidationError as exc:
        print(f"flashruntime plan: {path} is not a valid PlanRequest:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    from flashruntime.errors import ProfileError

    ledger = _ledger(args.ledger)
    try:
        report = plan(request, profile=True if args.profile else None, command=args.profile, steps=args.steps,
                      budget_seconds=args.budget, ledger=ledger,
                      mtbf_s=None if args.mtbf_hours is None else args.mtbf_hours * 3600)
    except ProfileError as exc:  # arguments that cannot describe a profile
        print(f"flashruntime plan: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.explain and not args.json:
        print(render(report), end="")
        print(explain_measurements(report))
        return EXIT_SELECTED if report.selected is not None else EXIT_NO_STRATEGY
    if args.json:
        print(report.model_dump_json(indent=2, exclude_none=True))
    else:
        print(render(report), end="")
    return EXIT_SELECTED if report.selected is not None else EXIT_NO_STRATEGY


def _ledger(path: str | None) -> Any:
    from flashruntime.profiling.calibration import CalibrationLedger, default_ledger_path

    if path is not None:
        return CalibrationLedger(path)
    return CalibrationLedger() if default_ledger_path().exists() else None


def explain_measurements(report: Any) -> str:
    """Which figures are measured, and from what: the candidates' profiled and ledger lines."""
    lines = ["Measured figures"]
    for c in report.candidates:
        measured = [r for r in c.reasons if " profiled" in r or " ledger" in r]
        if measured:
            lines.append(f"  {c.name}")
            lines.extend(f"    - {r}" for r in measured)
    if len(lines) == 1:
        lines.append("  none: every figure is static (give --profile CMD, or record runs in the ledger)")
    return "\n".join(lines)
