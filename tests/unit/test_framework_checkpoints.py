"""Recognising framework checkpoints on disk, and judging them: layouts, steps, torn and
changed files. Files are made here byte by byte (torch only where a torch file is the point)."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import pytest

from flashruntime.checkpoint.frameworks import (
    file_problem,
    find_checkpoints,
    fingerprint,
    fingerprint_problem,
    newest,
    torch_file_step,
)
from flashruntime.local.framework_resume import FrameworkCheckpoints


def _safetensors(path: Path, payload: bytes = b"\0" * 16) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(payload)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + payload)


def _hf(root: Path, step: int) -> Path:
    directory = root / "out" / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    _safetensors(directory / "model.safetensors")
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return directory


def test_each_layout_is_recognised_with_its_step(tmp_path: Path) -> None:
    _hf(tmp_path, 10)
    _hf(tmp_path, 20)
    (tmp_path / "acc" / "step_8").mkdir(parents=True)
    _safetensors(tmp_path / "acc" / "step_8" / "model.safetensors")
    (tmp_path / "acc" / "checkpoint_3").mkdir()
    (tmp_path / "acc" / "checkpoint_3" / "random_states_0.pkl").write_bytes(b"x")
    (tmp_path / "dcp" / "step-40").mkdir(parents=True)
    (tmp_path / "dcp" / "step-40" / ".metadata").write_bytes(b"m")
    (tmp_path / "ours" / "step-000005").mkdir(parents=True)  # the torch helper's: a manifest makes it ours
    (tmp_path / "ours" / "step-000005" / ".metadata").write_bytes(b"m")
    (tmp_path / "ours" / "step-000005" / "manifest.json").write_text("{}")
    (tmp_path / "lightning").mkdir()
    (tmp_path / "lightning" / "epoch=1-step=30.ckpt").write_bytes(b"PK\x03\x04")
    (tmp_path / ".git" / "checkpoint-99").mkdir(parents=True)  # tool directories are never searched
    found = {(c.kind, c.path.relative_to(tmp_path).as_posix(), c.step) for c in find_checkpoints([tmp_path])}
    assert found == {("huggingface", "out/checkpoint-10", 10), ("huggingface", "out/checkpoint-20", 20),
                     ("accelerate", "acc/step_8", 8), ("accelerate", "acc/checkpoint_3", None),
                     ("dcp", "dcp/step-40", 40), ("lightning", "lightning/epoch=1-step=30.ckpt", 30)}
    hf = [c for c in find_checkpoints([tmp_path / "out"])]
    assert newest(hf).path.name == "checkpoint-20"


def test_links_are_not_followed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    _hf(shared, 5)
    view = tmp_path / "view"
    view.mkdir()
    (view / "out").symlink_to(shared / "out")
    assert find_checkpoints([view]) == []


def test_a_torn_or_changed_safetensors_file_is_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    _safetensors(path)
    assert file_problem(path) is None
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 4)
    assert "truncated or torn" in file_problem(path)
    path.write_bytes(b"\x10\0\0\0\0\0\0\0{not json at all")
    assert "not valid JSON" in file_problem(path)


def test_a_zip_with_a_changed_byte_fails_its_crc(tmp_path: Path) -> None:
    path = tmp_path / "optimizer.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data/0", b"A" * 4096)
    assert file_problem(path) is None
    data = bytearray(path.read_bytes())
    data[2000] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "fails its CRC check" in file_problem(path)
    path.write_bytes(bytes(data[: len(data) // 2]))
    assert "not a readable zip archive" in file_problem(path)


def test_a_fingerprint_catches_a_changed_byte_and_trusts_an_untouched_file(tmp_path: Path) -> None:
    directory = _hf(tmp_path, 10)
    checkpoints = FrameworkCheckpoints([tmp_path], [], tmp_path / "job")
    checkpoint = find_checkpoints([tmp_path])[0]
    assert "fingerprinted: 2 file(s)" in checkpoints.record(checkpoint)
    assert checkpoints.problem(checkpoint) is None
    again = FrameworkCheckpoints([tmp_path], [], tmp_path / "job")  # another driver reads the fingerprints back
    assert again.recorded(checkpoint)["files"] == fingerprint(checkpoint)
    model = directory / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    assert checkpoints.problem(checkpoint) == "model.safetensors changed since it was written (sha256 differs)"
    assert again.problem(checkpoint) == "model.safetensors changed since it was written (sha256 differs)"
    assert fingerprint_problem(checkpoint, {"gone.bin": {"size": 1, "sha256": "x"}}) == "gone.bin is missing"


def test_prepare_resume_quarantines_the_bad_newest_and_names_the_one_before(tmp_path: Path) -> None:
    _hf(tmp_path, 10)
    torn = _hf(tmp_path, 20)
    (torn / "trainer_state.json").unlink()  # the save did not finish
    point = FrameworkCheckpoints([tmp_path], [], tmp_path / "job").prepare_resume()
    assert point.checkpoint is not None and point.checkpoint.step == 10
    assert [kind for kind, _ in point.events] == ["CHECKPOINT_QUARANTINED"]
    assert "trainer_state.json is missing" in point.events[0][1]
    assert (tmp_path / "job" / "quarantine" / "out" / "checkpoint-20").is_dir()
    assert not torn.exists()
    again = FrameworkCheckpoints([tmp_path], [], tmp_path / "job").prepare_resume(failed_loading=True)
    assert again.checkpoint is None and "the last attempt failed while loading it" in again.events[0][1]


class _Evil:
    def __reduce__(self):  # what a hostile pickle asks for: a call of os.system
        return (os.system, ("echo owned > /tmp/flashruntime-inert-unpickler-test",))


def test_the_step_reader_builds_nothing_a_file_asks_for(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("snapshot/data.pkl", pickle.dumps({"EPOCHS_RUN": 6, "evil": _Evil()}))
    marker = Path("/tmp/flashruntime-inert-unpickler-test")
    marker.unlink(missing_ok=True)
    assert torch_file_step(path) == (6, "epoch")
    assert not marker.exists()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x/data.pkl", pickle.dumps(["not", "a", "dict"]))
    assert torch_file_step(path) is None
    path.write_bytes(b"not a zip")
    assert torch_file_step(path) is None


@pytest.mark.torch
def test_the_step_of_a_real_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "global_step": 42}, tmp_path / "last.ckpt")
    assert torch_file_step(tmp_path / "last.ckpt") == (42, "step")
    assert [(c.kind, c.step) for c in find_checkpoints([tmp_path])] == [("lightning", 42)]


def test_the_watch_never_fingerprints_a_finished_save_again_so_later_damage_is_seen(tmp_path: Path) -> None:
    from flashruntime.local.framework_resume import CheckpointWatch

    directory = _hf(tmp_path, 10)
    checkpoints = FrameworkCheckpoints([tmp_path], [], tmp_path / "job")
    seen: list[str] = []
    watch = CheckpointWatch(checkpoints, lambda kind, message: seen.append(message))
    watch.look()
    watch.look()  # unchanged across two looks: fingerprinted
    assert len(seen) == 1
    model = directory / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    watch.look()
    watch.look()
    assert len(seen) == 1  # the damaged bytes were not taken as a new save
    later = CheckpointWatch(checkpoints, lambda kind, message: seen.append(message))  # the next attempt's
    later.look()
    later.look()
    assert len(seen) == 1
    assert "changed since it was written" in checkpoints.problem(find_checkpoints([tmp_path])[0])


@pytest.mark.torch
def test_a_reused_one_file_checkpoint_is_fingerprinted_again_when_its_step_moves_on(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from flashruntime.local.framework_resume import CheckpointWatch

    checkpoints = FrameworkCheckpoints([tmp_path], ["snapshot.pt"], tmp_path / "job")
    seen: list[str] = []
    watch = CheckpointWatch(checkpoints, lambda kind, message: seen.append(message))
    for epoch in (2, 4):
        torch.save({"EPOCHS_RUN": epoch}, tmp_path / "snapshot.pt")
        watch.look()
        watch.look()
    assert ["(epoch 2)" in seen[0], "(epoch 4)" in seen[1]] == [True, True]
    torch.save({"EPOCHS_RUN": 4, "other": 1}, tmp_path / "snapshot.pt")  # same step, other bytes: damage
    watch.look()
    watch.look()
    assert len(seen) == 2


def test_a_pickle_asking_for_a_huge_memo_is_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "bomb.ckpt"
    with zipfile.ZipFile(path, "w") as archive:  # N, then "put into memo slot 2**31": 32 GiB of memo
        archive.writestr("archive/data.pkl", b"N" + b"r" + struct.pack("<I", 2**31) + b".")
    assert torch_file_step(path) is None
