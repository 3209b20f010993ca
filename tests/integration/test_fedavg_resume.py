"""Resume: a driver process SIGKILLed after round 2 is picked up by ``resume_state`` at round 3.

The driver runs as a real subprocess speaking HTTP to the stdlib coordinator fake on 127.0.0.1,
which can hold rounds back as a real coordinator cannot be told to. The fake holds rounds >= 3 uncommitted, so the kill
lands after round 2 was published and before round 3 could finish. The resumed run must end with
weights bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from flashml_workloads.fedavg_driver import HttpCoordinator, resume_state, run_fedavg
from tests.fedavg_fakes import FakeCoordinator, FakeHttpServer, quadratic_worker

REPO = Path(__file__).resolve().parents[2]
TARGETS = [[1.0, -2.0, 0.5], [1.5, 1.0, -0.25], [0.5, 3.0, 0.0]]
ZEROS = {"w": {"shape": [3], "data": [0.0, 0.0, 0.0]}}
ROUNDS = 6
COMMON = dict(num_shards=3, min_participants=3, worker_params={"lr": 0.3})

DRIVER = textwrap.dedent(
    """
    import json, sys
    from flashml_workloads.fedavg_driver import HttpCoordinator, run_fedavg
    run_fedavg(HttpCoordinator(sys.argv[1]), rounds={rounds}, num_shards=3, min_participants=3,
               worker_params={{"lr": 0.3}}, initial_weights={zeros}, poll_seconds=0.05,
               on_round=lambda result: print(json.dumps(result), flush=True))
    """
)


def bits(weights: dict) -> list[bytes]:
    return [struct.pack("<d", x) for x in weights["w"]["data"]]


def test_killed_driver_resumes_at_round_3_with_identical_weights(tmp_path):
    reference_coord = FakeCoordinator(quadratic_worker(TARGETS))
    reference = run_fedavg(reference_coord, rounds=ROUNDS, initial_weights=ZEROS, poll_seconds=0.0, **COMMON)
    ref_job_2 = dict(reference["job_ids"])[2]
    ref_round_2 = json.loads(reference_coord.store[f"jobs/{ref_job_2}/round-002/weights.json"])

    backend = FakeCoordinator(quadratic_worker(TARGETS))
    backend.hold_from_round = 3
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(rounds=ROUNDS, zeros=json.dumps(ZEROS)))
    with FakeHttpServer(backend) as server:
        proc = subprocess.Popen([sys.executable, str(script), server.url], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        history = []
        try:
            for line in proc.stdout:
                history.append(json.loads(line))
                if history[-1]["round"] == 2:
                    break
        finally:
            proc.kill()  # SIGKILL: no cleanup, no chance to publish anything more
            proc.wait(timeout=60)
        assert [h["round"] for h in history] == [0, 1, 2], proc.stderr.read()
        assert proc.returncode == -9

        job_ids = [(h["round"], h["job_id"]) for h in history]
        backend.hold_from_round = None
        coord = HttpCoordinator(server.url)
        next_round, weights, uri = resume_state(coord, job_ids)
        assert next_round == 3
        assert uri == f"artifact://jobs/{job_ids[-1][1]}/round-002/weights.json"
        assert bits(weights) == bits(ref_round_2)

        resumed = run_fedavg(coord, rounds=ROUNDS, start_round=next_round, weights_uri=uri, initial_weights=weights,
                             prior_job_ids=job_ids, poll_seconds=0.01, **COMMON)
    assert [h["round"] for h in resumed["history"]] == [3, 4, 5]
    assert resumed["job_ids"][:3] == job_ids and [r for r, _ in resumed["job_ids"]] == list(range(ROUNDS))
    assert bits(resumed["weights"]) == bits(reference["weights"])
    assert [h["mean_loss"] for h in resumed["history"]] == [h["mean_loss"] for h in reference["history"][3:]]
    # the round-3 body carries the resumed weights' URI
    assert backend.bodies[-3]["spec"]["workload"]["parameters"]["weights"] == uri
