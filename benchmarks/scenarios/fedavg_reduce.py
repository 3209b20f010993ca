"""``fedavg_reduce``: the bounded-influence reduce against a plain numpy weighted mean.

Eight honest contributions (list blobs in, list blobs out) at 1e5 and 1e6 parameters: the pure
path, the numpy fast path (with its bit-identity to the pure path recorded) and the comparator,
interleaved sample by sample. Plus the compact ``f64le-b64`` round trip of a 1e6-float state,
``decode(encode(state, compact=True))`` from a list state, with the same from float64 buffers
and the JSON-list text round trip as informational rows. Two more informational rows bound
what any implementation could reach on the host: the standard library's own work for the
same values (``array('d')`` from the lists, ``b2a_base64``, ``a2b_base64``: the floor of an
``f64le-b64`` round trip from a list state) and, for comparison, the same bytes as hex text.
"""

from __future__ import annotations

import array
import binascii
import gc
import json
import random
import struct
import time
from collections.abc import Callable
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row
from benchmarks.targets import FEDAVG_COMPACT_OVER_BASE64_FLOOR, FEDAVG_FAST_OVER_NUMPY

NAME = "fedavg_reduce"
SECTION = "performance"
CONTRIBUTIONS = 8
PARAMS = 4  # parameters per blob; the sizes below are split evenly between them
FAST_TARGET = FEDAVG_FAST_OVER_NUMPY
COMPACT_TARGET = FEDAVG_COMPACT_OVER_BASE64_FLOOR


def _label(n: int) -> str:
    return f"1e{len(str(n)) - 1}"


def _timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1e3, result


def _values(n: int, seed: int) -> list[float]:
    try:
        import numpy as np
    except ImportError:
        rng = random.Random(seed)
        return [rng.gauss(0.0, 0.01) for _ in range(n)]
    return np.random.default_rng(seed).normal(0.0, 0.01, n).tolist()


def _contributions(n: int) -> list[tuple[dict[str, Any], int]]:
    per = n // PARAMS
    return [
        ({f"layer{p}.weight": {"shape": [per], "data": _values(per, 97 * c + p)} for p in range(PARAMS)}, 100 + 13 * c)
        for c in range(CONTRIBUTIONS)
    ]


def _numpy_weighted_mean(contributions: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """The comparator: asarray per parameter, acc = w0·x0 then acc + wi·xi, tolist; no checks."""
    import numpy as np

    total = sum(n for _, n in contributions)
    out = {}
    for name, entry in contributions[0][0].items():
        acc = None
        for blob, n in contributions:
            term = (n / total) * np.asarray(blob[name]["data"])
            acc = term if acc is None else acc + term
        out[name] = {"shape": entry["shape"], "data": acc.tolist()}
    return out


def _bits(blob: dict[str, Any]) -> dict[str, list[bytes]]:
    return {k: [struct.pack("<d", x) for x in v["data"]] for k, v in blob.items()}


def _reduce_rows(n: int, samples: int, have_numpy: bool) -> list[dict[str, Any]]:
    from flashml_workloads.fedavg_weights import reduce_deltas_with_report

    label = _label(n)
    contributions = _contributions(n)
    pure_ms: list[float] = []
    fast_ms: list[float] = []
    comparator_ms: list[float] = []
    pure_out = fast_out = None
    events: list[Any] = []
    for _ in range(samples):  # interleaved, so drifting machine load hits all three alike
        if have_numpy:
            ms, _ = _timed_ms(lambda: _numpy_weighted_mean(contributions))
            comparator_ms.append(ms)
            ms, (fast_out, events) = _timed_ms(lambda: reduce_deltas_with_report(contributions, accel="numpy"))
            fast_ms.append(ms)
        ms, (pure_out, pure_events) = _timed_ms(lambda: reduce_deltas_with_report(contributions, accel="pure"))
        pure_ms.append(ms)
    clipped = f"clip events: {len(pure_events)} (honest round)"
    metric_pure, metric_fast = f"pure_ms_{label}", f"fast_ms_{label}"
    shape = f"{CONTRIBUTIONS} contributions x {n} parameters, list blobs"
    if not have_numpy:
        return [
            measured_row(NAME, SECTION, metric_pure, "ms", pure_ms, notes=[shape, clipped, "numpy not installed"]),
            skipped_row(NAME, SECTION, metric_fast, "ms", "numpy is not installed (the 'accel' extra)",
                        target=FAST_TARGET),
        ]
    identical = _bits(fast_out) == _bits(pure_out) and events == pure_events
    comparator = ("numpy weighted mean", comparator_ms)
    return [
        measured_row(NAME, SECTION, metric_pure, "ms", pure_ms, comparator=comparator, notes=[shape, clipped]),
        measured_row(NAME, SECTION, metric_fast, "ms", fast_ms, comparator=comparator, target=FAST_TARGET,
                     notes=[shape, clipped, f"bit-identical to the pure path: {str(identical).lower()}"]),
    ]


def _compact_rows(n: int, samples: int, smoke: bool) -> list[dict[str, Any]]:
    """The compact round trip, from a list state (what ``subtract`` returns), with its
    target against the stdlib base64 floor; beside it, informational, the same from ``array('d')`` buffers (what the
    worker encodes from its float64 tensors), sampled alternately; then JSON lists."""
    from flashml_workloads.fedavg_weights import decode, encode

    label = _label(n)
    per = n // PARAMS
    state = {f"layer{p}.weight": ([per], _values(per, 7 + p)) for p in range(PARAMS)}
    buffers = {name: (shape, array.array("d", data)) for name, (shape, data) in state.items()}
    target = COMPACT_TARGET if n == 1_000_000 else None
    forms: dict[str, Callable[[], Any]] = {
        "list": lambda: decode(encode(state, compact=True)),
        "buffer": lambda: decode(encode(buffers, compact=True)),
        "floor": lambda: _stdlib_round_trip(state, binascii.b2a_base64, binascii.a2b_base64),
        "hex": lambda: _stdlib_round_trip(state, memoryview.hex, bytes.fromhex),
    }
    samples_ms: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(samples):
        for form, round_trip in forms.items():
            samples_ms[form].append(_timed_ms(round_trip)[0])
    excluded = "JSON text serialisation excluded (transport)"
    floor = ("stdlib base64 floor: array('d', list) + b2a_base64 + a2b_base64 and nothing else", samples_ms["floor"])
    rows = [
        measured_row(NAME, SECTION, f"compact_roundtrip_ms_{label}", "ms", samples_ms["list"], comparator=floor,
                     target=target,
                     notes=[f"decode(encode(state, compact=True)) of {n} floats from a list state to the decoded "
                            "buffer; " + excluded]),
        measured_row(NAME, SECTION, f"compact_roundtrip_ms_{label}_from_buffers", "ms", samples_ms["buffer"],
                     notes=[f"informational: the same {n} floats held in array('d') buffers, the form the worker "
                            "encodes from its float64 tensors (no list conversion); " + excluded]),
        measured_row(NAME, SECTION, f"stdlib_hex_floor_ms_{label}", "ms", samples_ms["hex"],
                     notes=[("informational: the same floor with hex text instead of base64 (array('d', list) + "
                             "memoryview.hex + bytes.fromhex); hex is not a wire form of this package: its text is "
                             "1.5x the size of base64's")]),
    ]
    json_samples = 1 if smoke else 3
    json_ms = [_timed_ms(lambda: decode(json.loads(json.dumps(encode(state)))))[0] for _ in range(json_samples)]
    rows.append(measured_row(NAME, SECTION, f"json_lists_roundtrip_ms_{label}", "ms", json_ms,
                             notes=[f"informational: the same {n} floats as JSON list text, dumps + loads + decode"]))
    return rows


def _stdlib_round_trip(state: dict[str, Any], to_text: Callable[[Any], Any], from_text: Callable[[Any], bytes]
                       ) -> list[bytes]:
    """Per parameter: the list into float64 bytes, to text and back, with no other work."""
    return [from_text(to_text(memoryview(array.array("d", data)).cast("B"))) for _, data in state.values()]


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    try:
        import numpy  # noqa: F401

        have_numpy = True
    except ImportError:
        have_numpy = False
    sizes = [10_000] if smoke else [100_000, 1_000_000]
    reduce_samples = 1 if smoke else max(repeats, 5)
    compact_samples = 1 if smoke else max(repeats, 7)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        rows += _reduce_rows(n, reduce_samples, have_numpy)
    rows += _compact_rows(sizes[-1], compact_samples, smoke)
    return rows


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "Bounded influence costs little: the checked, clipped numpy fast path of reduce_deltas stays within 1.5x of "
        "a plain numpy weighted mean, bit-identical to the pure path, and the compact wire form round-trips 1e6 "
        "floats within 1.15x of the standard library's own base64 round trip of the same floats"
    ),
    section=SECTION,
    run=run,
)
