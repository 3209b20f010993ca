"""Built-in GPU catalog and GPU resolution (step 2 of the pipeline).

Keyed by the lower-cased ``gpu_type``; ``Resources.vram_gb`` overrides the catalog's
memory. VRAM is stored in GiB as the vendor's "GB" figure; throughput is
the dense (non-sparse) tensor rate from each vendor datasheet, in TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashruntime.planner.unplannable import UnplannableRequest

# key -> (vram GiB, dense bf16/fp16 tensor TFLOP/s, dense fp32-path TFLOP/s (TF32 tensor where the GPU has it),
#         has bf16)
_GpuRow = tuple[float, float, float, bool]

GPUS: dict[str, _GpuRow] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB; BF16 1,979 TFLOPS and TF32 989 TFLOPS "with sparsity",
    # i.e. 989.5 and 494.5 dense.
    "h100": (80.0, 989.5, 494.5, True),
    # NVIDIA A100 Tensor Core GPU datasheet: 80 GB or 40 GB HBM2(e); BF16 312 TFLOPS, TF32 156 TFLOPS dense.
    "a100-80gb": (80.0, 312.0, 156.0, True),
    "a100-40gb": (40.0, 312.0, 156.0, True),
    # Bare "a100": the 40 GB launch configuration of the same datasheet - the smaller memory, so a plan never
    # assumes memory the card may not have.
    "a100": (40.0, 312.0, 156.0, True),
    # NVIDIA L40S datasheet: 48 GB GDDR6; BF16 733 TFLOPS and TF32 366 TFLOPS with sparsity -> 362.05 and 183 dense.
    "l40s": (48.0, 362.05, 183.0, True),
    # NVIDIA Ada Lovelace architecture whitepaper (v2.1), Appendix Table: GeForce RTX 4090, 24 GB GDDR6X;
    # peak BF16 tensor TFLOPS with FP32 accumulate 165.2 dense; peak TF32 tensor 82.6 dense.
    "rtx4090": (24.0, 165.2, 82.6, True),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, Table 9: GeForce RTX 3090, 24 GB GDDR6X; peak BF16 tensor
    # TFLOPS with FP32 accumulate 71 dense; peak TF32 tensor 35.6 dense.
    "rtx3090": (24.0, 71.0, 35.6, True),
    # NVIDIA A10 Tensor Core GPU datasheet: 24 GB GDDR6; BF16 125 TFLOPS, TF32 62.5 TFLOPS dense.
    "a10": (24.0, 125.0, 62.5, True),
    # NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6; BF16 242 TFLOPS and TF32 120 TFLOPS with sparsity ->
    # 121 and 60 dense.
    "l4": (24.0, 121.0, 60.0, True),
    # NVIDIA V100 Tensor Core GPU datasheet (SXM2): 16 GB or 32 GB HBM2 (16 GB, the launch size, taken here);
    # FP16 tensor 125 TFLOPS; FP32 15.7 TFLOPS. Volta has no bf16 support.
    "v100": (16.0, 125.0, 15.7, False),
    # NVIDIA T4 Tensor Core GPU datasheet: 16 GB GDDR6; mixed-precision FP16/FP32 65 TFLOPS; FP32 8.1 TFLOPS.
    # Turing has no bf16 support.
    "t4": (16.0, 65.0, 8.1, False),
}

ALIASES: dict[str, str] = {
    "h100-80gb": "h100",
    "h100-sxm": "h100",
    "a100-sxm4-80gb": "a100-80gb",
    "a100-sxm4-40gb": "a100-40gb",
    "rtx-4090": "rtx4090",
    "geforce-rtx-4090": "rtx4090",
    "rtx-3090": "rtx3090",
    "geforce-rtx-3090": "rtx3090",
    "v100-16gb": "v100",
    "tesla-t4": "t4",
    "tesla-v100": "v100",
}


@dataclass(frozen=True)
class GpuFacts:
    """What the planner knows about the GPU: memory always, throughput when the type is in the catalog."""

    label: str
    vram_gb: float
    tflops_16bit: float | None
    tflops_fp32: float | None
    has_bf16: bool = True

    def tflops(self, precision: str) -> float | None:
        return self.tflops_fp32 if precision == "fp32" else self.tflops_16bit


def gpu_key(gpu_type: str) -> str:
    """Lower-cased ``gpu_type``; spaces and underscores read as dashes, a leading ``nvidia`` dropped."""
    key = gpu_type.strip().lower().replace("_", "-").replace(" ", "-")
    if key.startswith("nvidia-"):
        key = key[len("nvidia-") :]
    return ALIASES.get(key, key)


def resolve_gpu(gpu_type: str | None, vram_gb: float | None) -> GpuFacts | None:
    """GPU facts, or None when the request names neither a type nor a memory size.

    Raises ``UnplannableRequest`` (a ``ValueError``) for a ``gpu_type`` outside the catalog without ``vram_gb``.
    """
    if gpu_type is None:
        if vram_gb is None:
            return None
        return GpuFacts(f"{vram_gb:g} GB GPU", vram_gb, None, None)
    key = gpu_key(gpu_type)
    row = GPUS.get(key)
    if row is None:
        if vram_gb is None:
            known = ", ".join(GPUS)
            raise UnplannableRequest(
                f"unknown GPU type {gpu_type!r} (looked up as {key!r}): the planner needs its memory. "
                f"Set resources.vram_gb (GB per GPU), or use a catalog GPU: {known}"
            )
        return GpuFacts(gpu_type, vram_gb, None, None)
    vram, tflops_16, tflops_32, has_bf16 = row
    return GpuFacts(key, vram_gb if vram_gb is not None else vram, tflops_16, tflops_32, has_bf16)
