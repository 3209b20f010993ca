"""``flashruntime plan`` through the real console entry in a subprocess:
exit 0 with a plan, 3 with no valid strategy, 1 for an invalid or unreadable request,
2 for YAML without pyyaml (simulated by a meta-path finder that refuses ``yaml``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import REPO_ROOT, blocking_prelude

EXAMPLE_JSON = REPO_ROOT / "examples" / "plan-qwen7b-lora.json"
EXAMPLE_YAML = REPO_ROOT / "examples" / "plan-qwen7b-lora.yaml"
CPU_EXAMPLE = REPO_ROOT / "examples" / "plan-cpu-mlp.json"
MLP_SCRIPT = REPO_ROOT / "examples" / "ddp_train.py"


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flashruntime.cli", "plan", *args], capture_output=True,
                          text=True, cwd=cwd or REPO_ROOT, timeout=120, check=False, env=env)


def test_example_plans_with_exit_0_and_the_rendered_report() -> None:
    result = _cli(str(EXAMPLE_JSON))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("SELECTED PLAN pl_")
    assert "  strategy    ddp + lora(r=16)" in lines
    assert "Candidates evaluated (12):" in lines


@pytest.mark.torch
def test_a_cpu_only_plan_for_the_example_mlp_with_profile_is_a_plan_not_a_refusal() -> None:
    """The real profiler runs the example MLP on the CPU (one process); its measured step time
    is the CPU plan's time, shown in seconds and labelled as measured on the CPU."""
    pytest.importorskip("torch")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    # A fixed pause per step keeps 200 steps well under a minute on a loaded host and well over 0 s.
    command = f"{sys.executable} {MLP_SCRIPT} --sleep-per-step 0.02"
    result = _cli(str(CPU_EXAMPLE), "--profile", command, "--steps", "200", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("SELECTED PLAN pl_")
    assert "  strategy    cpu" in lines and "  topology    1 process(es) on the CPU (one host)" in lines
    [time_line] = [line for line in lines if line.startswith("  time ")]
    assert re.fullmatch(r"  time {8}\d+(\.\d+)? s \(profiled on the CPU\)", time_line), time_line
    assert re.search(r"time \d+(\.\d+)? s = 200 steps x [0-9.]+ s/step profiled on the CPU", result.stdout)
    assert "no time estimate" not in result.stdout and "single_gpu" not in result.stdout
    assert "profile failed" not in result.stdout


def test_a_cpu_only_plan_without_a_profile_says_there_is_no_time_estimate() -> None:
    result = _cli(str(CPU_EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "  strategy    cpu" in result.stdout.splitlines() and "  time        no estimate" in result.stdout
    assert "  - no time estimate for CPU: the planner has no CPU throughput model" in result.stdout


def test_json_output_is_the_report_without_nulls() -> None:
    result = _cli(str(EXAMPLE_JSON), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kind"] == "PlanReport" and report["selected"]["strategy_family"] == "ddp"
    assert "no_valid_strategy_hint" not in report  # exclude_none
    assert result.stdout.startswith('{\n  "apiVersion"')  # indent 2


def test_yaml_twin_gives_the_same_report() -> None:
    pytest.importorskip("yaml")
    from_yaml, from_json = _cli(str(EXAMPLE_YAML), "--json"), _cli(str(EXAMPLE_JSON), "--json")
    assert from_yaml.returncode == 0, from_yaml.stderr
    assert json.loads(from_yaml.stdout) == json.loads(from_json.stdout)


def test_no_valid_strategy_exits_3_with_the_hint(tmp_path: Path) -> None:
    request = tmp_path / "huge.json"
    request.write_text(json.dumps({"workload": {"kind": "transformer_finetune", "model": "Llama-3.1-70B",
                                                "method": "full"},
                                   "resources": {"gpus": 1, "gpu_type": "t4"}}))
    result = _cli(str(request))
    assert result.returncode == 3, result.stderr
    assert result.stdout.startswith("NO VALID STRATEGY\n  no valid strategy: the nearest miss is single_gpu")


def test_unknown_model_exits_3_with_the_precise_hint(tmp_path: Path) -> None:
    request = tmp_path / "unknown.json"
    request.write_text(json.dumps({"workload": {"kind": "transformer_finetune", "model": "acme/mystery"},
                                   "resources": {"gpus": 1, "gpu_type": "h100"}}))
    result = _cli(str(request), "--json")
    assert result.returncode == 3
    hint = json.loads(result.stdout)["no_valid_strategy_hint"]
    assert hint.startswith("unknown model 'acme/mystery'") and "workload.parameters_b" in hint


def test_invalid_request_exits_1_with_the_validation_error(tmp_path: Path) -> None:
    request = tmp_path / "bad.json"
    request.write_text(json.dumps({"workload": {"kind": "transformer_finetune", "model": "gpt2", "lora_rank": 0}}))
    result = _cli(str(request))
    assert result.returncode == 1
    assert "is not a valid PlanRequest" in result.stderr and "lora_rank" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("name", "content", "message"), [
    ("broken.json", "{not json", "not valid JSON"),
    ("missing.json", None, "cannot read request file"),
])
def test_unreadable_request_exits_1(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    result = _cli(str(path))
    assert result.returncode == 1
    assert message in result.stderr


@pytest.mark.parametrize("name", ["latin1.json", "latin1.yaml"])
def test_a_request_that_is_not_utf8_exits_1_with_a_message_not_a_traceback(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes('{"model": "caf\u00e9"}'.encode("latin-1"))
    result = _cli(str(path))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"flashruntime plan: {path}: not UTF-8 text (byte 0xe9 at offset 14); save the request as UTF-8 JSON or YAML"
    )


def test_yaml_without_pyyaml_exits_2_with_the_install_hint() -> None:
    code = blocking_prelude(refuse=("yaml",)) + (
        "import runpy\n"
        f"sys.argv = ['flashruntime', 'plan', {str(EXAMPLE_YAML)!r}]\n"
        "runpy.run_module('flashruntime.cli.dispatch', run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2, result.stderr
    assert "reading a YAML request needs pyyaml: pip install 'flashruntime[service]'" in result.stderr
    assert result.stdout == ""


def test_a_misspelt_key_is_warned_about_and_the_plan_is_made_as_before(tmp_path: Path) -> None:
    request = json.loads(EXAMPLE_JSON.read_text())
    request["workload"]["methd"] = "full"  # ignored by PlanRequest: said on stderr, not refused
    request["resorces"] = {"gpus": 64}
    misspelt = tmp_path / "misspelt.json"
    misspelt.write_text(json.dumps(request))
    result, plain = _cli(str(misspelt), "--json"), _cli(str(EXAMPLE_JSON), "--json")
    assert result.returncode == plain.returncode == 0
    assert result.stderr.splitlines() == [
        ("flashruntime plan: warning: workload.methd is not a field of PlanRequest and is ignored "
         "(did you mean 'method'?)"),
        "flashruntime plan: warning: resorces is not a field of PlanRequest and is ignored (did you mean 'resources'?)",
    ]
    assert json.loads(result.stdout)["selected"] == json.loads(plain.stdout)["selected"]
    assert plain.stderr == ""


def test_plan_into_a_closed_pipe_exits_1_without_a_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (| head -1) is gone before the report is printed
    try:
        for output in ((), ("--json",)):
            result = subprocess.run([sys.executable, "-m", "flashruntime.cli", "plan", str(EXAMPLE_JSON),
                                     *output], stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                                    timeout=120, check=False)
            assert (result.returncode, result.stderr) == (1, "")
    finally:
        os.close(write_end)


def test_a_warning_into_a_closed_stderr_stops_nothing(tmp_path: Path) -> None:
    """Only a closed stdout is the quiet end of ``| head``: with stderr's reader gone, the
    warnings (advice) are dropped and the report is still written, exit 0."""
    request = json.loads(EXAMPLE_JSON.read_text())
    request["workload"]["methd"] = "full"
    misspelt = tmp_path / "misspelt.json"
    misspelt.write_text(json.dumps(request))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with (tmp_path / "report.json").open("w") as report:
            result = subprocess.run([sys.executable, "-m", "flashruntime.cli", "plan", str(misspelt), "--json"],
                                    stdout=report, stderr=write_end, cwd=REPO_ROOT, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert result.returncode == 0
    assert json.loads((tmp_path / "report.json").read_text())["selected"] is not None


def test_plan_with_stdout_closed_from_the_start_exits_as_usual() -> None:
    """fd 1 closed before the process starts (``>&-``, some supervisors): Python sets
    sys.stdout to None and print() writes nothing; the exit code is the command's own."""
    result = subprocess.run(["bash", "-c", 'exec "$@" >&-', "_", sys.executable, "-m", "flashruntime.cli",
                             "plan", str(EXAMPLE_JSON)], stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                            timeout=120, check=False)
    assert (result.returncode, result.stderr) == (0, "")
