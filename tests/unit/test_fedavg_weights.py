"""fedavg_weights: blob format, compact entries, checks in order, and the reduce's invariants."""

from __future__ import annotations

import array
import base64
import math
import struct

import pytest

from flashml_workloads import fedavg_weights as fw
from flashml_workloads.fedavg_weights import (
    CLIP_FACTOR,
    ClipEvent,
    NonFiniteWeights,
    WeightShapeMismatch,
    apply_delta,
    decode,
    encode,
    reduce_deltas,
    reduce_deltas_with_report,
    require_finite,
    subtract,
)
from flashruntime import errors

PATHS = ["pure", "numpy"]


def blob(**params: list[float]) -> dict:
    return {name: {"shape": [len(data)], "data": list(data)} for name, data in params.items()}


def bits(b: dict) -> dict:
    """Bit patterns per parameter, so -0.0 and 0.0 differ and equality means bit identity."""
    return {name: (entry["shape"], [struct.pack("<d", x) for x in entry["data"]]) for name, entry in b.items()}


def unclipped_reference(contributions: list[tuple[dict, int]]) -> dict:
    """The documented formula with no clipping at all: Σ (n_i/total)·v_i, from the first term, in order."""
    total = sum(n for _, n in contributions)
    out = {}
    for name, entry in contributions[0][0].items():
        acc = None
        for b, n in contributions:
            w = n / total
            term = [w * x for x in b[name]["data"]]
            acc = term if acc is None else [a + t for a, t in zip(acc, term)]
        out[name] = {"shape": entry["shape"], "data": acc}
    return out


def test_public_names_and_error_identity():
    assert fw.__all__ == ["CLIP_FACTOR", "ClipEvent", "NonFiniteWeights", "WeightShapeMismatch", "apply_delta",
                          "decode", "encode", "reduce_deltas", "reduce_deltas_with_report", "require_finite",
                          "subtract"]
    assert fw.WeightShapeMismatch is errors.WeightShapeMismatch
    assert fw.NonFiniteWeights is errors.NonFiniteWeights
    assert issubclass(WeightShapeMismatch, ValueError) and issubclass(NonFiniteWeights, ValueError)
    assert CLIP_FACTOR == 3.0
    assert ClipEvent._fields == ("index", "norm", "cap", "scale")


# --- encode / decode -------------------------------------------------------------------------------------------


def test_encode_decode_lists_copy_both_ways():
    data = [1.0, -2.5, 0.0, 4.0]
    b = encode({"w": ([2, 2], data), "b": ([], [7.0])})
    assert b == {"w": {"shape": [2, 2], "data": data}, "b": {"shape": [], "data": [7.0]}}
    assert b["w"]["data"] is not data
    back = decode(b)
    assert back == {"w": ([2, 2], data), "b": ([], [7.0])}
    assert back["w"][1] is not b["w"]["data"]


def test_compact_entry_is_base64_of_little_endian_float64():
    values = [1.5, -0.0, 1e-310, 2.0**60]
    b = encode({"w": ([4], values)}, compact=True)
    entry = b["w"]
    assert entry["encoding"] == "f64le-b64" and entry["shape"] == [4] and "data" not in entry
    assert base64.b64decode(entry["data_b64"]) == struct.pack("<4d", *values)
    shape, data = decode(b)["w"]
    assert shape == [4] and isinstance(data, array.array) and data.typecode == "d"
    assert [struct.pack("<d", x) for x in data] == [struct.pack("<d", x) for x in values]


def test_compact_encode_reads_float64_buffers_in_place_and_converts_anything_else():
    values = [1.5, -0.0, 1e-310, 2.0**60, -3.25, 7.0]
    expected = encode({"w": ([2, 3], values)}, compact=True)
    assert encode({"w": ([2, 3], array.array("d", values))}, compact=True) == expected
    assert encode({"w": ([2, 3], memoryview(array.array("d", values)))}, compact=True) == expected
    np = pytest.importorskip("numpy")
    flat = np.array(values, dtype=np.float64)
    assert encode({"w": ([2, 3], flat)}, compact=True) == expected
    assert encode({"w": ([2, 3], flat.reshape(2, 3))}, compact=True) == expected  # counted by bytes, not len()
    # no native float64 buffer: a strided view, another byte order, float32 — converted value by value
    wide = np.repeat(flat, 2)[::2]
    assert not wide.flags.c_contiguous and encode({"w": ([2, 3], wide)}, compact=True) == expected
    assert encode({"w": ([2, 3], flat.astype(">f8"))}, compact=True) == expected
    halves = [0.5, 0.25, -8.0]
    assert encode({"w": ([3], array.array("f", halves))}, compact=True) == encode({"w": ([3], halves)}, compact=True)
    assert encode({"w": ([3], tuple(halves))}, compact=True) == encode({"w": ([3], halves)}, compact=True)
    assert encode({"w": ([3], np.array(halves, dtype=np.float32))}, compact=True) == encode(
        {"w": ([3], halves)}, compact=True)
    with pytest.raises(WeightShapeMismatch, match=r"'w' has 6 values but shape \[7\] needs 7"):
        encode({"w": ([7], flat)}, compact=True)
    encoded = encode({"w": ([6], flat)}, compact=True)
    flat[0] = 99.0  # the blob holds text, never a view of the caller's array
    assert encoded == expected | {"w": {**expected["w"], "shape": [6]}}


def test_encode_rejects_length_not_matching_shape():
    with pytest.raises(WeightShapeMismatch, match=r"'w' has 3 values but shape \[2, 2\] needs 4"):
        encode({"w": ([2, 2], [1.0, 2.0, 3.0])})


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"shape": [2], "encoding": "f32le-b64", "data_b64": "AAAA"}, "unknown encoding 'f32le-b64'"),
        ({"shape": [1], "encoding": "f64le-b64", "data_b64": "not base64!"}, "undecodable data_b64"),
        ({"shape": [2], "encoding": "f64le-b64", "data_b64": base64.b64encode(b"\0" * 8).decode()},
         r"decodes to 1 values|has 1 values but shape \[2\] needs 2"),
        ({"shape": [1], "encoding": "f64le-b64", "data_b64": base64.b64encode(b"\0" * 7).decode()},
         "not a whole number of float64"),
        ({"shape": [2], "data": [1.0]}, r"has 1 values but shape \[2\] needs 2"),
        ({"shape": [-1], "data": []}, "non-negative integers"),
        ({"shape": [2], "data": "ab"}, "data must be a list"),
        ({"data": [1.0]}, "must be an object with 'shape'"),
    ],
)
def test_malformed_entries_fail_the_shape_check(entry, match):
    with pytest.raises(WeightShapeMismatch, match=match):
        decode({"w": entry})
    with pytest.raises(WeightShapeMismatch, match=match):
        require_finite({"w": entry}, "x")


# --- require_finite ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "what"),
    [(math.nan, "non-finite value nan"), (math.inf, "non-finite value inf"), (-math.inf, "non-finite value -inf"),
     ("1.5", "non-numeric value '1.5'"), (None, "non-numeric value None"), ([1.0], r"non-numeric value \[1.0\]"),
     (10**400, "integer too large"), (True, r"non-numeric value True \(bool\)"),
     (False, r"non-numeric value False \(bool\)")],
)
def test_require_finite_names_where_parameter_and_flat_index(bad, what):
    b = {"a": {"shape": [2], "data": [1.0, 2.0]}, "w": {"shape": [2, 2], "data": [0.0, 1.0, bad, 3.0]}}
    with pytest.raises(NonFiniteWeights, match=rf"shard-007: 'w' index 2 is not finite: it holds (a|an) {what}"):
        require_finite(b, "shard-007")


@pytest.mark.parametrize("accel", PATHS)
@pytest.mark.parametrize(("data", "index"), [([0.5, True], 1), ([False, 0.5], 0), ([True, True], 0),
                                             ([1, 2, False], 2), ([0.0, 1.0, 1, 0, True], 4)])
def test_json_booleans_are_not_numbers_on_either_path(accel, data, index):
    honest = (blob(w=[0.0] * len(data)), 1)
    with pytest.raises(NonFiniteWeights, match=rf"contribution 1: 'w' index {index} is not finite: it holds a "
                                               rf"non-numeric value (True|False) \(bool\)"):
        reduce_deltas([honest, (blob(w=data), 1)], accel=accel)
    with pytest.raises(NonFiniteWeights, match=rf"apply_delta: delta: 'w' index {index} is not finite"):
        apply_delta(blob(w=[0.0] * len(data)), blob(w=data))


def test_require_finite_returns_the_blob_itself_and_checks_compact_entries():
    b = blob(w=[1.0, 2.0])
    assert require_finite(b, "x") is b
    bad = encode({"w": ([2], [1.0, math.nan])}, compact=True)
    with pytest.raises(NonFiniteWeights, match="'w' index 1 is not finite: it holds a non-finite value nan"):
        require_finite(bad, "compact")


# --- subtract / apply_delta --------------------------------------------------------------------------------------


def test_subtract_and_apply_delta_round_trip_and_accept_compact():
    base = blob(w=[1.0, 2.0, 3.0])
    new = blob(w=[1.5, 1.0, 3.0])
    delta = subtract(new, base)
    assert delta == blob(w=[0.5, -1.0, 0.0])
    assert apply_delta(base, delta) == new
    assert apply_delta(base, delta, scale=2.0) == blob(w=[2.0, 0.0, 3.0])
    compact_delta = encode(decode(delta), compact=True)
    assert apply_delta(base, compact_delta) == new  # list entries come back
    assert subtract(encode(decode(new), compact=True), base) == delta


def test_subtract_and_apply_delta_check_shapes_and_finiteness():
    with pytest.raises(WeightShapeMismatch, match=r"base and subtract: new .* \(missing \[\], extra \['b'\]\)"):
        subtract(blob(w=[1.0]), blob(w=[1.0], b=[2.0]))
    with pytest.raises(WeightShapeMismatch, match=r"shape \[2\] but .* has \[1\]"):
        apply_delta(blob(w=[1.0]), blob(w=[1.0, 2.0]))
    with pytest.raises(NonFiniteWeights, match="apply_delta result: 'w' index 0 is not finite: it holds a non-finite "
                                               "value inf"):
        apply_delta(blob(w=[1e308]), blob(w=[1e308]))
    with pytest.raises(NonFiniteWeights, match="subtract: new: 'w' index 0"):
        subtract(blob(w=[math.nan]), blob(w=[1.0]))
    with pytest.raises(ValueError, match="scale must be a real number"):
        apply_delta(blob(w=[1.0]), blob(w=[1.0]), scale="2")


# --- reduce: check order ----------------------------------------------------------------------------------------

HONEST = [(blob(w=[1.0, 2.0]), 3), (blob(w=[2.0, 1.0]), 5)]


@pytest.mark.parametrize("factor", [0, -1.0, math.nan, math.inf, -math.inf, "3", None, True, [3.0]])
@pytest.mark.parametrize("accel", PATHS)
def test_invalid_clip_factor_raises_first(factor, accel):
    with pytest.raises(ValueError, match="clip_factor must be a finite number > 0"):
        reduce_deltas([], clip_factor=factor, accel=accel)  # step 1 before step 2


@pytest.mark.parametrize("accel", PATHS)
def test_check_order_follows_spec(accel):
    with pytest.raises(ValueError, match=r"^reduce_deltas: no contributions$"):
        reduce_deltas([], accel=accel)
    with pytest.raises(ValueError, match="total sample count is 0"):
        reduce_deltas([(blob(w=[1.0]), 5), (blob(w=[1.0]), -5)], accel=accel)
    with pytest.raises(ValueError, match="total sample count is -2"):
        reduce_deltas([(blob(w=[1.0]), 3), ({"not": "a blob"}, -5)], accel=accel)  # step 3 before step 5
    # step 4 names the index, and runs before any blob is looked at
    for n, match in [(True, r"contribution 1 has sample count True \(bool\)"),
                     (2.0, r"contribution 1 has sample count 2.0 \(float\)"),
                     (math.nan, "contribution 1 has a non-finite sample count nan"),
                     ("4", r"contribution 1 has sample count '4' \(str\)"),
                     (-1, "contribution 1 has sample count -1, a non-positive sample count; it must be > 0")]:
        with pytest.raises(ValueError, match=match):
            reduce_deltas([({"w": "malformed"}, 5), (blob(w=[1.0]), n)], accel=accel)
    with pytest.raises(ValueError, match="contribution 0 must be a \\(blob, samples\\) pair"):
        reduce_deltas([blob(w=[1.0])], accel=accel)


@pytest.mark.parametrize("accel", PATHS)
def test_malformed_input_raises_before_any_clipping(accel):
    honest = [(blob(w=[1.0, 1.0]), 10) for _ in range(3)]
    attacker = (blob(w=[1e6, 1e6]), 10)  # would be clipped
    with pytest.raises(NonFiniteWeights, match="contribution 4: 'w' index 0 is not finite: it holds a non-finite "
                                               "value nan"):
        reduce_deltas_with_report([*honest, attacker, (blob(w=[math.nan, 1.0]), 10)], accel=accel)
    with pytest.raises(WeightShapeMismatch, match=r"contribution 4: parameter 'w' has shape \[3\]"):
        reduce_deltas_with_report([*honest, attacker, (blob(w=[1.0, 1.0, 1.0]), 10)], accel=accel)
    with pytest.raises(WeightShapeMismatch, match=r"contribution 4 and contribution 0 .*extra \['x'\]"):
        reduce_deltas_with_report([*honest, attacker, (blob(w=[1.0, 1.0], x=[0.0]), 10)], accel=accel)
    # per blob: shape check, then values; blob 1's NaN is reported before blob 2's shape
    with pytest.raises(NonFiniteWeights, match="contribution 1"):
        reduce_deltas([(blob(w=[1.0]), 1), (blob(w=[math.inf]), 1), (blob(w=[1.0, 2.0]), 1)], accel=accel)


def test_invalid_accel_raises():
    with pytest.raises(ValueError, match="accel must be 'auto', 'numpy' or 'pure', got 'gpu'"):
        reduce_deltas(HONEST, accel="gpu")


# --- reduce: invariants -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("accel", [*PATHS, "auto"])
def test_honest_round_is_bit_identical_to_an_unclipped_reduce(accel):
    contributions = [
        (blob(w=[0.1, -0.3, 0.7], b=[1e-3]), 17),
        (blob(w=[0.2, -0.1, 0.5], b=[-2e-3]), 23),
        (blob(w=[0.15, -0.25, 0.6], b=[0.0]), 31),
        (blob(w=[0.12, -0.2, 0.55], b=[5e-4]), 7),
    ]
    result, events = reduce_deltas_with_report(contributions, accel=accel)
    assert events == []
    assert bits(result) == bits(unclipped_reference(contributions))
    assert reduce_deltas(contributions, accel=accel) == result


@pytest.mark.parametrize("accel", PATHS)
def test_cap_is_strict_greater_than(accel):
    at_cap = [(blob(w=[1.0]), 1), (blob(w=[1.0]), 1), (blob(w=[3.0]), 1)]  # median 1 → cap 3.0 exactly
    result, events = reduce_deltas_with_report(at_cap, accel=accel)
    assert events == []
    assert bits(result) == bits(unclipped_reference(at_cap))
    above = [(blob(w=[1.0]), 1), (blob(w=[1.0]), 1), (blob(w=[math.nextafter(3.0, 4.0)]), 1)]
    _, events = reduce_deltas_with_report(above, accel=accel)
    assert [e.index for e in events] == [2] and events[0].cap == 3.0 and events[0].scale < 1.0


@pytest.mark.parametrize("accel", PATHS)
def test_even_count_median_is_mean_of_middle_values(accel):
    contributions = [(blob(w=[1.0]), 1), (blob(w=[2.0]), 1), (blob(w=[4.0]), 1), (blob(w=[100.0]), 1)]
    _, events = reduce_deltas_with_report(contributions, accel=accel)
    assert events == [ClipEvent(3, 100.0, 9.0, 0.09)]  # median (2+4)/2 = 3, cap 9


@pytest.mark.parametrize("accel", PATHS)
def test_zero_norm_and_all_zero_rounds_are_safe(accel):
    zeros = [(blob(w=[0.0, -0.0]), 2), (blob(w=[0.0, 0.0]), 3), (blob(w=[-0.0, 0.0]), 5)]
    result, events = reduce_deltas_with_report(zeros, accel=accel)
    assert events == [] and result["w"]["data"] == [0.0, 0.0]
    # median norm 0 → cap 0: the non-zero one is scaled to zero, zero-norm ones are never scaled
    mostly_zero = [(blob(w=[0.0]), 1), (blob(w=[0.0]), 1), (blob(w=[5.0]), 1)]
    result, events = reduce_deltas_with_report(mostly_zero, accel=accel)
    assert events == [ClipEvent(2, 5.0, 0.0, 0.0)]
    assert result == blob(w=[0.0])


@pytest.mark.parametrize("accel", PATHS)
def test_accumulation_starts_from_the_first_term_keeping_signed_zero(accel):
    result = reduce_deltas([(blob(w=[-0.0]), 1), (blob(w=[-0.0]), 1)], accel=accel)
    assert math.copysign(1.0, result["w"]["data"][0]) == -1.0  # 0.0 + (-0.0) would give +0.0


@pytest.mark.parametrize("accel", PATHS)
def test_clip_event_index_is_the_position_in_the_callers_list(accel):
    contributions = [(blob(w=[3.0, 4.0]), 10) for _ in range(5)]
    contributions[3] = (blob(w=[3e6, 4e6]), 10)
    result, events = reduce_deltas_with_report(contributions, accel=accel)
    assert events == [ClipEvent(3, 5e6, 15.0, 15.0 / 5e6)]
    assert math.hypot(*result["w"]["data"]) <= 3 * 5.0


@pytest.mark.parametrize("accel", PATHS)
def test_unclipped_blobs_are_the_callers_objects_and_output_is_lists(accel):
    a = blob(w=[1.0, 2.0])
    compact = encode(decode(blob(w=[2.0, 4.0])), compact=True)
    before = dict(a)
    result = reduce_deltas([(a, 1), (compact, 1)], accel=accel)
    assert result == blob(w=[1.5, 3.0])
    assert type(result["w"]["data"]) is list and "encoding" not in result["w"]
    assert a == before  # inputs untouched


@pytest.mark.parametrize("accel", PATHS)
def test_int_values_and_multi_dim_shapes(accel):
    contributions = [({"w": {"shape": [2, 2], "data": [1, 2, 3, 4]}}, 1), (blob(w=[1.0, 2.0, 3.0, 4.0]), 1)]
    with pytest.raises(WeightShapeMismatch, match=r"shape \[4\] but contribution 0 has \[2, 2\]"):
        reduce_deltas(contributions, accel=accel)
    contributions[1] = ({"w": {"shape": [2, 2], "data": [1.0, 2.0, 3.0, 4.0]}}, 1)
    assert reduce_deltas(contributions, accel=accel) == {"w": {"shape": [2, 2], "data": [1.0, 2.0, 3.0, 4.0]}}


def test_weights_are_sample_weighted():
    result = reduce_deltas([(blob(w=[0.0]), 1), (blob(w=[4.0]), 3)], accel="pure")
    assert result == blob(w=[3.0])


@pytest.mark.parametrize("accel", PATHS)
def test_overflowing_norm_scales_the_outlier_to_zero_without_warnings(accel, recwarn):
    # finite values whose squares overflow: norm inf, so the cap scales them by cap / inf = 0.0
    contributions = [(blob(w=[1.0]), 1), (blob(w=[2.0]), 1), (blob(w=[3.0]), 1), (blob(w=[1e300]), 1),
                     (blob(w=[-1e200]), 1)]
    result, events = reduce_deltas_with_report(contributions, accel=accel)
    assert events == [ClipEvent(3, math.inf, 9.0, 0.0), ClipEvent(4, math.inf, 9.0, 0.0)]
    assert result == blob(w=[0.2 * 1.0 + 0.2 * 2.0 + 0.2 * 3.0 + 0.0 + -0.0])
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
