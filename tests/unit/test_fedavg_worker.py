"""fedavg_worker: model, data, local steps, delta and metrics files."""

from __future__ import annotations

import json
import math

import pytest

from flashml_workloads import fedavg_worker as fw
from flashml_workloads.fedavg_weights import (
    NonFiniteWeights,
    WeightShapeMismatch,
    apply_delta,
    decode,
    encode,
    subtract,
)

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

PARAMS = {"local_steps": 5, "lr": 0.1, "batch_size": 8, "seed": 3, "in_dim": 4, "hidden": 6, "out_dim": 2,
          "dataset_size": 40, "round": 1, "shard": 2, "num_shards": 4}


def spec(params=None, inputs=None):
    return {"task_id": "shard-002", "params": params or PARAMS, "inputs": inputs or {}}


def test_param_keys_are_exactly_what_the_worker_reads():
    assert set(fw.PARAM_KEYS) == set(PARAMS)
    for key in fw.PARAM_KEYS:
        with pytest.raises(ValueError, match=rf"missing params \['{key}'\]"):
            fw.run_worker(spec({k: v for k, v in PARAMS.items() if k != key}), "unused")


def test_model_is_seeded_mlp_and_blob_round_trips():
    model = fw.build_model(PARAMS)
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear"]
    blob = fw.state_to_blob(model)
    assert {k: v["shape"] for k, v in blob.items()} == {"0.weight": [6, 4], "0.bias": [6], "2.weight": [2, 6],
                                                         "2.bias": [2]}
    assert fw.state_to_blob(fw.build_model(PARAMS)) == blob  # same seed, same init
    state = fw.blob_to_state(encode(decode(blob), compact=True), model)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_run_worker_writes_delta_and_sorted_metrics(tmp_path):
    metrics = fw.run_worker(spec(), tmp_path)
    text = (tmp_path / "metrics.json").read_text()
    assert list(json.loads(text)) == sorted(["round", "shard", "samples", "loss", "local_steps", "delta_file"])
    assert json.loads(text) == metrics
    assert metrics["samples"] == 10 and metrics["round"] == 1 and metrics["shard"] == 2
    assert metrics["delta_file"] == "delta.json" and metrics["local_steps"] == 5
    assert math.isfinite(metrics["loss"]) and metrics["loss"] > 0
    delta = json.loads((tmp_path / "delta.json").read_text())
    start = fw.state_to_blob(fw.build_model(PARAMS))
    assert any(x != 0.0 for entry in delta.values() for x in entry["data"])
    # the delta is exactly new − start for the documented training: strided shard, SGD, wrapping batches
    model = fw.build_model(PARAMS)
    x, y = fw._dataset(PARAMS)
    losses = fw._sgd(model, x[2::4], y[2::4], 0.1, 5, 8)
    assert subtract(fw.state_to_blob(model), start) == delta
    assert metrics["loss"] == sum(losses) / 5
    assert apply_delta(start, delta) == fw.state_to_blob(model)
    again = fw.run_worker(spec(), tmp_path / "again")
    assert again == metrics and json.loads((tmp_path / "again" / "delta.json").read_text()) == delta


def test_weights_input_is_the_starting_point_and_compact_requests_get_compact_answers(tmp_path):
    start = fw.state_to_blob(fw.build_model({**PARAMS, "seed": 99}))
    (tmp_path / "w.json").write_text(json.dumps(start))
    fw.run_worker(spec(inputs={"weights": str(tmp_path / "w.json")}), tmp_path / "lists")
    listed = json.loads((tmp_path / "lists" / "delta.json").read_text())
    assert all("data" in entry for entry in listed.values())
    (tmp_path / "c.json").write_text(json.dumps(encode(decode(start), compact=True)))
    fw.run_worker(spec(inputs={"weights": str(tmp_path / "c.json")}), tmp_path / "compact")
    compact = json.loads((tmp_path / "compact" / "delta.json").read_text())
    assert all(entry["encoding"] == "f64le-b64" for entry in compact.values())
    assert {k: (v[0], list(v[1])) for k, v in decode(compact).items()} == decode(listed)
    # a different seed's init differs from the seeded one, so the weights input really was used
    own = fw.run_worker(spec(), tmp_path / "own")
    assert json.loads((tmp_path / "own" / "delta.json").read_text()) != listed
    assert own["samples"] == 10


@pytest.mark.parametrize("compact", [False, True])
def test_a_non_finite_delta_is_refused_the_same_way_in_both_forms(compact):
    def state(*values):
        return {"w": ([len(values)], torch.tensor(values, dtype=torch.float64))}

    cases = [(state(1.0, math.inf), state(0.0, 0.0), "subtract: new: 'w' index 1 is not finite: .* value inf"),
             (state(1.0, 2.0), state(math.nan, 0.0), "subtract: base: 'w' index 0 is not finite: .* value nan"),
             (state(1.0, 1e308), state(0.0, -1e308), "subtract result: 'w' index 1 is not finite: .* value inf")]
    for trained, start, message in cases:
        with pytest.raises(NonFiniteWeights, match=message):
            fw._delta_blob(trained, start, compact=compact)


def test_bad_weights_inputs_are_refused(tmp_path):
    good = fw.state_to_blob(fw.build_model(PARAMS))
    nan = json.loads(json.dumps(good))
    nan["0.bias"]["data"][3] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(nan))
    with pytest.raises(NonFiniteWeights, match="weights input: '0.bias' index 3 is not finite: it holds a non-finite "
                                               "value nan"):
        fw.run_worker(spec(inputs={"weights": str(tmp_path / "nan.json")}), tmp_path / "o")
    other = fw.state_to_blob(fw.build_model({**PARAMS, "hidden": 5}))
    (tmp_path / "shape.json").write_text(json.dumps(other))
    with pytest.raises(WeightShapeMismatch, match=r"'0.weight' has shape \[5, 4\] but the model has \[6, 4\]"):
        fw.run_worker(spec(inputs={"weights": str(tmp_path / "shape.json")}), tmp_path / "o")
    missing = {k: v for k, v in good.items() if k != "2.bias"}
    (tmp_path / "names.json").write_text(json.dumps(missing))
    with pytest.raises(WeightShapeMismatch, match="do not match the model's"):
        fw.run_worker(spec(inputs={"weights": str(tmp_path / "names.json")}), tmp_path / "o")


@pytest.mark.parametrize(("change", "match"), [
    ({"dataset_size": 2, "shard": 3}, "shard 3 of 4 is empty"),
    ({"out_dim": 1}, "out_dim must be >= 2"),
    ({"shard": 4}, r"shard must be in \[0, num_shards=4\)"),
    ({"local_steps": 0}, "local_steps must be >= 1"),
    ({"lr": "0.1"}, "lr must be a number > 0"),
    ({"batch_size": 2.5}, "batch_size must be an int"),
])
def test_invalid_params(change, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        fw.run_worker(spec({**PARAMS, **change}), tmp_path)


def test_shards_are_strided_slices_of_one_seeded_dataset(tmp_path):
    sizes = [fw.run_worker(spec({**PARAMS, "shard": s, "local_steps": 1}), tmp_path / str(s))["samples"]
             for s in range(4)]
    assert sizes == [10, 10, 10, 10]
    x, y = fw._dataset(PARAMS)
    assert x.shape == (40, 4) and set(y.tolist()) <= {0, 1}
    x2, y2 = fw._dataset(PARAMS)
    assert torch.equal(x, x2) and torch.equal(y, y2)
