"""Property: the numpy fast path and the pure path of ``reduce_deltas`` agree.

Bit-identical results whenever nothing is clipped; identical clip decisions, and clip scales
within 1e-12 relative, when something is. Blobs mix list and compact entries.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashml_workloads.fedavg_weights import decode, encode, reduce_deltas_with_report

pytest.importorskip("numpy")

FLOATS = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=True)
# JSON peers may send integers (and Python callers huge ones); both paths must read them as the same floats
VALUES = st.one_of(FLOATS, FLOATS, FLOATS, st.integers(-(2**70), 2**70), st.integers(-3, 3))


@st.composite
def rounds(draw: st.DrawFn) -> list[tuple[dict, int]]:
    shapes = draw(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=2), min_size=1, max_size=3))
    names = [f"p{i}" for i in range(len(shapes))]
    count = draw(st.integers(1, 7))
    contributions = []
    for _ in range(count):
        state = {}
        for name, shape in zip(names, shapes):
            size = math.prod(shape)
            state[name] = (shape, draw(st.lists(VALUES, min_size=size, max_size=size)))
        scale = draw(st.sampled_from([1, 1, 1, 1000, 1e-3, 0.0]))  # some rounds get an outlier
        state = {k: (s, [x * scale for x in d]) for k, (s, d) in state.items()}
        compact = draw(st.booleans())
        contributions.append((encode(state, compact=compact), draw(st.integers(1, 10_000))))
    return contributions


def _bits(blob: dict) -> dict:
    return {k: [struct.pack("<d", x) for x in v["data"]] for k, v in blob.items()}


@settings(max_examples=300, deadline=None)
@given(rounds(), st.sampled_from([3.0, 3.0, 1.0, 0.5, 10.0]))
def test_pure_and_numpy_paths_agree(contributions, clip_factor):
    pure, pure_events = reduce_deltas_with_report(contributions, clip_factor=clip_factor, accel="pure")
    fast, fast_events = reduce_deltas_with_report(contributions, clip_factor=clip_factor, accel="numpy")
    assert [(e.index, e.norm, e.cap) for e in fast_events] == [(e.index, e.norm, e.cap) for e in pure_events]
    for p, f in zip(pure_events, fast_events):
        assert math.isclose(p.scale, f.scale, rel_tol=1e-12, abs_tol=0.0)
    assert list(fast) == list(pure) and all(type(v["data"]) is list for v in fast.values())
    if not pure_events:
        assert _bits(fast) == _bits(pure)
    else:
        for name in pure:
            for a, b in zip(pure[name]["data"], fast[name]["data"]):
                assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)


@settings(max_examples=100, deadline=None)
@given(rounds())
def test_compact_round_trip_is_exact(contributions):
    for blob, _ in contributions:
        decoded = decode(blob)
        again = decode(encode(decoded, compact=True))
        assert {k: (s, [struct.pack("<d", x) for x in d]) for k, (s, d) in again.items()} == {
            k: (s, [struct.pack("<d", x) for x in d]) for k, (s, d) in decoded.items()
        }
