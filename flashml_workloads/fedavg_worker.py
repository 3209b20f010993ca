"""FedAvg task module: one shard's local training, written as a weight delta.

``python -m flashml_workloads.fedavg_worker --spec spec.json --out OUTDIR`` trains a small MLP
(``Linear → ReLU → Linear``) on a strided shard of seeded synthetic data, starting from the
``weights`` input when given, and writes ``delta.json`` (new − start) and ``metrics.json``.
torch is imported inside functions, so importing this module needs only the standard library.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flashml_workloads import _fedavg_blob as _blob
from flashml_workloads._task_io import task_main
from flashml_workloads.fedavg_weights import decode, encode, require_finite, subtract
from flashruntime.errors import WeightShapeMismatch

__all__ = [
    "PARAM_KEYS",
    "blob_to_state",
    "build_model",
    "centralized_loss",
    "main",
    "run_worker",
    "state_to_blob",
    "union_loss",
]

# Every parameter the worker reads; the service's FEDAVG_WORKER_PARAM_KEYS + FEDAVG_DRIVER_SUPPLIED_KEYS.
PARAM_KEYS = (
    "local_steps", "lr", "batch_size", "seed", "in_dim", "hidden", "out_dim", "dataset_size",
    "round", "shard", "num_shards",
)
_POSITIVE = ("local_steps", "batch_size", "in_dim", "hidden", "dataset_size", "num_shards")


def _params(raw: Mapping[str, Any]) -> dict[str, Any]:
    missing = [key for key in PARAM_KEYS if key not in raw]
    if missing:
        raise ValueError(f"fedavg_worker: missing params {missing}; every one of {list(PARAM_KEYS)} is required")
    params: dict[str, Any] = {}
    for key in PARAM_KEYS:
        value = raw[key]
        if key == "lr":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"fedavg_worker: lr must be a number > 0, got {value!r}")
            params[key] = float(value)
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"fedavg_worker: {key} must be an int, got {value!r}")
        if key in _POSITIVE and value < 1:
            raise ValueError(f"fedavg_worker: {key} must be >= 1, got {value}")
        params[key] = value
    if params["out_dim"] < 2:
        raise ValueError(f"fedavg_worker: out_dim must be >= 2 (labels are 0 and 1), got {params['out_dim']}")
    if not 0 <= params["shard"] < params["num_shards"]:
        raise ValueError(
            f"fedavg_worker: shard must be in [0, num_shards={params['num_shards']}), got {params['shard']}"
        )
    return params


def build_model(params: Mapping[str, Any]) -> Any:
    """``Linear(in_dim, hidden) → ReLU → Linear(hidden, out_dim)`` initialised under ``torch.manual_seed(seed)``."""
    import torch

    torch.manual_seed(int(params["seed"]))
    return torch.nn.Sequential(
        torch.nn.Linear(int(params["in_dim"]), int(params["hidden"])),
        torch.nn.ReLU(),
        torch.nn.Linear(int(params["hidden"]), int(params["out_dim"])),
    )


def state_to_blob(state: Any, *, compact: bool = False) -> dict[str, Any]:
    """A module or state dict → blob (float64 values, row-major)."""
    return _blob_of(_float64_state(state), compact=compact)


def _float64_state(state: Any) -> dict[str, tuple[list[int], Any]]:
    """``{name: (shape, flat float64 copy)}`` of a module's or state dict's tensors (row-major)."""
    if hasattr(state, "state_dict"):
        state = state.state_dict()
    return {name: (list(t.shape), t.detach().to(dtype=_float64()).reshape(-1).clone()) for name, t in state.items()}


def _blob_of(flat_state: Mapping[str, tuple[list[int], Any]], *, compact: bool = False) -> dict[str, Any]:
    """``_float64_state`` output → blob; compact entries read the tensors' bytes, list entries their values."""
    if compact:
        return encode({name: (shape, _buffer_of(flat)) for name, (shape, flat) in flat_state.items()}, compact=True)
    return encode({name: (shape, flat.tolist()) for name, (shape, flat) in flat_state.items()})


def _delta_blob(trained: Mapping[str, Any], start: Mapping[str, Any], *, compact: bool) -> dict[str, Any]:
    """``trained − start`` as a blob. The list form goes through ``subtract``; the compact form
    subtracts float64 tensors (the same IEEE operation per element) and encodes their bytes
    directly, so no Python float is built for the wire."""
    if not compact:
        return subtract(_blob_of(trained), _blob_of(start))
    state = {}
    for name, (shape, after) in trained.items():
        before = start[name][1]
        _require_finite(after, name, "subtract: new")  # the checks and messages of subtract()
        _require_finite(before, name, "subtract: base")
        delta = after - before
        _require_finite(delta, name, "subtract result")
        state[name] = (shape, delta)
    return _blob_of(state, compact=True)


def _require_finite(flat: Any, name: str, where: str) -> None:
    import torch

    finite = torch.isfinite(flat)
    if not bool(finite.all()):
        index = int((~finite).nonzero()[0, 0])
        raise _blob.bad_value(where, name, index, float(flat[index]))


def _buffer_of(flat: Any) -> Any:
    """A float64 CPU tensor's values as a buffer ``encode`` reads in place (numpy when torch has
    it, else a list)."""
    try:
        return flat.numpy()
    except RuntimeError:  # torch built or run without numpy
        return flat.tolist()


def _float64() -> Any:
    import torch

    return torch.float64


def blob_to_state(blob: Mapping[str, Any], reference: Any, *, where: str = "weights") -> dict[str, Any]:
    """Blob → state dict shaped and typed like ``reference`` (a module or state dict).

    The blob is finite-checked and its names and shapes must match the reference's.
    """
    import torch

    if hasattr(reference, "state_dict"):
        reference = reference.state_dict()
    require_finite(dict(blob), where)
    decoded = decode(blob)
    if decoded.keys() != reference.keys():
        raise WeightShapeMismatch(
            f"{where}: parameters {sorted(decoded)} do not match the model's {sorted(reference)}; "
            "the weights must come from the same in_dim/hidden/out_dim"
        )
    state = {}
    for name, ref in reference.items():
        shape, data = decoded[name]
        if shape != list(ref.shape):
            raise WeightShapeMismatch(
                f"{where}: parameter {name!r} has shape {shape} but the model has {list(ref.shape)}"
            )
        if isinstance(data, list):
            values = torch.tensor(data, dtype=torch.float64)
        elif len(data):  # a decoded array('d'): read its bytes, then own a copy
            values = torch.frombuffer(data, dtype=torch.float64).clone()
        else:
            values = torch.zeros(0, dtype=torch.float64)
        state[name] = values.reshape(ref.shape).to(ref.dtype)
    return state


def _dataset(params: Mapping[str, Any]) -> tuple[Any, Any]:
    """Seeded Gaussian ``x`` (dataset_size × in_dim); label 1 where ``x · w > 0`` for a seeded ``w``."""
    import torch

    generator = torch.Generator().manual_seed(int(params["seed"]))
    w = torch.randn(int(params["in_dim"]), generator=generator)
    x = torch.randn(int(params["dataset_size"]), int(params["in_dim"]), generator=generator)
    return x, (x @ w > 0).long()


def _sgd(model: Any, x: Any, y: Any, lr: float, steps: int, batch: int) -> list[float]:
    """``steps`` SGD steps of cross-entropy; batch rows ``(s·batch + j) mod n``."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    n = x.shape[0]
    losses = []
    for step in range(steps):
        index = torch.tensor([(step * batch + j) % n for j in range(batch)])
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def _uses_compact(blob: Mapping[str, Any]) -> bool:
    return any(isinstance(entry, Mapping) and "encoding" in entry for entry in blob.values())


def run_worker(spec: Mapping[str, Any], outdir: str | Path) -> dict[str, Any]:
    """Train one shard and write ``delta.json`` and ``metrics.json`` under ``outdir``; → the metrics."""
    params = _params(spec.get("params") or {})
    inputs = spec.get("inputs") or {}
    model = build_model(params)
    compact = False
    if inputs.get("weights"):
        blob = json.loads(Path(inputs["weights"]).read_text(encoding="utf-8"))
        model.load_state_dict(blob_to_state(blob, model, where="weights input"))
        compact = _uses_compact(blob)  # answer in the form the request used
    x, y = _dataset(params)
    shard, num_shards = params["shard"], params["num_shards"]
    xs, ys = x[shard::num_shards], y[shard::num_shards]
    if xs.shape[0] == 0:
        raise ValueError(
            f"fedavg_worker: shard {shard} of {num_shards} is empty (dataset_size={params['dataset_size']}); "
            "use dataset_size >= num_shards"
        )
    start = _float64_state(model)
    losses = _sgd(model, xs, ys, params["lr"], params["local_steps"], params["batch_size"])
    delta = _delta_blob(_float64_state(model), start, compact=compact)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta.json").write_text(json.dumps(delta), encoding="utf-8")
    metrics = {
        "round": params["round"],
        "shard": shard,
        "samples": int(xs.shape[0]),
        "loss": sum(losses) / len(losses),
        "local_steps": params["local_steps"],
        "delta_file": "delta.json",
    }
    (out / "metrics.json").write_text(json.dumps(metrics, sort_keys=True), encoding="utf-8")
    return metrics


def union_loss(params: Mapping[str, Any], weights: Mapping[str, Any] | None = None) -> float:
    """Mean cross-entropy on the union of all shards of the model with ``weights`` (seeded init when None)."""
    import torch

    checked = _params(params)
    model = build_model(checked)
    if weights:
        model.load_state_dict(blob_to_state(weights, model))
    x, y = _dataset(checked)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y).item())


def centralized_loss(params: Mapping[str, Any], rounds: int) -> float:
    """The reference run: same model and seed, batches of ``batch_size × num_shards`` over the union,
    ``rounds × local_steps`` steps; → the union loss of the result."""
    checked = _params(params)
    model = build_model(checked)
    x, y = _dataset(checked)
    _sgd(model, x, y, checked["lr"], rounds * checked["local_steps"], checked["batch_size"] * checked["num_shards"])
    return union_loss(checked, state_to_blob(model))


def main(argv: list[str] | None = None) -> int:
    """Task-module CLI: ``--spec spec.json --out OUTDIR``; 0 on success, 1 on failure."""
    return task_main("fedavg_worker", argv, run_worker, out_help="output directory (metrics.json, delta.json)")


if __name__ == "__main__":
    sys.exit(main())
