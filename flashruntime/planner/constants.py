"""Every numeric constant of the planner's memory, time and communication models,
each beside the published source it comes from.

Units: bytes, seconds, FLOP/s. GiB = 2**30 bytes: every "GB" the planner reports.
Catalogs of models, GPUs and interconnects live in their own ``catalog_*`` modules.
"""

from __future__ import annotations

GIB = float(2**30)  # every GB in the planner is a GiB (design choice, docs/planner.md).

# --- bytes per parameter -------------------------------------------------------------------------------------
# Stored weights at the training precision: binary16 and bfloat16 are 2 bytes, binary32 is 4 bytes
# (IEEE 754-2008 §3.6; bfloat16 = the top 16 bits of binary32, Kalamkar et al. 2019, "A Study of BFLOAT16 for
# Deep Learning Training", §2).
WEIGHT_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# Gradients have the dtype of the working weights: "2Ψ" bytes of fp16 gradients under mixed precision
# (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §3.1).
GRAD_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# fp32 master copy of the weights kept by mixed-precision training (Rajbhandari et al. 2020, ZeRO §3.1: part of
# "K = 12"; Micikevicius et al. 2018, "Mixed Precision Training", §3.1).
FP32_MASTER_BYTES = 4

# Optimizer states per trainable parameter, excluding the fp32 master copy:
#   adamw        - fp32 momentum + variance, 4 + 4 bytes (ZeRO §3.1: with the master copy K = 12, so mixed-precision
#                  AdamW holds 2 + 2 + 12 = 16 bytes per parameter).
#   adamw_8bit   - 1 byte per state after block-wise quantisation, 2 bytes for both states (Dettmers et al. 2022,
#                  "8-bit Optimizers via Block-wise Quantization", ICLR, §1: 75 % less than 32-bit Adam's 8 bytes;
#                  the per-block fp32 absmax of 2048-value blocks adds 4/2048 byte per state).
#   sgd_momentum - one fp32 momentum buffer, 4 bytes (PyTorch torch.optim.SGD keeps one "momentum_buffer" per
#                  parameter in the parameter's dtype; fp32 under mixed precision's master weights).
OPTIMIZER_STATE_BYTES: dict[str, float] = {
    "adamw": 8.0,
    "adamw_8bit": 2.0 + 2 * 4 / 2048,
    "sgd_momentum": 4.0,
}

# DeepSpeed ZeRO-Offload keeps an fp32 copy of each offloaded gradient on the host next to the optimizer states
# (DeepSpeed estimate_zero3_model_states_mem_needs: 16 bytes per parameter on the CPU with offload_optimizer =
# 4 master + 8 Adam + 4 gradient).
OFFLOAD_FP32_GRAD_BYTES = 4

# NF4 storage of QLoRA: 4 bits per weight plus double-quantised constants of 0.127 bit per weight
# (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", §3 "Double Quantization":
# block size 64, constants reduced from 0.5 to 0.127 bits per parameter).
NF4_BYTES_PER_PARAM = (4 + 0.127) / 8

# --- LoRA ----------------------------------------------------------------------------------------------------
# LoRA adapts each projection W (d x d) with A (d x r) and B (r x d): 2·d·r parameters (Hu et al. 2021,
# "LoRA: Low-Rank Adaptation of Large Language Models", §4.1).
LORA_PARAMS_PER_PROJECTION_PER_RANK_PER_HIDDEN = 2
# All seven linear projections of a decoder block are adapted - q, k, v, o, gate, up, down - as QLoRA found
# necessary to match full fine-tuning (Dettmers et al. 2023, QLoRA §4: "LoRA on all linear transformer block
# layers are required to match full finetuning performance").
LORA_ADAPTED_PROJECTIONS = 7

# --- activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models") ----
# Per transformer layer without recomputation, 16-bit activations: s·b·h·(34 + 5·a·s/h) bytes
# (Korthikanti et al. 2022 §4.1, Eq. 1).
ACT_LINEAR_COEFF = 34
ACT_ATTENTION_COEFF = 5
# With full recomputation only each layer's input is kept: 2·s·b·h bytes per layer (Korthikanti et al. 2022, §4.2 /
# Table 2).
ACT_CHECKPOINT_INPUT_COEFF = 2
# Embeddings, final layer norm and output projection: 4·s·b·h·(1 + v/h) bytes, i.e. 4·s·b·h + 4·s·b·v, the
# latter being the fp32 logits kept for the cross-entropy loss (Korthikanti et al. 2022, §4.3).
ACT_OUTPUT_HIDDEN_COEFF = 4
ACT_OUTPUT_LOGITS_COEFF = 4
# The formula counts 16-bit activations; binary32 activations take twice the bytes (IEEE 754: 4 vs 2 bytes).
FP32_ACTIVATION_SCALE = 2.0

# Head dimension assumed when a model's head count is unknown: 128, as in Llama 2/3, Mistral 7B and Qwen2.5-7B
# (their config.json: hidden_size / num_attention_heads = 4096/32 = 3584/28 = 128).
DEFAULT_HEAD_DIM = 128
# Vocabulary assumed for a model outside the catalog: 32000 (Llama 2 and Mistral 7B config.json "vocab_size").
DEFAULT_VOCAB = 32_000

# --- shape derivation for models outside the catalog -------------------------------------------------------
# Non-embedding parameters of a decoder: N ≈ 12·L·h² (Kaplan et al. 2020, "Scaling Laws for Neural Language
# Models", §2.1, Table 1).
PARAMS_PER_LAYER_PER_HIDDEN_SQUARED = 12
# Aspect ratio h / L = 128 (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: GPT-3 6.7B has
# d_model 4096 over 32 layers, GPT-3 175B 12288 over 96).
HIDDEN_PER_LAYER = 128

# --- compute --------------------------------------------------------------------------------------------------
# Training FLOPs = 6·N per token: 2N forward + 4N backward (Kaplan et al. 2020, §2.1, "C ≈ 6NBS").
FLOPS_PER_PARAM_PER_TOKEN = 6
# Model FLOPs utilisation: 0.40. Llama 3 pre-training reached 38-43 % BF16 MFU (Dubey et al. 2024, "The Llama 3
# Herd of Models", Table 4); PaLM 540B 46.2 % (Chowdhery et al. 2022, Table 3). The lower end is used because
# fine-tuning runs are small and unoptimised.
MFU = 0.40
# Full activation recomputation adds one forward pass to forward (1) + backward (2): 4/3 of the work
# (Korthikanti et al. 2022 §5, and Chowdhery et al. 2022 Appendix B on hardware vs model FLOPs).
RECOMPUTE_SLOWDOWN = 4 / 3
# QLoRA's on-the-fly NF4 dequantisation: 39 % more runtime than LoRA for the same run (Raschka 2023, "Practical
# Tips for Finetuning LLMs Using LoRA", Ahead of AI: "33 % memory savings at the cost of a 39 % increase in
# runtime").
QLORA_SLOWDOWN = 1.39

# --- communication --------------------------------------------------------------------------------------------
# Ring all-reduce moves 2(W-1)/W of the buffer per rank; all-gather and reduce-scatter (W-1)/W each
# (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations"; NCCL
# PERFORMANCE.md "bus bandwidth" factors).
ALLREDUCE_FACTOR = 2
# Fraction of communication hidden behind compute: the backward pass, about 2/3 of a step's FLOPs (Kaplan et al.
# 2020 §2.1: backward = 2 x forward), is what DDP overlaps gradient all-reduce with (Li et al. 2020, "PyTorch
# Distributed: Experiences on Accelerating Data Parallel Training", VLDB, §3.2.3).
COMM_OVERLAP_FRACTION = 2 / 3
# DDP gradient bucket size: 25 MiB (PyTorch DistributedDataParallel, bucket_cap_mb default 25).
DDP_BUCKET_BYTES = 25 * 2**20
# FSDP issues per wrapped block one all-gather in forward, one in backward and one reduce-scatter (Zhao et al.
# 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB, §3.2).
FSDP_COLLECTIVES_PER_LAYER = 3
# At most two blocks' unsharded parameters are in flight (PyTorch FSDP docs, limit_all_gathers: "at most two
# consecutive FSDP instances' all-gathers"), so FSDP's transient buffer is two blocks.
FSDP_BLOCKS_IN_FLIGHT = 2

# ZeRO-Offload moves fp16 gradients to the host and fp16 parameters back each step: 2 + 2 bytes per trainable
# parameter (Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training", §4.1, Fig. 2: "2M").
OFFLOAD_HOST_BYTES_PER_PARAM = 4
# Host link: PCIe 4.0 x16 = 16 GT/s x 16 lanes x 128/130 encoding / 8 = 31.5 GB/s per direction
# (PCI-SIG, PCI Express Base Specification 4.0).
PCIE4_X16_BYTES_PER_S = 31.5e9
# CPU Adam is memory-bound (Ren et al. 2021, ZeRO-Offload §5.1): per parameter it reads the fp32 master,
# momentum, variance and gradient (4 x 4 bytes) and writes master, momentum, variance (3 x 4) and the fp16
# copy (2): 30 bytes.
CPU_ADAM_BYTES_PER_PARAM = 30
# Host memory bandwidth: 8 channels of DDR4-3200, 25.6 GB/s each = 204.8 GB/s (JEDEC JESD79-4C: 3200 MT/s x 8
# bytes per transfer; 8 channels per socket on AMD EPYC 7003 and Intel Xeon Scalable 3rd gen).
HOST_MEMORY_BYTES_PER_S = 204.8e9

# Scaling efficiency below this makes a candidate infeasible ("communication-bound"), below WARN a warning
# (design choice, docs/planner.md).
EFFICIENCY_INFEASIBLE_BELOW = 0.5
EFFICIENCY_WARN_BELOW = 0.7

# --- memory overheads -----------------------------------------------------------------------------------------
# CUDA context and kernels: 1343 MB (MiB, from nvidia-smi via pynvml) measured after the first CUDA tensor in the
# Hugging Face Transformers guide "Model training anatomy" ("GPU memory occupied: 1343 MB").
CUDA_CONTEXT_BYTES = 1343 * 2**20
# Allocator fragmentation and temporaries: 20 % on top of the tensors (EleutherAI, Anthony, Biderman & Schoelkopf
# 2023, "Transformer Math 101": total memory ≈ 1.2 x the model's tensors; Hugging Face Accelerate's model-size
# estimator guide repeats it: "expect to add up to an additional 20 %", as found by EleutherAI).
FRAGMENTATION_FRACTION = 0.20

# --- safety bands on per-GPU total vs VRAM --------------------------------------------------------
# Above 95 % of VRAM a plan is infeasible, above 80 % it needs profiling (design choice, docs/planner.md).
BAND_INFEASIBLE_ABOVE = 0.95
BAND_PROFILE_ABOVE = 0.80

# --- host RAM -------------------------------------------------------------------------------------------------
# Offloaded states and in-RAM datasets may use 80 % of host RAM (design choice, docs/planner.md).
HOST_RAM_USABLE_FRACTION = 0.80

# --- generic PyTorch training ---------------------------------------------------------------------------------
# Activations per GPU when the request gives none: 2.0 GB.
DEFAULT_PYTORCH_ACTIVATION_GB = 2.0

# --- CPU training --------------------------------------------------------------------------------------------
# Gloo data-parallel processes on one host: one per core, at most 8 (more split a host's cores and memory
# bandwidth too thinly for each rank's own thread pool); 2 when the request does not give cpu_cores (design
# choice, docs/planner.md).
CPU_DDP_MAX_WORKERS = 8
CPU_DDP_DEFAULT_WORKERS = 2

# --- classical ML ---------------------------------------------------------------------------------------------
# Working set of an in-memory fit: 3 x the dataset: the raw data, the float64 copy made by
# scikit-learn's check_array (dtype="numeric" converts to float64), and one fold/split copy (docs/planner.md).
CLASSICAL_RAM_FACTOR = 3.0
# Dataset megabytes per shard worker for sharded partial_fit, and the worker bounds (design choice,
# docs/planner.md).
SHARD_MB_PER_WORKER = 500
SHARD_MIN_WORKERS = 2
SHARD_MAX_WORKERS = 16

# --- independent tasks ----------------------------------------------------------------------------------------
# CPU cores per CPU task slot (hosts x max(1, cpu_cores // 4); design choice, docs/planner.md).
CORES_PER_CPU_TASK = 4

# --- ranking --------------------------------------------------------------------------------------------------
# "balanced": candidates within 10 % of the cheapest estimated cost rank by time first (design choice,
# docs/planner.md).
BALANCED_COST_SLACK = 1.10

# --- plan minting ---------------------------------------------------------------------------------------------
# Checkpoint every 300 s with PyTorch Distributed Checkpoint (the CheckpointPolicy defaults).
CHECKPOINT_INTERVAL_S = 300
