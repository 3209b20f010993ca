"""A plain PyTorch loop made distributed with accelerate (`accelerate launch --multi_gpu
--num_processes 2`, on CPU), saving with save_state every few steps and resuming from the
newest step_<n> directory; it prints its final figures as one JSON line."""

import argparse
import json
import os
import re
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--checkpointing_steps", type=int, default=8)
    parser.add_argument("--output_dir", default="acc-out")
    parser.add_argument("--step_seconds", type=float, default=0.1)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    set_seed(3)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 6, generator=generator)
    y = (x[:, :1] - x[:, 1:2]) * 0.5
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    completed = 0
    if os.path.isdir(args.output_dir):
        saved = [d for d in os.listdir(args.output_dir) if re.fullmatch(r"step_[0-9]+", d)]
        if saved:
            newest = max(saved, key=lambda d: int(d.split("_")[1]))
            accelerator.print(f"Resumed from checkpoint: {newest}")
            accelerator.load_state(os.path.join(args.output_dir, newest))
            completed = int(newest.split("_")[1])
    batches = accelerator.skip_first_batches(loader, completed) if completed else loader
    loss = None
    for step, (inputs, targets) in enumerate(batches, start=completed):
        if step >= args.steps:
            break
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        time.sleep(args.step_seconds)
        if (step + 1) % args.checkpointing_steps == 0:
            accelerator.save_state(os.path.join(args.output_dir, f"step_{step + 1}"))
    final = accelerator.gather(loss.detach().reshape(1)).mean().item()
    weights = sum(p.detach().abs().sum().item() for p in accelerator.unwrap_model(model).parameters())
    if accelerator.is_main_process:
        print(json.dumps({"final_loss": final, "weight_norm": weights}), flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
