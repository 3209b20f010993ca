"""Model and GPU resolution and bad input: an unknown model without
parameters_b, an unknown GPU without vram_gb and zero GPUs for a fine-tune each give a
report with a precise hint - never an exception."""

from __future__ import annotations

import re

import pytest

from flashruntime.planner import plan, render
from flashruntime.planner.catalog_gpus import GPUS, resolve_gpu
from flashruntime.planner.catalog_models import MODELS, catalog_key, resolve_model
from flashruntime.protocol.plan_v1alpha1 import PlanReport, PlanRequest


def _plan(workload: dict, **resources: object) -> PlanReport:
    return plan(PlanRequest.model_validate({"workload": workload, "resources": resources}))


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("qwen2.5-72b", "qwen2.5-72b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b"),
        ("meta-llama/Llama-3.2-3B", "llama-3.2-3b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("google/gemma-2-9b", "gemma-2-9b"),
        ("openai-community/GPT2", "gpt2"),
        ("someone/Llama-3.2-1B-hf", "llama-3.2-1b"),
        ("x/Qwen2.5-0.5B-base", "qwen2.5-0.5b"),
        ("x/Qwen2.5-1.5B-Chat", "qwen2.5-1.5b"),
    ],
)
def test_catalog_key_matches_case_insensitively_after_stripping_one_suffix(name: str, key: str) -> None:
    assert catalog_key(name) == key
    assert key in MODELS


def test_catalog_covers_the_spec_names() -> None:
    for size in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b"):
        assert f"qwen2.5-{size}" in MODELS
    for key in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "gemma-2-9b", "gpt2"):
        assert key in MODELS
    spec_gpus = {"h100", "a100-80gb", "a100-40gb", "a100", "l40s", "rtx4090", "rtx3090", "a10", "l4", "v100", "t4"}
    assert set(GPUS) == spec_gpus


def test_explicit_fields_override_the_catalog() -> None:
    shape = resolve_model("Qwen/Qwen2.5-7B", parameters_b=8.0, hidden_size=4096, num_layers=30)
    assert (shape.params, shape.hidden, shape.layers) == (8.0e9, 4096, 30)
    assert shape.vocab == 152_064  # the rest still from the catalog


def test_unknown_model_with_parameters_b_derives_a_shape_and_says_so() -> None:
    shape = resolve_model("acme/foo-7b", parameters_b=6.7, hidden_size=None, num_layers=None)
    assert 30 <= shape.layers <= 34 and shape.hidden == 128 * shape.layers  # GPT-3 6.7B: 32 x 4096
    report = _plan({"kind": "transformer_finetune", "model": "acme/foo-7b", "parameters_b": 6.7},
                   gpus=1, gpu_type="h100")
    assert report.candidates and any("not known; assumed" in w for w in report.warnings)


def test_unknown_model_without_parameters_b_is_a_report_with_a_hint() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "acme/foo-13b"}, gpus=2, gpu_type="a10")
    assert report.selected is None and report.candidates == []
    assert report.no_valid_strategy_hint is not None
    assert re.search(r"unknown model 'acme/foo-13b' \(looked up as 'foo-13b'\).*Set workload\.parameters_b",
                     report.no_valid_strategy_hint)
    assert "NO VALID STRATEGY" in render(report)


def test_unknown_gpu_without_vram_is_a_report_with_a_hint() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "gpt2"}, gpus=1, gpu_type="Quantum-X9")
    assert report.selected is None and report.candidates == []
    assert re.search(r"unknown GPU type 'Quantum-X9' \(looked up as 'quantum-x9'\).*Set resources\.vram_gb",
                     report.no_valid_strategy_hint or "")


def test_unknown_gpu_with_vram_plans_memory_but_not_time() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "gpt2", "train_tokens_m": 10},
                   gpus=1, gpu_type="Quantum-X9", vram_gb=40)
    assert report.selected is not None and report.selected.memory is not None
    assert report.selected.est_time_min is None
    assert any("throughput unknown" in w for w in report.warnings)


def test_zero_gpus_for_a_finetune_is_a_report_with_a_hint() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "Qwen/Qwen2.5-0.5B"})
    assert report.selected is None and report.candidates == []
    assert re.search(r"needs at least one GPU, but resources\.gpus = 0\. Set resources\.gpus >= 1",
                     report.no_valid_strategy_hint or "")


def test_no_gpu_memory_known_is_a_report_with_a_hint() -> None:
    report = _plan({"kind": "transformer_finetune", "model": "gpt2"}, gpus=2)
    assert re.search(r"needs the GPU's memory: set resources\.gpu_type", report.no_valid_strategy_hint or "")


def test_gpu_resolution_normalises_spelling_and_vram_overrides() -> None:
    assert resolve_gpu("NVIDIA RTX 4090", None) == resolve_gpu("rtx4090", None)
    facts = resolve_gpu("A100", 80.0)
    assert facts is not None and facts.vram_gb == 80.0 and facts.tflops("bf16") == 312.0
    assert resolve_gpu(None, None) is None
    with pytest.raises(ValueError, match=r"unknown GPU type 'b9000'.*resources\.vram_gb"):
        resolve_gpu("b9000", None)


def test_pytorch_training_without_gpus_resolves_no_gpu() -> None:
    """A CPU plan needs no GPU facts: an unknown gpu_type, which a GPU plan refuses, is only noted."""
    report = _plan({"kind": "pytorch_training", "parameters_m": 25}, gpus=0, gpu_type="b9000")
    assert report.selected is not None and report.selected.strategy_family == "cpu"
    assert "resources.gpus = 0: planned on the CPU, resources.gpu_type and vram_gb are not used" in report.warnings
    with_gpus = _plan({"kind": "pytorch_training", "parameters_m": 25}, gpus=1, gpu_type="b9000")
    assert with_gpus.selected is None and "unknown GPU type 'b9000'" in (with_gpus.no_valid_strategy_hint or "")


def test_the_internal_error_is_a_flashruntime_value_error() -> None:
    from flashruntime.errors import FlashRuntimeError
    from flashruntime.planner.unplannable import UnplannableRequest

    assert issubclass(UnplannableRequest, FlashRuntimeError) and issubclass(UnplannableRequest, ValueError)
    with pytest.raises(UnplannableRequest, match=r"unknown model 'x/y'.*workload\.parameters_b"):
        resolve_model("x/y", parameters_b=None, hidden_size=None, num_layers=None)
