"""Demo trainer: least-squares regression by SGD in pure Python, checkpointed through
verified manifests and resumed from the newest valid one.

Deterministic: the batch of step ``s`` depends only on ``s``, so a resumed run ends
with exactly the weights of an uninterrupted one. ``--crash-at-step N`` SIGKILLs the
process at step N, only on a fresh start (a restart resumes past it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from pathlib import Path

from flashruntime.checkpoint.local import latest_valid_manifest, open_part, write_manifest

FEATURES = 4
ROWS = 256
BATCH = 8
TRUE_WEIGHTS = [0.5, -1.25, 2.0, 0.75]
TRUE_BIAS = 0.3


def make_dataset(seed: int = 0) -> list[tuple[list[float], float]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(ROWS):
        x = [rng.uniform(-1, 1) for _ in range(FEATURES)]
        y = sum(w * v for w, v in zip(TRUE_WEIGHTS, x)) + TRUE_BIAS + rng.gauss(0, 0.05)
        rows.append((x, y))
    return rows


def mse(data: list[tuple[list[float], float]], weights: list[float], bias: float) -> float:
    return sum((sum(w * v for w, v in zip(weights, x)) + bias - y) ** 2 for x, y in data) / len(data)


def sgd_step(data: list[tuple[list[float], float]], step: int, weights: list[float], bias: float, lr: float):
    batch = [data[(step * BATCH + j) % len(data)] for j in range(BATCH)]
    grad_w = [0.0] * FEATURES
    grad_b = 0.0
    for x, y in batch:
        error = sum(w * v for w, v in zip(weights, x)) + bias - y
        for i in range(FEATURES):
            grad_w[i] += 2 * error * x[i] / BATCH
        grad_b += 2 * error / BATCH
    return [w - lr * g for w, g in zip(weights, grad_w)], bias - lr * grad_b


def save_checkpoint(ckpt_root: Path, step: int, weights: list[float], bias: float) -> None:
    step_dir = ckpt_root / f"step-{step:06d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    with open_part(step_dir, "model.json") as part:
        part.write(json.dumps({"step": step, "weights": weights, "bias": bias}).encode())
    write_manifest(
        step_dir,
        job_id=os.environ.get("FLASHML_JOB_ID", "local"),
        attempt_id=os.environ.get("FLASHML_ATTEMPT_ID", "local"),
        step=step,
        framework="python",
        digests={"model.json": part.digest},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--crash-at-step", type=int, default=None)
    parser.add_argument("--sleep-per-step", type=float, default=0.02)
    args = parser.parse_args(argv)

    out = Path(os.environ.get("FLASHML_OUTPUT_DIR", "."))
    ckpt_root = Path(os.environ.get("FLASHML_CKPT_DIR", str(out / ".." / "ckpt")))
    out.mkdir(parents=True, exist_ok=True)
    data = make_dataset()
    weights, bias, start = [0.0] * FEATURES, 0.0, 0
    manifest = latest_valid_manifest(ckpt_root)
    if manifest is not None:
        state = json.loads((Path(manifest.storage_prefix) / "model.json").read_text())
        weights, bias, start = state["weights"], state["bias"], manifest.step
        print(f"resumed from step {start} ({manifest.manifest_id})", flush=True)
    else:
        print("fresh start at step 0", flush=True)

    with open(out / "metrics.jsonl", "a") as stream:
        for step in range(start, args.steps):
            if args.crash_at_step is not None and step == args.crash_at_step and start == 0:
                print(f"injected crash at step {step}: SIGKILL", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            weights, bias = sgd_step(data, step, weights, bias, args.lr)
            loss = mse(data, weights, bias)
            stream.write(json.dumps({"step": step + 1, "loss": loss}) + "\n")
            stream.flush()
            if args.checkpoint_every > 0 and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
                save_checkpoint(ckpt_root, step + 1, weights, bias)
            time.sleep(args.sleep_per_step)

    final = {"final_loss": mse(data, weights, bias), "steps": args.steps, "started_from_step": start,
             "resumed": start > 0, "weights": weights, "bias": bias}
    (out / "metrics.json").write_text(json.dumps(final, indent=1))
    print(f"done: final_loss={final['final_loss']:.6f} (started from step {start})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
