"""The memory model against hand arithmetic from its sources: ZeRO's 16 bytes/param for
mixed-precision AdamW, 8-bit AdamW states, NF4 with double quantisation, Korthikanti's
activation formula, LoRA parameter counts, and sharding per family."""

from __future__ import annotations

import pytest

from flashruntime.planner import constants as K
from flashruntime.planner.catalog_models import resolve_model
from flashruntime.planner.memory import (
    FineTune,
    GenericTraining,
    activation_bytes,
    finetune_memory,
    lora_params,
    pytorch_memory,
)

GIB = 2**30
QWEN7B = resolve_model("Qwen/Qwen2.5-7B", parameters_b=None, hidden_size=None, num_layers=None)


def _ft(method: str = "lora", precision: str = "bf16", optimizer: str = "adamw", **kw: object) -> FineTune:
    args = dict(shape=QWEN7B, method=method, precision=precision, optimizer=optimizer, lora_rank=16,
                seq_len=2048, micro_batch=1, grad_accum=8, train_tokens=None)
    args.update(kw)
    return FineTune(**args)  # type: ignore[arg-type]


def _model_state_bytes(method: str, precision: str, optimizer: str) -> float:
    mem = finetune_memory(_ft(method, precision, optimizer), "single_gpu", 1, True)
    return (mem.weights_gb + mem.gradients_gb + mem.optimizer_gb) * GIB


@pytest.mark.parametrize(
    ("precision", "optimizer", "bytes_per_param"),
    [
        ("bf16", "adamw", 16.0),  # ZeRO §3.1: 2 + 2 + 12
        ("fp32", "adamw", 16.0),  # 4 + 4 + 8, no separate master copy
        ("bf16", "adamw_8bit", 2 + 2 + 4 + 2 + 2 * 4 / 2048),  # 8-bit states + fp32 master
        ("bf16", "sgd_momentum", 2 + 2 + 4 + 4),
    ],
)
def test_full_finetune_model_states_per_parameter(precision: str, optimizer: str, bytes_per_param: float) -> None:
    assert _model_state_bytes("full", precision, optimizer) == pytest.approx(bytes_per_param * QWEN7B.params, rel=1e-4)


def test_korthikanti_activation_bytes_for_qwen_7b() -> None:
    # s=2048, b=1, h=3584, a=28, L=28, v=152064
    per_layer = 2048 * 1 * 3584 * (34 + 5 * 28 * 2048 / 3584)  # = 836,763,648
    output = 4 * 2048 * 3584 + 4 * 2048 * 152064
    assert per_layer == 836_763_648
    assert activation_bytes(_ft(), checkpointing=False) == 28 * per_layer + output
    assert activation_bytes(_ft(), checkpointing=True) == 28 * 2 * 2048 * 3584 + per_layer + output


def test_fp32_activations_take_twice_the_bytes_except_the_fp32_logits() -> None:
    half = activation_bytes(_ft(precision="bf16"), checkpointing=False)
    full = activation_bytes(_ft(precision="fp32"), checkpointing=False)
    logits = 4 * 2048 * 152064
    assert full - logits == pytest.approx(2 * (half - logits))


def test_activations_scale_with_micro_batch() -> None:
    one = activation_bytes(_ft(micro_batch=1), checkpointing=True)
    four = activation_bytes(_ft(micro_batch=4), checkpointing=True)
    assert four == pytest.approx(4 * one)


def test_lora_parameters_are_2hr_per_projection_on_seven_projections() -> None:
    assert lora_params(QWEN7B, 16) == 2 * 3584 * 16 * 7 * 28
    mem = finetune_memory(_ft(), "single_gpu", 1, True)
    assert mem.gradients_gb == pytest.approx((2 * lora_params(QWEN7B, 16)) / GIB, abs=2e-4)


def test_qlora_stores_nf4_weights_and_keeps_embeddings_in_16_bit() -> None:
    mem = finetune_memory(_ft("qlora"), "single_gpu", 1, True)
    embeddings = 152064 * 3584 * 2  # untied input embedding + lm_head
    expected = (QWEN7B.params - embeddings) * 4.127 / 8 + embeddings * 2 + lora_params(QWEN7B, 16) * 2
    assert mem.weights_gb == pytest.approx((expected) / GIB, abs=2e-4)
    assert mem.weights_gb < finetune_memory(_ft("lora"), "single_gpu", 1, True).weights_gb / 2.5


def test_sharded_families_divide_weights_ddp_replicates_and_buffers_gradients() -> None:
    single = finetune_memory(_ft("full"), "single_gpu", 1, True)
    ddp = finetune_memory(_ft("full"), "ddp", 4, True)
    fsdp = finetune_memory(_ft("full"), "fsdp2", 4, True)
    assert ddp.weights_gb == single.weights_gb and ddp.optimizer_gb == single.optimizer_gb
    assert ddp.transient_gb == pytest.approx(single.gradients_gb, rel=1e-3)  # bucket copy of the gradients
    assert fsdp.weights_gb == pytest.approx(single.weights_gb / 4, rel=1e-3)
    assert fsdp.optimizer_gb == pytest.approx(single.optimizer_gb / 4, rel=1e-3)
    assert fsdp.transient_gb == pytest.approx((2 * 12 * 3584**2 * 2) / GIB, abs=2e-4)  # two blocks in flight


def test_zero3_offload_moves_optimizer_and_fp32_gradients_to_host() -> None:
    mem = finetune_memory(_ft("full"), "zero3_cpu_offload", 4, True)
    assert mem.optimizer_gb == 0 and mem.gradients_gb == 0
    assert mem.cpu_offload_gb == pytest.approx((QWEN7B.params * (12 + 4) / 4) / GIB, abs=2e-4)


def test_overhead_is_cuda_context_plus_twenty_percent_of_tensors() -> None:
    mem = finetune_memory(_ft(), "ddp", 4, True)
    assert mem.overhead_gb == pytest.approx(1343 / 1024 + 0.20 * mem.tensors_gb, abs=1e-3)
    assert mem.total_gb == pytest.approx(mem.tensors_gb + mem.overhead_gb)


def test_generic_pytorch_memory() -> None:
    job = GenericTraining(params=100e6, trainable_fraction=0.5, precision="fp32", optimizer="adamw", activation_gb=2.0)
    mem = pytorch_memory(job, "single_gpu", 1)
    assert mem.weights_gb == pytest.approx((400e6) / GIB, abs=2e-4)
    assert mem.gradients_gb == pytest.approx((200e6) / GIB, abs=2e-4)
    assert mem.optimizer_gb == pytest.approx((400e6) / GIB, abs=2e-4)  # m + v, fp32: 8 bytes x 50e6
    assert mem.activations_gb == 2.0
    fsdp = pytorch_memory(job, "fsdp2", 4)
    assert fsdp.weights_gb == pytest.approx(mem.weights_gb / 4, rel=1e-3)
    assert K.DEFAULT_PYTORCH_ACTIVATION_GB == 2.0
