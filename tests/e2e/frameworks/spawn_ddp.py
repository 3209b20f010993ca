"""DDP started with torch.multiprocessing.spawn, as the PyTorch DDP tutorial shows, with a
checkpoint of its own (checkpoint.pt, written by rank 0) that it resumes from."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, SAVE_EVERY, PATH = 60, 10, "checkpoint.pt"


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def train(rank, world_size, port, step_seconds):
    setup(rank, world_size, port)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(5, 10), torch.nn.ReLU(), torch.nn.Linear(10, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    start = 0
    if os.path.exists(PATH):
        checkpoint = torch.load(PATH, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = checkpoint["step"]
        print(f"rank {rank} resumed at step {start}", flush=True)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, 2, 4, 5, generator=generator)
    for step in range(start, STEPS):
        inputs = x[step, rank]
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(step_seconds)
        if rank == 0 and (step + 1) % SAVE_EVERY == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                       PATH + ".tmp")
            os.replace(PATH + ".tmp", PATH)
        dist.barrier()
    if rank == 0:
        with open("metrics.json", "w") as f:
            json.dump({"final_loss": loss.item()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    port = sys.argv[1] if len(sys.argv) > 1 else "29561"
    step_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    mp.spawn(train, args=(2, port, step_seconds), nprocs=2, join=True)
