"""A tiny deterministic PyTorch DDP trainer that uses ``flashruntime.torch``.

Run it under torchrun (or ``flash.submit(integrations.pytorch.ddp("examples/ddp_train.py"))``):

    torchrun --nproc-per-node=2 --nnodes=1 --standalone --local-addr=127.0.0.1 examples/ddp_train.py --steps 40

A small MLP regresses synthetic data drawn from a fixed seed. Each step's batch depends
only on the step number (epoch = step // batches per epoch, the DistributedSampler
reseeded by epoch), so a run resumed from a checkpoint replays exactly the batches an
uninterrupted run would have seen. ``--crash-at-step`` kills this rank once, on a fresh
start only, to exercise kill-and-resume. The final loss is a full-dataset evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import flashruntime.torch as ft

SAMPLES, FEATURES, BATCH = 256, 8, 16


def make_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w = torch.randn(FEATURES, 1, generator=generator)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))


class StepBatches:
    """The batch of a global step, a pure function of the step number."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.per_epoch = len(loader)
        self._epoch: int | None = None
        self._batches: list = []

    def __call__(self, step: int):
        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            sampler = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            self._batches, self._epoch = list(self.loader), epoch
        return self._batches[index]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="total optimisation steps")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="checkpoint every N steps (0: never)")
    parser.add_argument("--crash-at-step", type=int, default=-1,
                        help="SIGKILL this rank at that step (fresh start only)")
    parser.add_argument("--crash-rank", type=int, default=0, help="which rank --crash-at-step kills")
    parser.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--lr", type=float, default=0.05)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # small model; keeps runs identical and the host quiet
    data = make_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = DataLoader(data, batch_size=BATCH, shuffle=False, drop_last=True)
    model, optimizer, loader = ft.prepare(model, optimizer, loader)
    device = ft.device()
    batches = StepBatches(loader)
    loss_fn = nn.MSELoss()
    fresh = ft.start_step() == 0

    for step in range(ft.start_step(), args.steps):
        if fresh and step == args.crash_at_step and ft.rank() == args.crash_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batches(step)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        # "step" counts completed steps, the numbering checkpoints use.
        ft.log_metrics({"step": step + 1, "loss": float(loss.item())})
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)
        ft.checkpoint(model, optimizer, step=step + 1, every=args.checkpoint_every)

    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    with torch.no_grad():
        final = float(loss_fn(inner(data.tensors[0].to(device)), data.tensors[1].to(device)).item())
    if ft.is_main():
        out = Path(os.environ.get("FLASHML_OUTPUT_DIR") or ".")
        out.mkdir(parents=True, exist_ok=True)
        summary = {"final_loss": final, "steps": args.steps, "start_step": ft.start_step(),
                   "world_size": ft.world_size(), "backend": ft.backend(), "device": device}
        (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # everyone leaves together; the exit hook then tears the group down
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
