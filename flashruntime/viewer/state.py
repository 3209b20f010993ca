"""``collect(run_dir)``: everything the run page shows, read from the run directory.

Total: it never raises. A missing, torn or foreign ``run.json`` gives ``{"error": why}``;
any other unreadable file just contributes nothing. The run is live while this reads
it, so logs and telemetry are tail-read from a bounded window, metrics are read
incrementally (``viewer.series``: only the bytes appended since the last poll, into
curves of a bounded size), and a line that is torn (being written, or cut by the
window) is dropped rather than guessed at.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.local import MANIFEST_NAME, latest_valid_manifest, read_manifest, verify_manifest
from flashruntime.goodput.run import goodput_ledger, step_records
from flashruntime.monitor.progress import FRAMEWORK_METRICS_NAME
from flashruntime.protocol.v1alpha1 import CheckpointValidation
from flashruntime.rank_files import heartbeat_paths
from flashruntime.viewer.series import MetricsCache, MetricsView, ReadBudget, strict_loads
from flashruntime.viewer.tasks import task_view

__all__ = ["collect"]

CONTRACT = "viewer_v1"
WINDOW_BYTES = 256 * 1024
LOG_LINES = 100
TELEMETRY_TICKS = 150
# Kept between polls, so each poll reads only what the metrics files gained since the last.
_METRICS = MetricsCache()
_TRIAL_FILES = 1024
_trial_cache: dict[tuple[str, int, int, int], dict[str, Any] | None] = {}
_trial_lock = threading.Lock()  # several viewers in one process collect at once


def collect(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``run.json`` document enriched for the page, or ``{"error": why}``."""
    try:
        return _collect(Path(run_dir))
    except Exception as exc:  # noqa: BLE001 (total by contract: the page shows the reason instead)
        return {"error": f"could not read the run: {type(exc).__name__}: {exc}"}


def _collect(run_dir: Path) -> dict[str, Any]:
    run_json = run_dir / "run.json"
    try:
        text = run_json.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"error": f"no run.json in {run_dir} (not a run directory, or the run has not started)"}
    except OSError as exc:
        return {"error": f"cannot read {run_json}: {exc.strerror or exc}"}
    try:
        doc = strict_loads(text)
    except ValueError:
        return {"error": f"{run_json} is not valid JSON (torn or being written); retrying"}
    if not isinstance(doc, dict) or doc.get("contract") != CONTRACT:
        found = doc.get("contract") if isinstance(doc, dict) else type(doc).__name__
        return {"error": f"{run_json} is not a {CONTRACT} document (contract {found!r})"}

    now = time.time()
    attempts = [a for a in doc.get("attempts") or [] if isinstance(a, dict)]
    newest_tick: dict[str, Any] | None = None
    attempt_dirs: list[Path] = []
    views: list[MetricsView] = []
    budget = ReadBudget()
    for attempt in attempts:
        attempt_dir = _attempt_dir(run_dir, attempt)
        if attempt_dir is None:
            attempt.update(metrics=[], metrics_records=0, log_tail=[], telemetry=[], ranks=[])
            views.append(MetricsView())
            continue
        attempt_dirs.append(attempt_dir)
        metrics_file = attempt_dir / "metrics.jsonl"
        if not metrics_file.exists() and (attempt_dir / FRAMEWORK_METRICS_NAME).exists():
            metrics_file = attempt_dir / FRAMEWORK_METRICS_NAME  # what the script's framework printed
        view = _METRICS.read(metrics_file, budget)
        views.append(view)
        attempt["metrics"] = view.recent
        attempt["metrics_records"] = view.records
        attempt["log_tail"] = _text_lines(attempt_dir / "launcher.log", LOG_LINES)
        telemetry = _json_lines(attempt_dir / "telemetry.jsonl", TELEMETRY_TICKS)
        attempt["telemetry"] = telemetry
        attempt["ranks"] = _ranks(attempt_dir / "ranks")
        if telemetry and (newest_tick is None or _ts(telemetry[-1]) >= _ts(newest_tick)):
            newest_tick = telemetry[-1]
    shared = doc.get("checkpoint_dir")
    if isinstance(shared, str) and shared:
        roots = [Path(os.path.expanduser(shared))]
    else:  # each job's own tree, shared by its attempts: listed once
        roots = list(dict.fromkeys(attempt_dir.parent / "ckpt" for attempt_dir in attempt_dirs))
    doc["attempts"] = attempts
    doc["checkpoints"] = sorted(
        (entry for root in roots for entry in _checkpoints(root, now)),
        key=lambda entry: (entry["job_id"], entry["step"]),
    )
    doc["monitor"] = newest_tick
    doc["view"] = task_view(doc, attempts, views, lambda index: _trial_file(run_dir, attempts[index]))
    doc["goodput"] = _goodput(run_dir, doc, attempt_dirs, now)
    doc["now"] = now
    return doc


# The goodput ledger reads every metrics.jsonl whole: for a live run it is worked out on each
# poll only while they are small; a finished run's is worked out once and kept.
GOODPUT_LIVE_BYTES = 8 * 1024 * 1024
_GOODPUT_CACHE: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}


def _goodput(run_dir: Path, doc: dict[str, Any], attempt_dirs: list[Path], now: float) -> dict[str, Any] | None:
    """The run's goodput ledger (``flashruntime.goodput.run``), or None while a live run's
    metrics are too large to read whole on every poll."""
    sizes = []
    for attempt_dir in attempt_dirs:
        try:
            sizes.append((attempt_dir / "metrics.jsonl").stat().st_size)
        except OSError:
            sizes.append(-1)
    finished = isinstance(doc.get("finished_at"), (int, float))
    key = (int(finished), len(doc.get("events") or []), *sizes)
    cached = _GOODPUT_CACHE.get(str(run_dir))
    if cached is not None and cached[0] == key:
        return cached[1]
    if not finished and sum(max(0, size) for size in sizes) > GOODPUT_LIVE_BYTES:
        return None
    def records(row: dict[str, Any]) -> Any:
        attempt_dir = _attempt_dir(run_dir, row)
        return iter(()) if attempt_dir is None else step_records(attempt_dir / "metrics.jsonl")

    ledger = goodput_ledger(doc, records, now=now).as_json()
    if len(_GOODPUT_CACHE) > 64:
        _GOODPUT_CACHE.clear()
    _GOODPUT_CACHE[str(run_dir)] = (key, ledger)
    return ledger


def _attempt_dir(run_dir: Path, attempt: dict[str, Any]) -> Path | None:
    raw = attempt.get("output_dir")
    if not isinstance(raw, str) or not raw:
        return None
    path = Path(raw)
    return path if path.is_absolute() else run_dir / path


def _trial_file(run_dir: Path, attempt: dict[str, Any]) -> dict[str, Any] | None:
    """The attempt's ``metrics.json`` (None when absent, torn or not an object), read again
    only when its size or modification time changed."""
    attempt_dir = _attempt_dir(run_dir, attempt)
    if attempt_dir is None:
        return None
    path = attempt_dir / "metrics.json"
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
            with _trial_lock:
                if key in _trial_cache:
                    return _trial_cache[key]
            try:
                content = strict_loads(handle.read(WINDOW_BYTES))
            except ValueError:
                content = None
    except OSError:
        return None
    content = content if isinstance(content, dict) else None
    with _trial_lock:
        if len(_trial_cache) >= _TRIAL_FILES:
            _trial_cache.pop(next(iter(_trial_cache)))
        _trial_cache[key] = content
    return content


def _ts(record: dict[str, Any]) -> float:
    value = record.get("ts")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("-inf")


# --- bounded tail reads -------------------------------------------------------------


def _tail_lines(path: Path) -> list[bytes]:
    """Complete lines of the file's last ``WINDOW_BYTES``: a first line cut by the window
    and a last line without its newline (still being written) are dropped."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size - WINDOW_BYTES)
            handle.seek(start)
            data = handle.read(WINDOW_BYTES)
    except OSError:
        return []
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line still being written
    if start > 0 and lines:
        lines.pop(0)  # begins mid-line
    return lines


def _json_lines(path: Path, keep: int) -> list[dict[str, Any]]:
    records = []
    for line in _tail_lines(path):
        try:
            record = strict_loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records[-keep:]


def _text_lines(path: Path, keep: int) -> list[str]:
    return [line.decode("utf-8", errors="replace").rstrip("\r") for line in _tail_lines(path)[-keep:]]


def _ranks(ranks_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in heartbeat_paths(ranks_dir):
        try:
            with open(path, "rb") as handle:
                record = strict_loads(handle.read(WINDOW_BYTES))
        except (OSError, ValueError):
            continue  # mid-replace or torn: the next poll sees it
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            found.append(record)
    return sorted(found, key=lambda record: record["rank"])


# --- checkpoints --------------------------------------------------------------------


def _checkpoints(root: Path, now: float) -> list[dict[str, Any]]:
    """Every ``step-*/manifest.json`` under ``root``, verified now (through the hash
    cache), with ``latest_valid`` on the one recovery picks (``latest_valid_manifest``)."""
    try:
        paths = sorted(glob.glob(os.path.join(glob.escape(str(root)), "step-*", MANIFEST_NAME)))
    except (OSError, ValueError):
        return []
    pick = latest_valid_manifest(root) if paths else None  # re-verifies from the hash cache
    entries: list[dict[str, Any]] = []
    for path in paths:
        manifest = read_manifest(path)
        if manifest is None:
            continue
        verified = manifest.validation != CheckpointValidation.INVALID and verify_manifest(
            manifest, os.path.dirname(path))
        starred = verified and pick is not None and (manifest.manifest_id, manifest.step) == (pick.manifest_id, pick.step)
        entries.append({
            "job_id": manifest.job_id,
            "step": manifest.step,
            "validation": "hash_verified" if verified else "invalid",
            "parts": len(manifest.parts),
            "age_s": round(max(0.0, now - manifest.created.timestamp()), 1),
            "latest_valid": starred,
        })
        if starred:
            pick = None  # one star, on the first directory in recovery's order
    return entries
