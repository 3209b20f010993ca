"""CPU plans: a request without GPUs plans ``cpu`` and ``cpu_ddp_x<W>`` on host RAM, with no
time until a profile measures one; a step time measured on the CPU is labelled "profiled on
the CPU" and never stands for a GPU candidate's; a report says one thing about time, and a
time under a minute reads in seconds."""

from __future__ import annotations

import json

import pytest

import flashruntime as flash
from flashruntime.planner.menu_cpu import NO_CPU_TIME_NOTE
from flashruntime.planner.timing import duration_text, shown_minutes
from flashruntime.profiling import ProfileResult
from tests._support import REPO_ROOT

EXAMPLE = json.loads((REPO_ROOT / "examples" / "plan-cpu-mlp.json").read_text())
MLP = EXAMPLE["workload"]


def _request(**resources: object) -> dict:
    return {"workload": MLP, "resources": {"gpus": 0, **resources}}


def _by_name(report: flash.PlanReport) -> dict:
    return {c.name: c for c in report.candidates}


def _cpu_profile(workers: int = 1, family: str | None = "cpu", **figures: object) -> ProfileResult:
    return ProfileResult(step_time_s=0.0242, measured_steps=10, strategy_family=family, workers=workers,
                         device="cpu", **figures)


def test_the_example_is_a_cpu_only_request_for_the_example_mlp() -> None:
    # examples/ddp_train.py: Linear(8, 16) + Linear(16, 1) = 8 x 16 + 16 + 16 + 1 = 161 parameters.
    assert MLP["kind"] == "pytorch_training" and MLP["parameters_m"] == 161 / 1e6
    assert EXAMPLE["resources"]["gpus"] == 0


def test_without_a_profile_a_cpu_request_is_a_plan_with_no_time_estimate() -> None:
    report = flash.plan(EXAMPLE)
    assert report.selected is not None and report.no_valid_strategy_hint is None
    s = report.selected
    assert (s.strategy_family, s.workers, s.gpus_per_worker, s.launcher, s.workload_mode) == (
        "cpu", 1, 0, "local_process", "local")
    assert sorted(_by_name(report)) == ["cpu", "cpu_ddp_x2"]
    assert all(c.est_time_min is None and c.est_cost_usd is None for c in report.candidates)
    assert s.est_time_min is None and s.est_cost_usd is None
    assert NO_CPU_TIME_NOTE == ("no time estimate for CPU: the planner has no CPU throughput model; profile a few "
                                "steps (--profile CMD --steps N) for a measured time")
    assert NO_CPU_TIME_NOTE in report.warnings
    assert ("no time estimate: the planner has no CPU throughput model; profile a few steps (--profile CMD "
            "--steps N) for a measured time") in s.selected_because
    text = flash.render(report)
    assert "  time        no estimate" in text.splitlines()
    assert "  topology    1 process(es) on the CPU (one host)" in text.splitlines()
    assert " min" not in text and " s (" not in text  # no made-up number anywhere


@pytest.mark.parametrize(("cores", "names"), [
    (1, ["cpu"]),
    (3, ["cpu", "cpu_ddp_x2", "cpu_ddp_x3"]),
    (8, ["cpu", "cpu_ddp_x2", "cpu_ddp_x4", "cpu_ddp_x8"]),
    (64, ["cpu", "cpu_ddp_x2", "cpu_ddp_x4", "cpu_ddp_x8"]),
])
def test_the_gloo_world_follows_the_cores_given_capped_at_eight(cores: int, names: list[str]) -> None:
    report = flash.plan(_request(cpu_cores=cores))
    assert sorted(_by_name(report), key=lambda n: (len(n), n)) == names
    capped = "CPU data parallel capped at 8 processes on one host (resources.cpu_cores = 64)"
    assert (capped in report.warnings) == (cores == 64)


def test_without_cpu_cores_two_processes_are_planned_and_said_so() -> None:
    report = flash.plan(_request())
    assert sorted(_by_name(report)) == ["cpu", "cpu_ddp_x2"]
    assert ("resources.cpu_cores not set: CPU data parallel planned on at most 2 processes; give the host's core "
            "count for wider plans") in report.warnings


def test_cpu_ddp_is_coordinated_gloo_under_torchrun() -> None:
    report = flash.plan({**_request(cpu_cores=2), "objective": {"mode": "reliable"}})
    ddp = next(c for c in report.candidates if c.name == "cpu_ddp_x2")
    assert ddp.status == "feasible" and ddp.memory is None
    assert ddp.reasons[0].startswith("host RAM 2 process(es) x 0.0 GB of tensors (weights 0.0 + gradients 0.0")
    measured = flash.plan(_request(cpu_cores=2), profile=_cpu_profile(2, "cpu_ddp"), steps=200)
    s = measured.selected
    assert (s.strategy_family, s.workers, s.launcher, s.workload_mode, s.colocated) == (
        "cpu_ddp", 2, "torchrun", "coordinated_training", True)
    assert [f"{lib.name} ({lib.role})" for lib in s.libraries] == [
        "torchrun (launcher)", "torch.nn.parallel.DistributedDataParallel (distribution)",
        "torch.distributed.checkpoint (checkpointing)"]
    assert "gloo" in s.libraries[1].purpose and s.checkpoint is not None


def test_a_model_over_host_ram_is_infeasible_with_the_fix_in_the_hint() -> None:
    big = {"workload": {"kind": "pytorch_training", "parameters_m": 2000, "activation_gb_per_gpu": 4},
           "resources": {"gpus": 0, "cpu_cores": 2, "cpu_ram_gb": 16}}
    report = flash.plan(big)
    assert report.selected is None
    assert report.no_valid_strategy_hint.startswith("no valid strategy: the nearest miss is cpu (infeasible): "
                                                    "host RAM 1 process(es) x 33.8 GB of tensors")
    assert report.no_valid_strategy_hint.endswith("> 0.80 x 16 GB host RAM = 12.8 GB; it needs cpu_ram_gb >= 42")


def test_a_cpu_profile_is_the_time_estimate_in_seconds() -> None:
    report = flash.plan(EXAMPLE, profile=_cpu_profile(), steps=200)
    cpu = _by_name(report)["cpu"]
    assert cpu.status == "selected" and cpu.est_time_min.basis == "profiled"
    assert cpu.est_time_min.value == shown_minutes(200 * 0.0242 / 60) == 0.0807
    assert "time 4.84 s = 200 steps x 0.0242 s/step profiled on the CPU" in cpu.reasons
    text = flash.render(report)
    assert "  time        4.84 s (profiled on the CPU)" in text.splitlines()
    assert "cpu [cpu, 1 worker(s)] - 4.84 s (profiled on the CPU)" in text
    assert "0 min" not in text


def test_one_time_line_when_a_measurement_gives_the_only_time() -> None:
    report = flash.plan(EXAMPLE, profile=_cpu_profile(), steps=200)
    text = flash.render(report)
    assert "no time estimate" not in text  # the measured time is the report's time
    assert ("time unknown: the planner has no CPU throughput model; profile a few steps (--profile CMD --steps N) "
            "for a measured time") in _by_name(report)["cpu_ddp_x2"].reasons
    assert NO_CPU_TIME_NOTE not in report.warnings


def test_one_time_line_for_a_gpu_plan_timed_only_by_its_profile() -> None:
    request = {"workload": {"kind": "pytorch_training", "parameters_m": 0.0003},
               "resources": {"gpus": 2, "vram_gb": 24}}
    gpu = ProfileResult(step_time_s=0.5, measured_steps=10, strategy_family="ddp", workers=2, device="cuda:0")
    report = flash.plan(request, profile=gpu, steps=600)
    ddp = _by_name(report)["ddp_x2"]
    assert ddp.est_time_min.value == 5.0 and "time 5 min = 600 steps x 0.5 s/step profiled" in ddp.reasons
    assert not any("no time estimate" in r or "time unknown" in r for r in ddp.reasons)
    assert "time unknown: est_train_gpu_hours not set" in _by_name(report)["single_gpu"].reasons
    assert ("est_train_gpu_hours not set: no static time or cost estimates; only the measured figures have one"
            in report.warnings)
    assert "no time estimate" not in flash.render(report)
    assert "est_train_gpu_hours not set: no time or cost estimates" in flash.plan(request).warnings


@pytest.mark.parametrize("family", ["cpu", "single_gpu", None])
def test_a_step_time_measured_on_the_cpu_is_never_a_gpu_figure(family: str | None) -> None:
    """However the CPU run was labelled (an older profile said single_gpu), a GPU request keeps
    its static figures, and the note says the step time was profiled on the CPU."""
    request = {"workload": MLP, "resources": {"gpus": 2, "vram_gb": 24}}
    report = flash.plan(request, profile=_cpu_profile(1, family), steps=200)
    assert report.selected.strategy_family == "single_gpu"
    assert all(c.est_time_min is None for c in report.candidates)
    assert not any("profiled" in r for c in report.candidates for r in c.reasons)
    assert ("the profile ran on the CPU (1 process(es), 0.0242 s/step profiled on the CPU): it measures none of "
            "this request's GPU candidates, so their figures stay static; set resources.gpus = 0 for CPU plans, "
            "or profile on a GPU") in report.warnings
    on_cpu = flash.plan(EXAMPLE, profile=_cpu_profile(1, family), steps=200)
    assert on_cpu.selected.strategy_family == "cpu" and on_cpu.selected.est_time_min.basis == "profiled"


def test_a_measured_peak_resident_set_is_judged_on_host_ram() -> None:
    report = flash.plan(EXAMPLE, profile=_cpu_profile(host_ram_gb=0.31), steps=200)
    assert ("host RAM profiled on the CPU: 1 process(es) x 0.31 GB peak resident = 0.3 GB <= 3.2 GB (80% of host "
            "RAM)") in _by_name(report)["cpu"].reasons
    heavy = flash.plan(EXAMPLE, profile=_cpu_profile(host_ram_gb=3.5), steps=200)
    assert _by_name(heavy)["cpu"].status == "infeasible"


def test_a_gpu_price_gives_a_cpu_plan_no_cost() -> None:
    request = _request(cpu_cores=2, hourly_cost_usd_per_gpu=2.0)
    report = flash.plan(request, profile=_cpu_profile(), steps=200)
    assert report.selected.est_time_min is not None and report.selected.est_cost_usd is None
    assert "hourly_cost_usd_per_gpu prices GPUs: CPU plans have no cost estimate" in report.warnings


@pytest.mark.parametrize(("minutes", "text"), [
    (0.0807, "4.84 s"), (0.5, "30 s"), (0.999, "59.9 s"), (0.00197, "0.118 s"), (1.0, "1 min"), (96.4, "96 min"),
])
def test_a_time_under_a_minute_reads_in_seconds(minutes: float, text: str) -> None:
    assert duration_text(minutes) == text


def test_sub_minute_times_keep_three_significant_digits() -> None:
    assert shown_minutes(0.001966) == 0.00197 and shown_minutes(12.3456) == 12.35 and shown_minutes(0.0) == 0.0
