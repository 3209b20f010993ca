"""On a terminal, ``flashruntime submit`` redraws one progress line: attempt, state,
elapsed time, and the last step/loss from metrics.jsonl."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests._support import REPO_ROOT

TRAINER = """
import json, os, time
out = os.environ["FLASHML_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    for step in range(1, 16):
        f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
        f.flush()
        time.sleep(0.1)
"""


def _on_a_tty(args: list[str]) -> tuple[int, str, str]:
    """Run ``flashruntime ARGS`` with stderr on a terminal: (exit code, what the terminal
    showed, stdout)."""
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    process = subprocess.Popen([sys.executable, "-m", "flashruntime.cli", *args], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=secondary, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # EIO once the child side is closed
            break
        if not data:
            break
        chunks.append(data)
    stdout, _ = process.communicate(timeout=120)
    os.close(primary)
    return process.returncode, b"".join(chunks).decode(errors="replace"), stdout.decode()


def test_progress_line_on_a_tty(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    code, screen, stdout = _on_a_tty(["submit", f"{sys.executable} {script}", "--output-dir", str(tmp_path / "out"),
                                      "--no-watch"])
    assert code == 0
    assert "\r[task-000] RUNNING" in screen
    assert "step 15  loss 0.06667" in screen  # the last line logged, shown at the end
    assert "[task-000] SUCCEEDED" in screen
    assert stdout.splitlines()[0] == "state: SUCCEEDED"


def test_a_sweep_shows_which_trial_of_how_many_is_running(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    code, screen, stdout = _on_a_tty(["submit", f"{sys.executable} {script} {{n}}", "--task-params",
                                      '[{"n": 1}, {"n": 2}]', "--output-dir", str(tmp_path / "out"), "--no-watch"])
    assert code == 0
    assert "\rtrial 1/2 [local-000] RUNNING" in screen and "\rtrial 2/2 [local-001] RUNNING" in screen
    assert "SUCCEEDED  trials 2/2 done" in screen
    assert stdout.splitlines()[-1].startswith("output: ")


PRINTS_LIKE_HF = """
import time
for step in range(1, 11):
    print({"loss": round(2.0 / step, 4), "grad_norm": 0.5, "learning_rate": 0.001, "epoch": step / 10}, flush=True)
    print(f"\\r{step * 10}%|##   | {step}/10 [00:01<00:01, 9.9it/s]", end="", flush=True)
    time.sleep(0.1)
print()
"""


def test_the_progress_line_shows_step_and_loss_a_framework_printed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PRINTS_LIKE_HF)
    code, screen, _ = _on_a_tty(["submit", f"{sys.executable} {script}", "--output-dir", str(tmp_path / "out"),
                                 "--no-watch"])
    assert code == 0
    assert "step 10  loss 0.2" in screen  # the bar's step and the Trainer-style dict's loss, no metrics.jsonl


def test_progress_from_output_reads_the_common_frameworks() -> None:
    from flashruntime.monitor.progress import progress_from_output

    hf = "{'loss': 4.7056, 'grad_norm': 1.2, 'learning_rate': 0.0009, 'epoch': 0.31}\n 50%|# | 20/40 [00:02<00:02]"
    assert progress_from_output(hf) == {"step": 20, "loss": 4.7056}
    lightning = "Epoch 0:  50%|#   | 12/24 [00:01<00:01, 11.2it/s, v_num=0, train_loss=0.123]"
    assert progress_from_output(lightning) == {"step": 12, "loss": 0.123}
    assert progress_from_output('[default0]:{"loss": 0.5, "step": 7}') == {"loss": 0.5, "step": 7}
    assert progress_from_output("{'loss': __import__('os').system('x')}\nplain text") == {}
    assert progress_from_output("{'loss': '4.708', 'epoch': '0.07'}\r 12%|# | 5/40 [00:00<00:03]") == {
        "step": 5, "loss": 4.708}


def test_output_progress_keeps_the_training_step_through_other_bars() -> None:
    from flashruntime.monitor.progress import OutputProgress

    reader = OutputProgress()
    lines = [" 25%|##  | 10/40 [00:01<00:03]", "{'loss': '4.7', 'epoch': '0.2'}",
             "Writing model shards: 100%|###| 1/1 [00:00<00:00]", " 30%|##  | 12/40 [00:01<00:03]",
             "{'loss': '4.6', 'epoch': '0.3'}", '{"loss": 0.5, "step": 40}']
    assert reader.feed(lines) == [{"step": 10, "loss": 4.7}, {"step": 12, "loss": 4.6}, {"step": 40, "loss": 0.5}]
