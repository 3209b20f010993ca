"""benchmarks.faults: argument checks and the byte flip."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.faults import corrupt_newest_part, write_crashy_trainer


def test_write_crashy_trainer_validates(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="crash must be one of"):
        write_crashy_trainer(tmp_path, 10, 5, "meteor")
    with pytest.raises(ValueError, match="need steps >= 2"):
        write_crashy_trainer(tmp_path, 1, 5)
    path = write_crashy_trainer(tmp_path, 10, 5, "import_error")
    assert "flashruntime_bench_missing_module" in path.read_text()
    compile(path.read_text(), str(path), "exec")


def test_corrupt_newest_part_flips_one_byte_of_the_newest_manifested_step(tmp_path: Path) -> None:
    assert corrupt_newest_part(tmp_path) is None
    for step in (10, 20):
        d = tmp_path / f"step-{step:06d}"
        d.mkdir()
        (d / "a.bin").write_bytes(bytes(100))
        (d / "manifest.json").write_text("{}")
    torn = tmp_path / "step-000030"
    torn.mkdir()
    (torn / "a.bin").write_bytes(bytes(100))  # no manifest: not a checkpoint
    part = corrupt_newest_part(tmp_path)
    assert part == tmp_path / "step-000020" / "a.bin"
    data = part.read_bytes()
    assert len(data) == 100 and sum(1 for b in data if b) == 1
    assert (torn / "a.bin").read_bytes() == bytes(100)
