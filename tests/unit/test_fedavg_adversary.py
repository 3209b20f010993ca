"""A hostile, well-formed delta against the bounded-influence reduce, and its documented limit.

Five shards, one of which sends its honest delta scaled 1e6x: the capped reduce stays within 3x
the honest median norm and names the task; a plain weighted mean is moved by more than 1e5x.
With two contributions the cap is weak — the test shows it rather than hiding it.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from flashml_workloads.fedavg_driver import run_fedavg
from flashml_workloads.fedavg_weights import reduce_deltas, reduce_deltas_with_report
from tests.fedavg_fakes import FakeCoordinator

PATHS = ["pure", "numpy"]
DIM = 64


def honest_delta(shard: int) -> list[float]:
    rng = random.Random(1000 + shard)
    common = [math.sin(i) * 0.01 for i in range(DIM)]  # shards agree on a direction, with noise
    return [c + rng.gauss(0.0, 0.004) for c in common]


def norm(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values))


def plain_weighted_mean(contributions: list[tuple[list[float], int]]) -> list[float]:
    total = sum(n for _, n in contributions)
    return [sum(v[i] * n / total for v, n in contributions) for i in range(DIM)]


def adversarial_worker(attacker: int, factor: float):
    def worker(task_id, params, weights):
        shard = params["shard"]
        delta = honest_delta(shard)
        if shard == attacker:
            delta = [v * factor for v in delta]
        metrics = {"round": params["round"], "shard": shard, "samples": 100 + 7 * shard, "loss": 0.5,
                   "local_steps": 1, "delta_file": "delta.json"}
        return {"metrics.json": json.dumps(metrics).encode(),
                "delta.json": json.dumps({"w": {"shape": [DIM], "data": delta}}).encode()}

    return worker


@pytest.mark.parametrize("accel", PATHS)
def test_one_of_five_scaled_1e6_is_bounded_and_named(accel):
    honest = [honest_delta(s) for s in range(5)]
    honest_median = sorted(norm(d) for d in honest)[2]
    attacked = [d if s != 3 else [v * 1e6 for v in d] for s, d in enumerate(honest)]
    counts = [100 + 7 * s for s in range(5)]
    reduced, events = reduce_deltas_with_report(
        [({"w": {"shape": [DIM], "data": d}}, n) for d, n in zip(attacked, counts)], accel=accel)
    assert [e.index for e in events] == [3]
    assert norm(reduced["w"]["data"]) <= 3 * honest_median
    # the same attack through a plain weighted mean (no cap)
    honest_update = plain_weighted_mean(list(zip(honest, counts)))
    plain = plain_weighted_mean(list(zip(attacked, counts)))
    moved = norm([p - h for p, h in zip(plain, honest_update)])
    assert moved > 1e5 * norm(honest_update)


def test_driver_names_the_attacking_task_and_keeps_the_update_bounded():
    coord = FakeCoordinator(adversarial_worker(attacker=3, factor=1e6))
    zeros = {"w": {"shape": [DIM], "data": [0.0] * DIM}}
    out = run_fedavg(coord, rounds=1, num_shards=5, min_participants=5, worker_params={"lr": 0.1},
                     initial_weights=zeros, poll_seconds=0.0)
    (event,) = out["history"][0]["clipped"]
    assert event["task_id"] == "shard-003"
    honest_median = sorted(norm(honest_delta(s)) for s in range(5))[2]
    assert norm(out["weights"]["w"]["data"]) <= 3 * honest_median


def test_honest_round_through_the_driver_is_untouched():
    coord = FakeCoordinator(adversarial_worker(attacker=-1, factor=1.0))
    zeros = {"w": {"shape": [DIM], "data": [0.0] * DIM}}
    out = run_fedavg(coord, rounds=1, num_shards=5, min_participants=5, worker_params={"lr": 0.1},
                     initial_weights=zeros, poll_seconds=0.0)
    assert out["history"][0]["clipped"] == []
    reference = reduce_deltas([({"w": {"shape": [DIM], "data": honest_delta(s)}}, 100 + 7 * s) for s in range(5)],
                              clip_factor=1e300)  # effectively no cap at all
    assert out["weights"]["w"]["data"] == [0.0 + v for v in reference["w"]["data"]]


@pytest.mark.parametrize("accel", PATHS)
def test_documented_weakness_with_two_contributions(accel):
    """With two contributions the median is their mean, so the attacker sets the cap: at any scale its
    norm A stays below 3·(h + A)/2, nothing is clipped, and the update follows the attacker."""
    honest = honest_delta(0)
    attacker = [v * 1e6 for v in honest_delta(1)]
    reduced, events = reduce_deltas_with_report(
        [({"w": {"shape": [DIM], "data": honest}}, 100), ({"w": {"shape": [DIM], "data": attacker}}, 100)],
        accel=accel)
    assert events == []  # the cap did not engage
    assert norm(reduced["w"]["data"]) > 1e5 * norm(honest)  # and the update is the attacker's
