"""A tqdm progress bar under 2-rank torchrun, as flash.submit shows it: one line per update,
every line tagged with its rank, none that is only a tag."""

from __future__ import annotations

import io
import re
import sys
import textwrap
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.local.live_output import tidy_lines
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

TAG_ONLY = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:)+\s*$")
SCRIPT = textwrap.dedent("""
    import os, time
    from tqdm import tqdm
    for _ in tqdm(range(40), desc=f"rank {os.environ['RANK']}", mininterval=0):
        time.sleep(0.02)
    print("done", flush=True)
""")


@pytest.mark.torch
@pytest.mark.slow
def test_a_tqdm_bar_under_two_rank_torchrun_leaves_no_empty_tagged_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tqdm")
    (tmp_path / "bar.py").write_text(SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    shown = io.StringIO()
    run = flash.submit(CommandWorkload(command=[str(torchrun), "--nproc-per-node=2", "--standalone",
                                                "--local-addr=127.0.0.1", "bar.py"],
                                       source=Source(path=str(tmp_path)), outputs=OutputSpec(collect=[])),
                       output_dir=tmp_path / "run", watch=False, stream=shown)
    assert run.state is LaunchState.SUCCEEDED
    lines = shown.getvalue().splitlines()
    raw = (tmp_path / "run" / "local" / "task-000" / "launcher.log").read_text()
    assert any(TAG_ONLY.match(line) for line in raw.splitlines())  # what torchrun's tee leaves in the log
    assert not [line for line in lines if TAG_ONLY.match(line)]
    bars = [line for line in lines if "it/s]" in line or "?it/s]" in line]
    assert bars and all(re.match(r"^\[default[01]\]:rank [01]: +[0-9]+%", line) for line in bars), bars
    assert not [line for line in lines if re.search(r"\[default[01]\]:$", line)]
    assert {"[default0]:done", "[default1]:done"} <= set(lines)


def test_tidy_lines_keeps_what_a_terminal_would_show() -> None:
    assert tidy_lines(["[default1]:", "[default1]:rank 1:  13%|█ | 4/30 [00:00<00:00, 33it/s][default0]:",
                       "[default0]:done"]) == ["[default1]:rank 1:  13%|█ | 4/30 [00:00<00:00, 33it/s]",
                                              "[default0]:done"]
    assert tidy_lines(["  0%|   | 0/3\r 33%|█  | 1/3\r100%|███| 3/3"]) == ["100%|███| 3/3"]
    assert tidy_lines(["[rank0]: a\r b\r"]) == ["[rank0]: b"]
    assert tidy_lines(["", "plain [x] text", "[default0]:[rank0]:"]) == ["", "plain [x] text"]
