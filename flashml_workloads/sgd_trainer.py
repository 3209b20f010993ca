"""SGD task module: deterministic logistic regression with resumable JSON checkpoints.

``python -m flashml_workloads.sgd_trainer --spec spec.json --out OUTDIR`` trains a binary logistic
regression on the ``dataset`` input with minibatch SGD, writes ``OUTDIR/ckpt/step-<s:06d>.json``
every ``checkpoint_every`` updates and ``OUTDIR/metrics.json`` last. A ``resume`` input continues a
run from one of those checkpoints with bit-identical results. A ``seed`` param shuffles the row order
and draws the initial weights from it. Pure Python: standard library only.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flashml_workloads._task_io import data_rows, task_main, write_json_atomic

__all__ = [
    "BATCH",
    "CKPT_DIR",
    "KILL_EXIT_CODE",
    "PARAM_KEYS",
    "SimulatedCrash",
    "checkpoint_name",
    "load_dataset",
    "log_loss",
    "main",
    "run_trainer",
]

BATCH = 4
CKPT_DIR = "ckpt"
KILL_EXIT_CODE = 3
PARAM_KEYS = ("steps", "checkpoint_every", "lr", "kill_at_step", "seed")
_DEFAULTS = {"checkpoint_every": 100, "lr": 0.1, "kill_at_step": None, "seed": None}
_INIT_SCALE = 0.01  # the standard deviation of a seeded run's initial weights
_PROG = "sgd_trainer"


class SimulatedCrash(SystemExit):
    """``kill_at_step`` fired: the process ends with exit code 3, like a crashed trainer.

    A ``SystemExit``, so an ``except Exception`` in a caller cannot swallow the crash; ``main``
    turns it into its return value 3.
    """

    def __init__(self, step: int) -> None:
        super().__init__(KILL_EXIT_CODE)
        self.step = step

    def __str__(self) -> str:
        return f"kill_at_step={self.step} reached: crashing with exit code {KILL_EXIT_CODE} (fault injection)"


def checkpoint_name(step: int) -> str:
    """``step-<step:06d>.json``: the file holding the weights after ``step`` updates."""
    return f"step-{step:06d}.json"


# --------------------------------------------------------------------------- params and inputs


def _int_param(raw: Mapping[str, Any], key: str, minimum: int, hint: str) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{_PROG}: params.{key} is {value!r}; it must be an integer >= {minimum} ({hint})")
    return value


def _params(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{_PROG}: params must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in PARAM_KEYS)
    if unknown:
        raise ValueError(f"{_PROG}: unknown params {unknown}; the accepted params are {list(PARAM_KEYS)}")
    if "steps" not in raw:
        raise ValueError(f"{_PROG}: params.steps is required: give the number of SGD updates (an integer >= 1)")
    params: dict[str, Any] = {**_DEFAULTS, **raw}
    params["steps"] = _int_param(params, "steps", 1, "the number of SGD updates")
    params["checkpoint_every"] = _int_param(params, "checkpoint_every", 1, "updates between checkpoints; default 100")
    lr = params["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{_PROG}: params.lr is {lr!r}; it must be a finite number > 0 (default 0.1)")
    params["lr"] = float(lr)
    if params["kill_at_step"] is not None:
        kill = _int_param(params, "kill_at_step", 1, "fault injection: omit it or give a step in 1..steps")
        if kill > params["steps"]:
            raise ValueError(
                f"{_PROG}: params.kill_at_step is {kill} but steps is {params['steps']}; the crash could never "
                "happen: give a step in 1..steps or omit kill_at_step"
            )
    seed = params["seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"{_PROG}: params.seed is {seed!r}; it must be an integer (or absent: rows in file order, "
                         "zero initial weights)")
    return params


def load_dataset(path: str | Path) -> tuple[list[list[float]], list[float]]:
    """Read a CSV of numeric feature columns with a 0/1 label in the last column → ``(x, y)``.

    Blank lines are skipped. The first non-blank line is a header, and skipped, when one of its
    feature fields is not a number. Labels are parsed as numbers and must equal 0 or 1 (``1``,
    ``1.0`` and ``1e0`` are all class 1); anything else is refused, as are non-finite values and
    rows whose column count differs from the first row's.
    """
    file = Path(path)
    x: list[list[float]] = []
    y: list[float] = []
    for number, row in data_rows(file, _PROG, "the 0/1 label"):
        try:
            values = [float(field) for field in row]
        except ValueError:
            raise ValueError(
                f"{_PROG}: dataset {str(file)!r} line {number} has a non-numeric field ({row!r}); features are "
                "numbers and the label is 0 or 1"
            ) from None
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"{_PROG}: dataset {str(file)!r} line {number} has a NaN or infinite value ({row!r})")
        label = values[-1]
        if label not in (0.0, 1.0):
            raise ValueError(
                f"{_PROG}: dataset {str(file)!r} line {number} has label {row[-1].strip()!r}; logistic regression "
                "needs 0/1 labels in the last column (map your classes to 0 and 1)"
            )
        x.append(values[:-1])
        y.append(label)
    return x, y


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _load_resume(path: str | Path, steps: int, n_features: int, seed: int | None) -> tuple[int, list[float], float]:
    file = Path(path)
    where = f"{_PROG}: inputs.resume {str(file)!r}"
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not a readable JSON checkpoint ({exc}); give a ckpt/step-*.json file") from None
    if not isinstance(state, dict) or not {"step", "weights", "bias"} <= state.keys():
        raise ValueError(f'{where} must be a JSON object with "step", "weights" and "bias" (a ckpt/step-*.json file)')
    step, weights, bias = state["step"], state["weights"], state["bias"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= steps:
        raise ValueError(f"{where} has step {step!r}; it must be an integer in 0..steps ({steps})")
    if not isinstance(weights, list) or not all(_finite_number(w) for w in weights):
        raise ValueError(f"{where} has weights {weights!r}; they must be a list of finite numbers")
    if len(weights) != n_features:
        raise ValueError(
            f"{where} has {len(weights)} weights but the dataset has {n_features} feature columns; resume with a "
            "checkpoint of a run on the same dataset"
        )
    if not _finite_number(bias):
        raise ValueError(f"{where} has bias {bias!r}; it must be a finite number")
    if state.get("seed") != seed:
        raise ValueError(
            f"{where} was written by a run with seed {state.get('seed')!r}, but params.seed is {seed!r}; the seed "
            "orders the rows, so resume with the seed of the run that wrote the checkpoint"
        )
    return step, [float(w) for w in weights], float(bias)


def _seeded(x: list[list[float]], y: list[float], seed: int | None) -> tuple[
    list[list[float]], list[float], list[float]
]:
    """``(x, y, initial weights)``: without a seed the rows in file order and zero weights; with one,
    the rows in the order ``random.Random(seed)`` shuffles them and weights drawn from N(0, 0.01²)
    by the same generator."""
    if seed is None:
        return x, y, [0.0] * len(x[0])
    rng = random.Random(seed)
    order = list(range(len(x)))
    rng.shuffle(order)
    return [x[i] for i in order], [y[i] for i in order], [rng.gauss(0.0, _INIT_SCALE) for _ in x[0]]


# --------------------------------------------------------------------------- the model


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _softplus(z: float) -> float:
    """``log(1 + exp(z))`` without overflow."""
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


def _logit(weights: Sequence[float], bias: float, row: Sequence[float]) -> float:
    z = bias
    for w, v in zip(weights, row, strict=True):
        z += w * v
    return z


def log_loss(x: Sequence[Sequence[float]], y: Sequence[float], weights: Sequence[float], bias: float) -> float:
    """Mean binary log-loss (natural log) of ``sigmoid(x·w + b)`` over every row."""
    total = 0.0
    for row, label in zip(x, y, strict=True):
        z = _logit(weights, bias, row)
        total += _softplus(z) - label * z
    return total / len(x)


def _sgd_step(
    x: Sequence[Sequence[float]], y: Sequence[float], weights: list[float], bias: float, lr: float, step: int,
) -> float:
    """One update in place on ``weights``, using batch ``step`` (0-based); → the new bias.

    The batch is rows ``(step·BATCH + j) mod n`` for ``j < BATCH`` and the gradient is the batch mean
    of the log-loss gradient, summed in a fixed order, so equal inputs give bit-equal results."""
    n = len(x)
    grad_w = [0.0] * len(weights)
    grad_b = 0.0
    for j in range(BATCH):
        i = (step * BATCH + j) % n
        row = x[i]
        error = _sigmoid(_logit(weights, bias, row)) - y[i]
        for k, v in enumerate(row):
            grad_w[k] += error * v
        grad_b += error
    for k in range(len(weights)):
        weights[k] -= lr * (grad_w[k] / BATCH)
    return bias - lr * (grad_b / BATCH)


def _require_finite(weights: Sequence[float], bias: float, step: int, lr: float) -> None:
    if not (math.isfinite(bias) and all(math.isfinite(w) for w in weights)):
        raise ValueError(f"{_PROG}: training diverged (non-finite weights after {step} updates); lower lr (got {lr})")


# --------------------------------------------------------------------------- files


def _task_id(spec: Mapping[str, Any]) -> str | None:
    task_id = spec.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise ValueError(f"{_PROG}: task_id is {task_id!r}; it must be a string (or absent)")
    return task_id


def run_trainer(spec: Mapping[str, Any], out: str | Path) -> dict[str, Any]:
    """Train, checkpoint and write ``metrics.json`` under ``out``; → the metrics.

    Steps are counted by updates done: update ``s`` (0-based) uses batch ``s``, and
    ``ckpt/step-<c:06d>.json = {"step": c, "weights", "bias"}`` (and ``"seed"`` of a seeded run)
    holds the model after ``c`` updates, written for every ``c`` that is a multiple of
    ``checkpoint_every`` with ``start < c < steps``.
    A ``resume`` checkpoint at step ``c`` continues with update ``c``; since every float is stored
    exactly (JSON floats round-trip) and batches depend only on the step, the final weights are
    bit-identical to an uninterrupted run with the same dataset, ``lr`` and ``seed``.

    ``seed`` (an int, optional): the rows are shuffled by ``random.Random(seed)`` before batching
    and the initial weights drawn from it (bias 0), so one seed gives one result and another seed
    another. Without it, rows keep the file's order and the weights start at zero. A seeded run's
    checkpoints record its seed; resuming under a different one (or none) is refused.

    ``kill_at_step = k`` (fresh runs only; ignored with ``resume``): once ``k`` updates are done,
    and before the checkpoint due at ``k`` (if any) is written, raises ``SimulatedCrash`` (exit code
    3), so the newest checkpoint is the last multiple of ``checkpoint_every`` below ``k``.

    ``metrics.json`` (written last, atomically) has ``task_id``, ``steps``, ``started_from_step``,
    ``resumed``, ``final_loss`` — the mean log-loss (natural log) of the final model over the
    whole dataset —, ``weights`` and ``bias``. Raises ``ValueError`` on bad params or inputs.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"{_PROG}: the spec must be a JSON object with task_id, params and inputs")
    task_id = _task_id(spec)
    params = _params(spec.get("params") or {})
    inputs = spec.get("inputs") or {}
    if not isinstance(inputs, Mapping) or not inputs.get("dataset"):
        raise ValueError(
            f"{_PROG}: inputs.dataset is required: give the local path of a CSV (label in the last column)"
        )
    for name in ("dataset", "resume"):
        if inputs.get(name) is not None and not isinstance(inputs[name], str):
            raise ValueError(f"{_PROG}: inputs.{name} is {inputs[name]!r}; it must be a local file path (a string)")
    steps, every, lr, seed = params["steps"], params["checkpoint_every"], params["lr"], params["seed"]
    x, y, weights = _seeded(*load_dataset(inputs["dataset"]), seed)
    resumed = bool(inputs.get("resume"))
    if resumed:
        start, weights, bias = _load_resume(inputs["resume"], steps, len(x[0]), seed)
    else:
        start, bias = 0, 0.0
    kill_at = None if resumed else params["kill_at_step"]
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    for step in range(start, steps):
        bias = _sgd_step(x, y, weights, bias, lr, step)
        done = step + 1
        if done == kill_at:
            raise SimulatedCrash(done)
        if done % every == 0 and done < steps:
            _require_finite(weights, bias, done, lr)
            state = {"step": done, "weights": weights, "bias": bias}
            if seed is not None:  # an unseeded run's checkpoints keep the three keys they always had
                state["seed"] = seed
            write_json_atomic(outdir / CKPT_DIR / checkpoint_name(done), state)
    _require_finite(weights, bias, steps, lr)
    metrics = {
        "task_id": task_id,
        "steps": steps,
        "started_from_step": start,
        "resumed": resumed,
        "final_loss": log_loss(x, y, weights, bias),
        "weights": list(weights),
        "bias": bias,
    }
    write_json_atomic(outdir / "metrics.json", metrics)
    return metrics


def main(argv: list[str] | None = None) -> int:
    """Task-module CLI: ``--spec spec.json --out OUTDIR``; 0 on success, 1 on failure,
    3 when ``kill_at_step`` fired."""
    return task_main("sgd_trainer", argv, run_trainer, out_help="output directory (metrics.json, ckpt/)",
                     exit_codes={SimulatedCrash: KILL_EXIT_CODE})


if __name__ == "__main__":
    sys.exit(main())
