"""``flashruntime runs``: list local run directories (``viewer_v1`` run.json), newest first."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "runs", help="list local runs under a directory",
        description="List the local runs (directories holding a run.json) under the runs root, newest first: "
                    "state, mode, attempts, start, duration and command.")
    parser.add_argument("--root", default=None,
                        help="directory to search (default: $FLASHML_RUNS_DIR, else ~/.local/share/flashruntime/runs "
                             "or the platform's user data directory)")
    parser.add_argument("--show", default=None, metavar="RUN",
                        help="show one run (a directory, or a name under the root): its state and goodput ledger "
                             "(useful step time, lost work, recoveries with MTTD and MTTR)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=handle)


UNKNOWN = "?"  # a field run.json holds in a shape no flashruntime writes


def _describe(directory: Path) -> dict[str, Any] | None:
    path = directory / "run.json"
    if not path.is_file():
        return None
    row: dict[str, Any] = {"name": directory.name, "path": str(directory), "state": UNKNOWN, "mode": None, "attempts": None,
                           "started": None, "duration_s": None, "command": None, "_sort": path.stat().st_mtime}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return row
    if not isinstance(doc, dict):
        return row  # unreadable: listed with state "?"
    if doc.get("contract") != "viewer_v1":
        return None  # some other tool's run.json
    # Field by field: one malformed value shows as "?" in its own column, never hides the row.
    started, finished = _timestamp(doc.get("started_at")), _timestamp(doc.get("finished_at"))
    state = doc.get("state", UNKNOWN)
    workload = doc.get("workload") or {}
    mode = workload.get("mode") if isinstance(workload, dict) else UNKNOWN
    attempts = doc.get("attempts") or []
    command = workload.get("command") if isinstance(workload, dict) else None
    row.update(
        command=(" ".join(command) if isinstance(command, list) and all(isinstance(t, str) for t in command)
                 else None if command is None else UNKNOWN),
        state=state if isinstance(state, str) else UNKNOWN,
        mode=mode if mode is None or isinstance(mode, str) else UNKNOWN,
        attempts=len(attempts) if isinstance(attempts, list) else UNKNOWN,
        started=_iso(started),
        duration_s=_elapsed(started, finished),
        _sort=row["_sort"] if started is None or started == UNKNOWN else started,
    )
    return row


def _timestamp(value: object) -> float | str | None:
    """A run.json time in seconds since the epoch; None when absent, "?" when malformed
    (not a number, not finite, or beyond the dates ``datetime`` can show)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return UNKNOWN
    try:
        datetime.fromtimestamp(value, timezone.utc)
    except (OverflowError, ValueError, OSError):
        return UNKNOWN
    return value


def _elapsed(started: float | str | None, finished: float | str | None) -> float | str | None:
    if started is None or finished is None:
        return None  # not started, or still running
    if isinstance(started, str) or isinstance(finished, str):
        return UNKNOWN
    return round(finished - started, 1)


def _iso(seconds: float | str | None) -> str | None:
    if seconds is None or isinstance(seconds, str):
        return seconds
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_runs(root: Path) -> list[dict[str, Any]]:
    candidates = [root]
    try:
        candidates += [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        pass
    rows = [r for r in (_describe(c) for c in candidates) if r is not None]
    rows.sort(key=lambda r: r["_sort"], reverse=True)
    for row in rows:
        del row["_sort"]
    return rows


def resolve_run(run: str, root: str | None = None) -> Path | None:
    """The run directory ``run`` names: a directory holding a run.json, else a run's name under
    ``root`` (default: the runs root); None when neither is one."""
    from flashruntime.run_dirs import runs_root

    for directory in (Path(run).expanduser(), (Path(root) if root else runs_root()) / run):
        if (directory / "run.json").is_file():
            return directory
    return None


def show(run: str, root: str | None, as_json: bool) -> int:
    """``--show RUN``: one run's row, its sweep's trials (best first), why it failed, and its
    goodput ledger."""
    from flashruntime.goodput.run import ledger_lines, ledger_of_run, logged_steps

    directory = resolve_run(run, root)
    row = _describe(directory) if directory is not None else None
    if directory is None or row is None or row["state"] == UNKNOWN:
        print(f"error: {run!r} is not a run directory (no readable run.json there or under the runs root); "
              "`flashruntime runs` lists them", file=sys.stderr)
        return 2
    del row["_sort"]
    ledger = ledger_of_run(directory)
    document = json.loads((directory / "run.json").read_text())
    trials, failure = _trials_of(document), _failure_of(document)
    if as_json:
        print(json.dumps({**row, "trials": trials, "failure": failure, "goodput": ledger.as_json()}, indent=1))
        return 0
    print(f"run       {row['name']} ({row['path']})")
    print(f"state     {row['state']} ({row['mode'] or '-'}; {row['attempts']} attempts; started {row['started'] or '-'}; "
          f"{_duration(row['duration_s'])})")
    print(f"command   {row['command'] or '-'}")
    if trials:
        from flashruntime.cli.submit import trial_table_text

        metric = (document.get("sweep") or {}).get("metric")
        print()
        print(trial_table_text(trials, metric))
        best = next((trial for trial in trials if trial["best"]), None)
        print(f"best      {best['trial_id']} ({metric} {best['metric']:.6g})" if best is not None
              else f"best      - (no trial reported {metric or 'a metric'})")
    if failure:
        print()
        print(failure)
        print()
    for line in ledger_lines(ledger, label_width=10, steps_logged=logged_steps(document)):
        print(line[2:])
    return 0


def _trials_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's rows, best first, from run.json; [] for a single command or a sweep in a
    shape no flashruntime writes."""
    from flashruntime.local.run import trial_rows

    sweep = document.get("sweep")
    try:
        return trial_rows(sweep) if isinstance(sweep, dict) else []
    except (KeyError, TypeError, ValueError):
        return []


def _failure_of(document: dict[str, Any]) -> str | None:
    """The failure summary of a run that ended FAILED, from its run.json."""
    from flashruntime.local.failure_summary import render_failure_summary
    from flashruntime.recovery import RestartBudget

    if document.get("state") != "FAILED":
        return None
    attempts, events, sweep = document.get("attempts"), document.get("events"), document.get("sweep")
    restarts = document.get("max_restarts")
    try:
        return render_failure_summary(attempts if isinstance(attempts, list) else [],
                                      events if isinstance(events, list) else [],
                                      sweep if isinstance(sweep, dict) else None,
                                      RestartBudget(restarts if isinstance(restarts, int) and restarts >= 0 else 0))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def handle(args: argparse.Namespace) -> int:
    from flashruntime.run_dirs import runs_root

    if args.show is not None:
        return show(args.show, args.root, args.json)

    if args.root is None:
        root = runs_root()
        if not root.exists():  # nothing has run yet: no runs, not an error
            print("[]" if args.json else f"no runs under {root}")
            return 0
    else:
        root = Path(args.root)
    if not root.is_dir():
        print(f"error: --root {str(root)!r} is not a directory", file=sys.stderr)
        return 2
    rows = find_runs(root)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no runs under {root}")
        return 0
    print(f"runs under {root} (`flashruntime runs --show RUN` for one; `flashruntime view RUN` for its page)")
    headers = ("run", "state", "mode", "attempts", "started", "duration", "command")
    table = [(r["name"], r["state"], r["mode"] or "-", "-" if r["attempts"] is None else str(r["attempts"]),
              r["started"] or "-", _duration(r["duration_s"]), _shortened(r["command"] or "-")) for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


COMMAND_SHOWN = 60  # characters of a run's command in the table; --json has all of it


def _shortened(text: str) -> str:
    return text if len(text) <= COMMAND_SHOWN else text[:COMMAND_SHOWN - 1] + "…"


def _duration(seconds: float | str | None) -> str:
    if seconds is None:
        return "-"
    return seconds if isinstance(seconds, str) else f"{seconds}s"
