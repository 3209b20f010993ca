"""The task modules a worker agent runs for module payloads, and the parameters a
federated-averaging task takes: facts both the coordinator (which expands jobs into
such tasks) and the agent (which refuses anything else) need, so they live here."""

from __future__ import annotations

__all__ = ["ALLOWED_TASK_MODULES", "FEDAVG_DRIVER_SUPPLIED_KEYS", "FEDAVG_WORKER_PARAM_KEYS"]

# ``python -m <module> --spec spec.json --out out/`` for exactly these.
ALLOWED_TASK_MODULES = frozenset({
    "flashml_workloads.sklearn_trial",
    "flashml_workloads.kmeans_shard",
    "flashml_workloads.sgd_trainer",
    "flashml_workloads.fedavg_worker",
})
# What a federated_averaging job's parameters must give each worker, and what the
# expansion adds per task; together, every parameter ``fedavg_worker`` reads.
FEDAVG_WORKER_PARAM_KEYS = ("local_steps", "lr", "batch_size", "seed", "in_dim", "hidden", "out_dim", "dataset_size")
FEDAVG_DRIVER_SUPPLIED_KEYS = ("round", "shard", "num_shards")
