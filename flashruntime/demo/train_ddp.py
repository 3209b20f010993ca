"""Demo trainer for ``flashruntime demo --ddp``: a tiny regression under torchrun
(2 CPU ranks, gloo) through ``flashruntime.torch``, checkpointed every N steps and
resumed by the relaunch. ``--crash-at-step N`` SIGKILLs rank 0 once, on a fresh start.

torch is imported inside ``main`` so the package never needs it unless this runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--crash-at-step", type=int, default=None)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn

    import flashruntime.torch as ft

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=generator)
    y = x @ torch.tensor([[0.5], [-1.25], [2.0], [0.75]]) + 0.3
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = ft.prepare(model, optimizer)
    loss_fn = nn.MSELoss()
    fresh = ft.start_step() == 0
    for step in range(ft.start_step(), args.steps):
        if fresh and step == args.crash_at_step and ft.rank() == 0:
            print(f"injected crash at step {step}: SIGKILL rank 0", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        # Each rank takes its half of a batch chosen by the step number alone: resumable.
        rows = [(step * 16 + j) % 256 for j in range(ft.rank(), 16, ft.world_size())]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        ft.log_metrics({"step": step + 1, "loss": float(loss.item())})
        ft.checkpoint(model, optimizer, step=step + 1, every=args.checkpoint_every)
    inner = model.module if hasattr(model, "module") else model
    with torch.no_grad():
        final = float(loss_fn(inner(x), y).item())
    if ft.is_main():
        out = Path(os.environ.get("FLASHML_OUTPUT_DIR", "."))
        out.mkdir(parents=True, exist_ok=True)
        summary = {"final_loss": final, "steps": args.steps, "started_from_step": ft.start_step(),
                   "resumed": ft.start_step() > 0, "world_size": ft.world_size()}
        (out / "metrics.json").write_text(json.dumps(summary, indent=1))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # leave together; flashruntime.torch destroys the group at exit
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
