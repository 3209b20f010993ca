"""Parsing and value checks of FedAvg weight blobs, standard library only.

A blob maps parameter names to list entries ``{"shape", "data"}`` or compact entries
``{"shape", "encoding": "f64le-b64", "data_b64"}``. ``parse`` validates the structure
and turns either form into a ``Param`` whose ``data`` is a float sequence; the value
checks (finite numbers) are separate so callers can run the checks in their documented order.
"""

from __future__ import annotations

import array
import binascii
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from flashruntime.errors import NonFiniteWeights, WeightShapeMismatch

Blob = dict[str, dict[str, Any]]

COMPACT_ENCODING = "f64le-b64"
_LIST_TYPES = (list, tuple, array.array)
_BIG_ENDIAN = sys.byteorder == "big"


class Param(NamedTuple):
    """One parameter of a parsed blob: ``data`` is the caller's list or a decoded ``array('d')``."""

    name: str
    shape: list[int]
    size: int
    data: Sequence[Any]
    compact: bool


def _shape(name: str, raw: Any, where: str) -> tuple[list[int], int]:
    if not isinstance(raw, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
    ):
        raise WeightShapeMismatch(
            f"{where}: parameter {name!r} has shape {raw!r}; a shape must be a list of non-negative integers"
        )
    size = 1
    for d in raw:
        size *= d
    return list(raw), size


def decode_b64_doubles(text: Any, name: str, where: str) -> array.array:
    """Decode a ``data_b64`` field into a native-order ``array('d')``; undecodable → mismatch."""
    if not isinstance(text, (str, bytes)):
        raise WeightShapeMismatch(
            f"{where}: parameter {name!r} has data_b64 of type {type(text).__name__}; it must be a base64 string"
        )
    try:
        if sys.version_info >= (3, 11):
            raw = binascii.a2b_base64(text, strict_mode=True)
        else:  # pragma: no cover - 3.10 lacks strict_mode; b64decode's validate is the same rule
            import base64

            raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise WeightShapeMismatch(
            f"{where}: parameter {name!r} has undecodable data_b64 ({exc}); it must be standard padded base64"
        ) from None
    if len(raw) % 8:
        raise WeightShapeMismatch(
            f"{where}: parameter {name!r} decodes to {len(raw)} bytes, not a whole number of float64 values"
        )
    values = array.array("d")
    values.frombytes(raw)
    if _BIG_ENDIAN:  # pragma: no cover - the wire is little-endian; array uses the host order
        values.byteswap()
    return values


_NATIVE_DOUBLE_FORMATS = frozenset({"d", "@d", "=d", ">d" if _BIG_ENDIAN else "<d"})


def float64_buffer(data: Any) -> memoryview | None:
    """``data``'s bytes when it exports a C-contiguous buffer of native float64 (``array('d')``,
    a float64 numpy array, a CPU tensor's ``.numpy()``), else None; no value is copied."""
    if isinstance(data, (list, tuple, str, bytes, bytearray)):
        return None
    try:
        view = memoryview(data)
    except TypeError:
        return None
    if view.format not in _NATIVE_DOUBLE_FORMATS or not view.c_contiguous:
        return None
    return view.cast("B")


def encode_b64_doubles(values: array.array | memoryview) -> str:
    """Little-endian float64 bytes of ``values`` (an ``array('d')`` or a ``float64_buffer``) as
    base64 text without line breaks."""
    if _BIG_ENDIAN:  # pragma: no cover - see decode_b64_doubles
        swapped = array.array("d")
        swapped.frombytes(values)
        swapped.byteswap()
        values = swapped
    return binascii.b2a_base64(values, newline=False).decode("ascii")  # reads the buffer in place


def parse(blob: Any, where: str) -> dict[str, Param]:
    """Validate a blob's structure; data length must equal the product of the shape."""
    if not isinstance(blob, Mapping):
        raise WeightShapeMismatch(
            f"{where}: a weight blob must be an object mapping parameter names to entries, "
            f"got {type(blob).__name__}"
        )
    params: dict[str, Param] = {}
    for name, entry in blob.items():
        if not isinstance(name, str):
            raise WeightShapeMismatch(f"{where}: parameter name {name!r} must be a string")
        if not isinstance(entry, Mapping) or "shape" not in entry:
            raise WeightShapeMismatch(
                f"{where}: parameter {name!r} must be an object with 'shape' and 'data' "
                f"(or 'encoding' and 'data_b64'), got {type(entry).__name__}"
            )
        shape, size = _shape(name, entry["shape"], where)
        if "encoding" in entry:
            if entry["encoding"] != COMPACT_ENCODING:
                raise WeightShapeMismatch(
                    f"{where}: parameter {name!r} uses unknown encoding {entry['encoding']!r}; "
                    f"the only compact encoding is {COMPACT_ENCODING!r}"
                )
            data: Sequence[Any] = decode_b64_doubles(entry.get("data_b64"), name, where)
            compact = True
        else:
            data = entry.get("data")
            if not isinstance(data, _LIST_TYPES):
                raise WeightShapeMismatch(
                    f"{where}: parameter {name!r} has data of type {type(data).__name__}; data must be a list"
                )
            compact = False
        if len(data) != size:
            raise WeightShapeMismatch(
                f"{where}: parameter {name!r} has {len(data)} values but shape {shape} needs {size}"
            )
        params[name] = Param(name, shape, size, data, compact)
    return params


def check_same(ref: dict[str, Param], other: dict[str, Param], ref_where: str, where: str) -> None:
    """Identical parameter-name sets and identical shapes, else ``WeightShapeMismatch``."""
    if ref.keys() != other.keys():
        missing = sorted(ref.keys() - other.keys())
        extra = sorted(other.keys() - ref.keys())
        raise WeightShapeMismatch(
            f"{where} and {ref_where} describe different parameters (missing {missing}, extra {extra}); "
            "both must carry exactly the same parameter names"
        )
    for name, param in other.items():
        if param.shape != ref[name].shape:
            raise WeightShapeMismatch(
                f"{where}: parameter {name!r} has shape {param.shape} but {ref_where} has {ref[name].shape}"
            )


def bad_value(where: str, name: str, index: int, value: Any) -> NonFiniteWeights:
    """The error for ``value`` at flat (row-major) ``index`` of parameter ``name``, after ``where``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            what = f"a non-finite value {float(value)!r}"
        except OverflowError:
            what = "an integer too large for float64"
    else:
        what = f"a non-numeric value {value!r} ({type(value).__name__})"
    return NonFiniteWeights(
        f"{where}: {name!r} index {index} is not finite: it holds {what} (the index counts the parameter's "
        "values in row-major order); non-finite values cannot be averaged or applied, so weights must be finite "
        "numbers (look for a diverged or corrupted producer)"
    )


def check_finite_param(param: Param, where: str) -> None:
    """Raise ``NonFiniteWeights`` naming ``where``, the parameter and the flat index of the first bad value.

    ``true``/``false`` are not numbers here although ``math.isfinite`` takes them (as 1 and 0).
    """
    data = param.data
    try:
        if all(map(math.isfinite, data)) and (isinstance(data, array.array) or bool not in set(map(type, data))):
            return
    except (TypeError, OverflowError, ValueError):
        pass
    for index, value in enumerate(data):
        try:
            ok = not isinstance(value, bool) and math.isfinite(value)
        except (TypeError, OverflowError, ValueError):
            ok = False
        if not ok:
            raise bad_value(where, param.name, index, value)


def floats(param: Param) -> Sequence[float]:
    """The parameter's values as Python floats; the caller's list itself when it already holds only floats."""
    data = param.data
    if param.compact or isinstance(data, array.array):
        return data
    if set(map(type, data)) <= {float}:
        return data
    return list(map(float, data))
