"""Per-GPU memory model: weights, gradients, optimizer states, activations,
transient buffers and framework overhead, for transformer fine-tunes and generic
PyTorch training, under each distribution family.

Every coefficient comes from ``constants`` (cited there). Results are GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Memory
from flashruntime.planner.catalog_models import ModelShape

SHARDED_FAMILIES = ("fsdp2", "zero3_cpu_offload")


@dataclass(frozen=True)
class FineTune:
    """A transformer fine-tune with the model resolved and the method fixed per candidate."""

    shape: ModelShape
    method: str  # full | lora | qlora
    precision: str
    optimizer: str
    lora_rank: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    train_tokens: float | None

    @cached_property
    def trainable_params(self) -> float:
        if self.method == "full":
            return self.shape.params
        return lora_params(self.shape, self.lora_rank)


def lora_params(shape: ModelShape, rank: int) -> float:
    """2·h·r per adapted projection x adapted projections x layers (Hu et al. 2021; QLoRA §4)."""
    per_projection = K.LORA_PARAMS_PER_PROJECTION_PER_RANK_PER_HIDDEN * float(shape.hidden) * rank
    return per_projection * K.LORA_ADAPTED_PROJECTIONS * float(shape.layers)


def optimizer_bytes(optimizer: str, precision: str) -> float:
    """Optimizer bytes per trainable parameter: states, plus the fp32 master copy under mixed precision."""
    master = 0 if precision == "fp32" else K.FP32_MASTER_BYTES
    return K.OPTIMIZER_STATE_BYTES[optimizer] + master


def activation_bytes(ft: FineTune, checkpointing: bool) -> float:
    """Korthikanti et al. 2022: per-layer s·b·h·(34 + 5as/h), or 2sbh per layer input plus one layer's
    working set with full recompute; plus 4sbh + 4sbv for embeddings, output layer and fp32 logits."""
    shape = ft.shape
    # floats: an astronomically large request overflows to inf (rejected later) instead of raising
    s, b, h, a = float(ft.seq_len), float(ft.micro_batch), float(shape.hidden), float(shape.heads)
    layers, v = float(shape.layers), float(shape.vocab)
    scale = K.FP32_ACTIVATION_SCALE if ft.precision == "fp32" else 1.0
    per_layer = s * b * h * (K.ACT_LINEAR_COEFF + K.ACT_ATTENTION_COEFF * a * s / h) * scale
    output = K.ACT_OUTPUT_HIDDEN_COEFF * s * b * h * scale + K.ACT_OUTPUT_LOGITS_COEFF * s * b * v
    if checkpointing:
        return layers * K.ACT_CHECKPOINT_INPUT_COEFF * s * b * h * scale + per_layer + output
    return layers * per_layer + output


def overhead_bytes(tensor_bytes: float) -> float:
    """CUDA context plus the fragmentation/temporaries allowance on top of the tensors."""
    return K.CUDA_CONTEXT_BYTES + K.FRAGMENTATION_FRACTION * tensor_bytes


def _finish(weights: float, grads: float, optim: float, acts: float, transient: float, cpu: float) -> Memory:
    tensors = weights + grads + optim + acts + transient
    g = K.GIB
    return Memory(
        weights_gb=weights / g,
        gradients_gb=grads / g,
        optimizer_gb=optim / g,
        activations_gb=acts / g,
        transient_gb=transient / g,
        overhead_gb=overhead_bytes(tensors) / g,
        cpu_offload_gb=cpu / g,
    )


class FineTuneBytes:
    """The byte counts of a fine-tune that do not depend on the family or world size: full-size
    weights, gradients, optimizer states, host-offloaded states and transient buffers.

    Built once per method by the menu, so each candidate only divides by its shard count; results
    are remembered for this object's lifetime (one plan() call), as DDP replicas hold the same
    memory at every world size.
    """

    __slots__ = ("_seen", "cpu", "ddp_transient", "grads", "optim", "sharded_transient", "weights")

    def __init__(self, ft: FineTune) -> None:
        shape = ft.shape
        wbytes = K.WEIGHT_BYTES[ft.precision]
        trainable = ft.trainable_params
        if ft.method == "qlora":
            quantized = max(0.0, shape.params - shape.embedding_params)
            base = quantized * K.NF4_BYTES_PER_PARAM + shape.embedding_params * wbytes
        else:
            base = shape.params * wbytes
        adapters = 0.0 if ft.method == "full" else trainable * wbytes
        optimizer = optimizer_bytes(ft.optimizer, ft.precision)
        self.weights = base + adapters
        self.grads = trainable * K.GRAD_BYTES[ft.precision]
        self.optim = trainable * optimizer
        # DDP copies every gradient into its all-reduce buckets (PyTorch DDP docs, gradient_as_bucket_view).
        self.ddp_transient = self.grads
        # Two blocks' unsharded parameters in flight (FSDP limit_all_gathers).
        block_bytes = shape.block_params * (K.NF4_BYTES_PER_PARAM if ft.method == "qlora" else wbytes)
        self.sharded_transient = K.FSDP_BLOCKS_IN_FLIGHT * block_bytes
        # ZeRO-3 offload: optimizer states and fp32 gradients live on the host.
        self.cpu = trainable * (optimizer + K.OFFLOAD_FP32_GRAD_BYTES)
        self._seen: dict[tuple[str, int, float], Memory] = {}

    def memory(self, family: str, workers: int, activations: float) -> Memory:
        """Per-GPU memory under ``family`` on ``workers`` GPUs with ``activations`` bytes of activations.

        ``_finish``'s arithmetic in one call: this runs once or twice per candidate.
        """
        if family in SHARDED_FAMILIES:
            shard = workers
            transient = self.sharded_transient
        else:
            shard = 1
            transient = self.ddp_transient if family == "ddp" else 0.0
        key = (family, shard, activations)
        seen = self._seen.get(key)
        if seen is not None:
            return seen
        weights = self.weights / shard
        if family == "zero3_cpu_offload":
            # The GPU keeps only its parameter shard.
            grads = optim = 0.0
            cpu = self.cpu / shard
        else:
            grads = self.grads / shard
            optim = self.optim / shard
            cpu = 0.0
        tensors = weights + grads + optim + activations + transient
        g = K.GIB
        mem = self._seen[key] = Memory(
            weights / g,
            grads / g,
            optim / g,
            activations / g,
            transient / g,
            overhead_bytes(tensors) / g,
            cpu / g,
        )
        return mem


def finetune_memory(
    ft: FineTune, family: str, workers: int, checkpointing: bool, *, activations: float | None = None
) -> Memory:
    """Per-GPU memory of a transformer fine-tune under ``family`` on ``workers`` GPUs.

    ``activations`` (bytes) may be passed in when the caller already computed them for ``ft``.
    """
    acts = activation_bytes(ft, checkpointing) if activations is None else activations
    return FineTuneBytes(ft).memory(family, workers, acts)


@dataclass(frozen=True)
class GenericTraining:
    """A PyTorch training job described by its parameter count (``PyTorchTraining``)."""

    params: float
    trainable_fraction: float
    precision: str
    optimizer: str
    activation_gb: float


def pytorch_memory(job: GenericTraining, family: str, workers: int) -> Memory:
    """Per-GPU memory of generic PyTorch training under ``family`` on ``workers`` GPUs."""
    wbytes = K.WEIGHT_BYTES[job.precision]
    trainable = job.params * job.trainable_fraction
    shard = workers if family in SHARDED_FAMILIES else 1
    weights = job.params * wbytes / shard
    grads = trainable * K.GRAD_BYTES[job.precision] / shard
    optim = trainable * optimizer_bytes(job.optimizer, job.precision) / shard
    transient = 0.0
    if family == "ddp":
        transient = trainable * K.GRAD_BYTES[job.precision]
    elif family == "fsdp2":
        # Without a layer structure the model is taken as wrapped at the root: the whole parameter set is
        # gathered for forward and backward.
        transient = job.params * wbytes
    return _finish(weights, grads, optim, job.activation_gb * K.GIB, transient, 0.0)
