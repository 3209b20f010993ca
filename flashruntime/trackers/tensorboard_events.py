"""A local run's metrics as TensorBoard event files, written with TensorBoard's own writer.

``write_run_events(run_dir, logdir)`` reads what the run recorded — its ``run.json``, each
attempt's ``metrics.jsonl`` (else the curves read from its output,
``framework-metrics.jsonl``), each trial's final figures — and writes them under
``<logdir>/<run name>/`` (a sweep: one directory per trial, ``<logdir>/<run name>/<trial>/``),
so ``tensorboard --logdir <logdir>`` compares runs and trials side by side.
``write_task_events`` writes one task of a coordinator job the same way, from the files its
worker uploaded. Every number of a
step record is a scalar at its step and wall time (a relaunch's recomputed steps included, as
they ran); a trial's final figures are scalars under ``final/``; its parameters a text
summary. Writing again replaces the event files written before, so the directory always
shows the run as it ended. Needs the ``tensorboard`` extra.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flashruntime.errors import ModuleUnavailable
from flashruntime.trackers.run_records import figures, read_run, step_records

__all__ = ["EVENT_FILE_SUFFIX", "TENSORBOARD_DIR_ENV", "write_run_events", "write_task_events"]

TENSORBOARD_DIR_ENV = "FLASHML_TENSORBOARD_DIR"
EVENT_FILE_SUFFIX = ".flashruntime"  # ours, so writing again removes ours only


def _writer_class() -> Any:
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise ModuleUnavailable("writing TensorBoard event files needs tensorboard: pip install "
                                "'flashruntime[tensorboard]' (or pip install tensorboard)") from None
    return EventFileWriter


class _Events:
    """One directory's event file: scalars and text, each at a step and a wall time."""

    def __init__(self, directory: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

        self._pb = (event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2)
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob(f"events.out.tfevents.*{EVENT_FILE_SUFFIX}"):
            old.unlink()
        self._writer = _writer_class()(str(directory), filename_suffix=EVENT_FILE_SUFFIX)

    def scalar(self, tag: str, value: float, step: int, wall_time: float) -> None:
        event_pb2, summary_pb2, _, _ = self._pb
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        self._writer.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def text(self, tag: str, text: str, wall_time: float) -> None:
        event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2 = self._pb
        tensor = tensor_pb2.TensorProto(dtype=7, string_val=[text.encode("utf-8")],  # 7: DT_STRING
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto())
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)
        self._writer.add_event(event_pb2.Event(wall_time=wall_time, step=0, summary=summary_pb2.Summary(value=[value])))

    def close(self) -> None:
        self._writer.close()


def _write_one(directory: Path, steps_files: Iterable[Path | None], final: dict[str, Any] | None,
               params: dict[str, Any] | None, ended_at: float) -> Path:
    events = _Events(directory)
    last_step, last_time = 0, ended_at
    try:
        if params:
            events.text("params", json.dumps(params, sort_keys=True, default=str), ended_at)
        for steps_file in steps_files:
            for step, ts, record in step_records(steps_file):
                wall_time = ts if ts is not None else ended_at
                for tag, value in figures(record):
                    events.scalar(tag, value, step, wall_time)
                last_step, last_time = max(last_step, step), wall_time
        for tag, value in figures(final or {}):
            events.scalar(f"final/{tag}", value, last_step, max(last_time, ended_at))
    finally:
        events.close()
    return directory


def write_task_events(logdir: str | os.PathLike[str], run_name: str, task_id: str, steps_file: Path | None,
                      final: dict[str, Any] | None, params: dict[str, Any] | None, ended_at: float) -> Path:
    """Write one coordinator task under ``<logdir>/<run_name>/<task_id>/``: the steps of its
    accepted attempt (``steps_file``, its uploaded ``metrics.jsonl``, when it has one), its
    final figures (``metrics.json``) and its parameters, as a trial of a local sweep is
    written. ``ModuleUnavailable`` without tensorboard."""
    _writer_class()
    return _write_one(Path(logdir) / run_name / task_id, [steps_file], final, params, ended_at)


def write_run_events(run_dir: str | os.PathLike[str], logdir: str | os.PathLike[str]) -> list[Path]:
    """Write the run in ``run_dir`` under ``logdir`` (see the module); returns the directories
    written, one per trial of a sweep, else one. ``ModuleUnavailable`` without tensorboard."""
    _writer_class()
    recorded = read_run(run_dir)
    root = Path(logdir) / recorded.name
    if recorded.sweep is None:
        (whole,) = recorded.parts
        return [_write_one(root, whole.steps_files, whole.final, None, whole.ended_at)]
    return [_write_one(root / str(part.trial_id), part.steps_files, part.final, part.params, part.ended_at)
            for part in recorded.parts]
