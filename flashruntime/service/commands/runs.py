"""``flashruntime runs``: list local run directories (``viewer_v1`` run.json), newest first."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("runs", help="list local runs under a directory")
    parser.add_argument("--root", default=None, help="directory to search (default: the system temp dir)")
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.set_defaults(handler=handle)


def _describe(directory: Path) -> dict[str, Any] | None:
    path = directory / "run.json"
    if not path.is_file():
        return None
    row: dict[str, Any] = {"path": str(directory), "state": "?", "mode": None, "attempts": None,
                           "started": None, "duration_s": None, "_sort": path.stat().st_mtime}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return row
    if not isinstance(doc, dict):
        return row  # unreadable: listed with state "?"
    if doc.get("contract") != "viewer_v1":
        return None  # some other tool's run.json
    started, finished = doc.get("started_at"), doc.get("finished_at")
    row.update(
        state=doc.get("state", "?"),
        mode=(doc.get("workload") or {}).get("mode"),
        attempts=len(doc.get("attempts") or []),
        started=(datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                 if isinstance(started, (int, float)) else None),
        duration_s=(round(finished - started, 1)
                    if isinstance(started, (int, float)) and isinstance(finished, (int, float)) else None),
        _sort=started if isinstance(started, (int, float)) else row["_sort"],
    )
    return row


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


def handle(args: argparse.Namespace) -> int:
    root = Path(args.root) if args.root else Path(tempfile.gettempdir())
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
    headers = ("path", "state", "mode", "attempts", "started", "duration")
    table = [(r["path"], r["state"], r["mode"] or "-", "-" if r["attempts"] is None else str(r["attempts"]),
              r["started"] or "-", "-" if r["duration_s"] is None else f"{r['duration_s']}s") for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0
