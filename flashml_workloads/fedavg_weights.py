"""Weight blobs and the bounded-influence FedAvg reduce.

A blob is JSON-able: ``{"<param>": {"shape": [...], "data": [...]}}`` (row-major), or the
additive compact entry ``{"shape", "encoding": "f64le-b64", "data_b64"}``. ``reduce_deltas``
averages shard deltas weighted by sample count after capping each one at ``CLIP_FACTOR`` times
the round's median norm. Standard library only; numpy, when importable, speeds the reduce up
with bit-identical results (``accel``).
"""

from __future__ import annotations

import array
import functools
import importlib
import math
import numbers
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import add, mul
from typing import Any, Literal

from flashml_workloads import _fedavg_blob as _blob
from flashml_workloads._fedavg_blob import Blob
from flashml_workloads._fedavg_clip import ClipEvent, clip_decisions
from flashruntime.errors import NonFiniteWeights, WeightShapeMismatch

__all__ = [
    "CLIP_FACTOR",
    "ClipEvent",
    "NonFiniteWeights",
    "WeightShapeMismatch",
    "apply_delta",
    "decode",
    "encode",
    "reduce_deltas",
    "reduce_deltas_with_report",
    "require_finite",
    "subtract",
]

Accel = Literal["auto", "numpy", "pure"]

# Honest per-shard variation sits well inside 3x the median norm, so honest rounds are never altered.
CLIP_FACTOR: float = 3.0


def encode(state: Mapping[str, tuple[Sequence[int], Sequence[float]]], *, compact: bool = False) -> Blob:
    """``{name: (shape, data)}`` → blob; list entries by default, ``f64le-b64`` entries with ``compact``.

    With ``compact``, data that exports a C-contiguous native float64 buffer (``array('d')``, a
    float64 numpy array) is encoded straight from its bytes, counted as ``nbytes // 8`` values;
    anything else is converted value by value. The blob never aliases ``data``. A length that
    disagrees with the shape raises ``WeightShapeMismatch``.
    """
    blob: Blob = {}
    for name, item in state.items():
        try:
            shape, data = item
        except (TypeError, ValueError):
            raise WeightShapeMismatch(
                f"encode: parameter {name!r} must be a (shape, data) pair, got {type(item).__name__}"
            ) from None
        shape_list, size = _blob._shape(name, shape, "encode")
        buffer = _blob.float64_buffer(data) if compact else None
        count = len(buffer) // 8 if buffer is not None else len(data)
        if count != size:
            raise WeightShapeMismatch(
                f"encode: parameter {name!r} has {count} values but shape {shape_list} needs {size}"
            )
        if not compact:
            blob[name] = {"shape": shape_list, "data": list(data)}
            continue
        if buffer is None:
            try:
                if type(data) is list:
                    values = array.array("d")
                    values.fromlist(data)  # ~20 % faster than array("d", data)
                else:
                    values = array.array("d", data)
                buffer = memoryview(values).cast("B")
            except (TypeError, OverflowError, ValueError) as exc:
                raise NonFiniteWeights(
                    f"encode: parameter {name!r} holds a value that is not a float64 ({exc}); "
                    "compact entries carry numbers only"
                ) from None
        blob[name] = {
            "shape": shape_list,
            "encoding": _blob.COMPACT_ENCODING,
            "data_b64": _blob.encode_b64_doubles(buffer),
        }
    return blob


def decode(blob: Mapping[str, Any]) -> dict[str, tuple[list[int], list[float] | array.array]]:
    """Blob → ``{name: (shape, data)}``: a list copy for list entries, an ``array('d')`` for compact ones.

    Structure and lengths are checked (``WeightShapeMismatch``); values are not (see ``require_finite``).
    """
    out: dict[str, tuple[list[int], list[float] | array.array]] = {}
    for name, param in _blob.parse(blob, "decode").items():
        # compact data was freshly decoded by parse, so only list data needs copying
        data = param.data if param.compact else list(param.data)
        out[name] = (list(param.shape), data)
    return out


def require_finite(blob: Blob, where: str) -> Blob:
    """Return ``blob`` unchanged, or raise ``NonFiniteWeights`` naming ``where``, the parameter and the flat index."""
    for param in _blob.parse(blob, where).values():
        _blob.check_finite_param(param, where)
    return blob


def _checked_pair(first: Blob, second: Blob, first_where: str, second_where: str, op: str) -> tuple[
    dict[str, _blob.Param], dict[str, _blob.Param]
]:
    a = _blob.parse(first, f"{op}: {first_where}")
    b = _blob.parse(second, f"{op}: {second_where}")
    _blob.check_same(a, b, f"{op}: {first_where}", f"{op}: {second_where}")
    for params, where in ((a, first_where), (b, second_where)):
        for param in params.values():
            _blob.check_finite_param(param, f"{op}: {where}")
    return a, b


def subtract(new: Blob, base: Blob) -> Blob:
    """``new − base`` per element (list entries), shape-checked; a non-finite result raises."""
    a, b = _checked_pair(new, base, "new", "base", "subtract")
    result = {
        name: {"shape": list(p.shape), "data": list(map(_sub, _blob.floats(p), _blob.floats(b[name])))}
        for name, p in a.items()
    }
    return require_finite(result, "subtract result")


def _sub(x: float, y: float) -> float:
    return x - y


def apply_delta(base: Blob, delta: Blob, scale: float = 1.0) -> Blob:
    """``base + scale·delta`` per element (list entries), shape-checked; a non-finite result raises."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"apply_delta: scale must be a real number, got {scale!r}")
    factor = float(scale)
    a, d = _checked_pair(base, delta, "base", "delta", "apply_delta")
    result = {
        name: {
            "shape": list(p.shape),
            "data": list(map(add, _blob.floats(p), map(mul, repeat(factor), _blob.floats(d[name])))),
        }
        for name, p in a.items()
    }
    return require_finite(result, "apply_delta result")


def _check_clip_factor(clip_factor: Any) -> float:
    valid = (
        not isinstance(clip_factor, bool)
        and isinstance(clip_factor, numbers.Real)
        and math.isfinite(clip_factor)
        and clip_factor > 0
    )
    if not valid:
        raise ValueError(
            f"reduce_deltas: clip_factor must be a finite number > 0, got {clip_factor!r}; "
            f"a bad factor would silently disable the cap (the default is CLIP_FACTOR = {CLIP_FACTOR})"
        )
    return float(clip_factor)


def _sample_weights(contributions: Sequence[Any]) -> tuple[list[Any], list[float]]:
    """Steps 2–4 of non-empty, positive total, every count a positive int."""
    if not contributions:
        raise ValueError("reduce_deltas: no contributions")
    blobs: list[Any] = []
    counts: list[Any] = []
    for index, item in enumerate(contributions):
        try:
            blob, n = item
        except (TypeError, ValueError):
            raise ValueError(
                f"reduce_deltas: contribution {index} must be a (blob, samples) pair, got {type(item).__name__}"
            ) from None
        blobs.append(blob)
        counts.append(n)
    if all(isinstance(n, numbers.Real) for n in counts):
        total = sum(counts)
        if total < 0 or total == 0:
            raise ValueError(
                f"reduce_deltas: the total sample count is {total!r}; it must be > 0 "
                "(every contribution reports how many samples it trained on)"
                + ("; zero total samples leave nothing to weight the deltas by" if total == 0 else "")
            )
    for index, n in enumerate(counts):
        if isinstance(n, float) and not math.isfinite(n):
            raise ValueError(
                f"reduce_deltas: contribution {index} has a non-finite sample count {n!r} "
                "(a non-integer sample count); it must be a positive int"
            )
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(
                f"reduce_deltas: contribution {index} has sample count {n!r} ({type(n).__name__}), "
                "a non-integer sample count; it must be a positive int"
            )
        if n <= 0:
            raise ValueError(
                f"reduce_deltas: contribution {index} has sample count {n}, a non-positive sample count; "
                "it must be > 0"
            )
    total = sum(counts)
    return blobs, [n / total for n in counts]


def _use_numpy(accel: Any) -> bool:
    if accel == "pure":
        return False
    try:
        importlib.import_module("numpy")
    except ImportError:
        if accel == "numpy":
            raise ImportError(
                "reduce_deltas(accel='numpy') needs numpy; install the 'accel' extra "
                "(pip install 'flashruntime[accel]') or pass accel='auto'"
            ) from None
        return False
    return True


def _pure_reduce(blobs: list[Any], weights: list[float], clip_factor: float) -> tuple[Blob, list[ClipEvent]]:
    parsed: list[dict[str, _blob.Param]] = []
    for index, blob in enumerate(blobs):
        where = f"contribution {index}"
        params = _blob.parse(blob, where)
        if parsed:
            _blob.check_same(parsed[0], params, "contribution 0", where)
        for param in params.values():
            _blob.check_finite_param(param, where)
        parsed.append(params)
    values = [{name: _blob.floats(p) for name, p in params.items()} for params in parsed]
    norms = []
    for per_param in values:
        total = 0.0
        for data in per_param.values():
            # a sequential sum of squares in blob order; the fast path reproduces exactly this sum
            total = functools.reduce(add, map(mul, data, data), total)
        norms.append(math.sqrt(total))
    _, events = clip_decisions(norms, clip_factor)
    scales = {event.index: event.scale for event in events}
    result: Blob = {}
    for name, ref in parsed[0].items():
        acc: list[float] = []
        for index, (weight, per_param) in enumerate(zip(weights, values)):
            data = per_param[name]
            if index in scales:
                data = list(map(mul, data, repeat(scales[index])))
            term = map(mul, repeat(weight), data)
            # acc starts from the first term, never 0.0: 0.0 + (-0.0) would lose a signed zero
            acc = list(term) if index == 0 else list(map(add, acc, term))
        result[name] = {"shape": list(ref.shape), "data": acc}
    return result, events


def reduce_deltas_with_report(
    contributions: Sequence[tuple[Blob, int]],
    *,
    clip_factor: float = CLIP_FACTOR,
    accel: Accel = "auto",
) -> tuple[Blob, list[ClipEvent]]:
    """Sample-weighted mean of deltas with median-anchored clipping, and the clip events.

    Checks run in this order (clip factor, non-empty, total, each count, then each blob's
    shapes and values), so malformed input raises before anything is clipped. An honest round is
    bit-identical to an unclipped reduce. The cap bounds magnitude, not direction; a colluding
    majority defeats it, and with two contributions one attacker moves the median directly — it is
    weak there and must not be described as protection.
    """
    factor = _check_clip_factor(clip_factor)
    if accel not in ("auto", "numpy", "pure"):
        raise ValueError(f"reduce_deltas: accel must be 'auto', 'numpy' or 'pure', got {accel!r}")
    blobs, weights = _sample_weights(contributions)
    if _use_numpy(accel):
        from flashml_workloads import _fedavg_numpy

        return _fedavg_numpy.reduce(blobs, weights, factor)
    return _pure_reduce(blobs, weights, factor)


def reduce_deltas(
    contributions: Sequence[tuple[Blob, int]],
    *,
    clip_factor: float = CLIP_FACTOR,
    accel: Accel = "auto",
) -> Blob:
    """``reduce_deltas_with_report(...)[0]``."""
    return reduce_deltas_with_report(contributions, clip_factor=clip_factor, accel=accel)[0]
