"""A gloo DDP job whose rank 1 ignores SIGTERM and which never ends on its own:
the cancel path must still leave no rank alive."""

import os
import signal
import time

import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.init_process_group("gloo")
pids = os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "pids")
os.makedirs(pids, exist_ok=True)
with open(os.path.join(pids, f"rank-{rank}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(pids, f"rank-{rank}.tmp"), os.path.join(pids, f"rank-{rank}"))
while True:
    time.sleep(0.2)
