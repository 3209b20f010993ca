"""The numpy fast path of ``reduce_deltas``, bit-identical to the pure path.

Same checks in the same order (errors are raised by the pure helpers, so messages match),
the same sequential sum of squares (``np.add.accumulate`` carries the running total across
parameters), the same clip decisions and the same per-element operations in contribution
order (``acc = w₀·x₀``, then ``acc = acc + wᵢ·xᵢ``). Imported only when numpy is.
"""

from __future__ import annotations

import array as pyarray  # ``array`` names the numpy arrays below
import math
from typing import Any

import numpy as np

from flashml_workloads import _fedavg_blob as _blob
from flashml_workloads._fedavg_blob import Blob
from flashml_workloads._fedavg_clip import ClipEvent, clip_decisions

_EXACT_DTYPES = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_))


def _as_array(param: _blob.Param, where: str) -> Any:
    """float64 array of the parameter's values after the pure path's finite check.

    ``np.asarray`` without a dtype keeps strings, ``None`` and huge ints out of float64
    (they give other dtypes); those fall back to the pure check, which raises the same error
    the pure path would, or to ``float()`` conversion for exotic but valid numbers. ``true`` and
    ``false`` mixed with numbers do become 1.0 and 0.0, so those two values are looked up in
    the list (only they can hide a bool, so honest data pays one vectorised comparison).
    """
    if param.compact:
        array = np.frombuffer(param.data, dtype=np.float64)
    else:
        array = np.asarray(param.data)
        if array.ndim != 1 or array.dtype not in _EXACT_DTYPES:
            _blob.check_finite_param(param, where)
            return np.array(list(map(float, param.data)), dtype=np.float64)
        if array.dtype == np.bool_ or _holds_bool(param.data, array):
            _blob.check_finite_param(param, where)  # raises, naming the flat index
        if array.dtype != np.float64:
            array = array.astype(np.float64)
    if not np.isfinite(array).all():
        _blob.check_finite_param(param, where)  # raises, naming the flat index
    return array


def _holds_bool(data: Any, array: Any) -> bool:
    """Whether a Python ``bool`` sits at one of the positions where ``array`` reads 0 or 1."""
    if isinstance(data, pyarray.array):
        return False
    positions = np.flatnonzero((array == 0) | (array == 1))
    return any(type(data[i]) is bool for i in positions.tolist())


def _norm(arrays: list[Any]) -> float:
    """sqrt of the sequential sum of squares over the parameters in blob order (pure-path value)."""
    total = 0.0
    for array in arrays:
        if array.size == 0:
            continue
        squares = np.multiply(array, array)
        squares[0] = total + squares[0]
        np.add.accumulate(squares, out=squares)
        total = float(squares[-1])
    return math.sqrt(total)


def reduce(blobs: list[Any], weights: list[float], clip_factor: float) -> tuple[Blob, list[ClipEvent]]:
    """Check, clip and average ``blobs`` (counts already validated into ``weights``)."""
    # finite values can still overflow a square or a sum; the pure path yields inf silently, so must we
    with np.errstate(over="ignore", invalid="ignore"):
        return _reduce(blobs, weights, clip_factor)


def _reduce(blobs: list[Any], weights: list[float], clip_factor: float) -> tuple[Blob, list[ClipEvent]]:
    parsed: list[dict[str, _blob.Param]] = []
    arrays: list[dict[str, Any]] = []
    for index, blob in enumerate(blobs):
        where = f"contribution {index}"
        params = _blob.parse(blob, where)
        if parsed:
            _blob.check_same(parsed[0], params, "contribution 0", where)
        arrays.append({name: _as_array(p, where) for name, p in params.items()})
        parsed.append(params)
    norms = [_norm(list(per_param.values())) for per_param in arrays]
    _, events = clip_decisions(norms, clip_factor)
    scales = {event.index: event.scale for event in events}
    result: Blob = {}
    for name, ref in parsed[0].items():
        acc = None
        scratch = None
        for index, (weight, per_param) in enumerate(zip(weights, arrays)):
            data = per_param[name]
            if index in scales:
                data = np.multiply(data, scales[index])
            if acc is None:
                acc = np.multiply(data, weight)  # the first term, never 0.0 + term (signed zeros)
                scratch = np.empty_like(acc)
            else:
                np.multiply(data, weight, out=scratch)
                np.add(acc, scratch, out=acc)
        result[name] = {"shape": list(ref.shape), "data": acc.tolist()}
    return result, events
