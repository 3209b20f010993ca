"""Local manifests: parts first, manifest last; verification;
newest-first selection that skips bad manifests instead of raising."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from flashruntime.checkpoint import (
    MANIFEST_NAME,
    latest_valid_manifest,
    open_part,
    verify_manifest,
    write_manifest,
)
from flashruntime.checkpoint.local import clear_verification_cache, verification_cache_stats
from flashruntime.protocol.v1alpha1 import CheckpointManifest, CheckpointPart, CheckpointValidation


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    clear_verification_cache()


def _step(root: Path, step: int, parts: dict[str, bytes] | None = None, **kwargs: object) -> CheckpointManifest:
    step_dir = root / f"step-{step:06d}"
    digests = {}
    for name, data in (parts or {"model.pt": f"model {step}".encode()}).items():
        with open_part(step_dir, name) as f:
            f.write(data)
        digests[name] = f.digest
    return write_manifest(step_dir, job_id="job", attempt_id="a0", step=step, digests=digests, **kwargs)  # type: ignore[arg-type]


def _flip_byte(path: Path, offset: int = 0) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


# --- write_manifest ----------------------------------------------------------------


def test_manifest_fields_and_file(tmp_path: Path) -> None:
    step_dir = tmp_path / "step-000040"
    with open_part(step_dir, "optimizer.pt") as opt:
        opt.write(b"o" * 10)
    with open_part(step_dir, "model.pt") as model:
        model.write(b"m" * 20)
    manifest = write_manifest(
        step_dir,
        job_id="job-1",
        attempt_id="task-000-r1",
        step=40,
        world_size=2,
        framework="pytorch-2.13.0",
        digests={"model.pt": model.digest, "optimizer.pt": opt.digest},
    )
    assert re.fullmatch(r"ck-[0-9a-f]{12}", manifest.manifest_id)
    assert (manifest.job_id, manifest.attempt_id, manifest.step) == ("job-1", "task-000-r1", 40)
    assert manifest.world_size == 2 and manifest.compatible_world_sizes == [2]
    assert manifest.framework == "pytorch-2.13.0"
    assert manifest.storage_prefix == str(step_dir)
    assert manifest.validation == CheckpointValidation.HASH_VERIFIED
    assert [p.key for p in manifest.parts] == ["model.pt", "optimizer.pt"]
    assert manifest.parts[0] == CheckpointPart(
        key="model.pt", sha256=hashlib.sha256(b"m" * 20).hexdigest(), size_bytes=20
    )
    text = (step_dir / MANIFEST_NAME).read_text()
    assert text.startswith("{\n  ")  # indented JSON
    assert CheckpointManifest.model_validate_json(text) == manifest
    assert sorted(os.listdir(step_dir)) == ["manifest.json", "model.pt", "optimizer.pt"]  # no temp file left


def test_parts_without_digests_are_hashed(tmp_path: Path) -> None:
    (tmp_path / "b.bin").write_bytes(b"bee")
    (tmp_path / "a.bin").write_bytes(b"ay")
    manifest = write_manifest(tmp_path, job_id="j", attempt_id="a", step=1)
    assert [(p.key, p.sha256, p.size_bytes) for p in manifest.parts] == [
        ("a.bin", hashlib.sha256(b"ay").hexdigest(), 2),
        ("b.bin", hashlib.sha256(b"bee").hexdigest(), 3),
    ]


def test_dot_files_manifest_and_subdirectories_are_not_parts(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"m")
    (tmp_path / ".model.pt.tmp").write_bytes(b"torn")
    (tmp_path / ".manifest.json.123.tmp").write_bytes(b"{")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "x").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "model.pt")
    first = write_manifest(tmp_path, job_id="j", attempt_id="a", step=1)
    second = write_manifest(tmp_path, job_id="j", attempt_id="a", step=1)  # manifest.json now exists
    assert [p.key for p in first.parts] == [p.key for p in second.parts] == ["model.pt"]
    assert first.manifest_id != second.manifest_id


def test_no_parts_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / ".only.tmp").write_bytes(b"x")
    with pytest.raises(ValueError, match="no checkpoint parts"):
        write_manifest(tmp_path, job_id="j", attempt_id="a", step=1)
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_digests_are_trusted_not_re_read(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"12345")
    before = verification_cache_stats()["hashed_files"]
    manifest = write_manifest(tmp_path, job_id="j", attempt_id="a", step=1, digests={"model.pt": ("ab" * 32, 5)})
    assert manifest.parts[0].sha256 == "ab" * 32  # taken as recorded: the file was not read
    assert verification_cache_stats()["hashed_files"] == before


def test_digest_size_mismatch_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"12345")
    with pytest.raises(ValueError, match="has 5 bytes but its digest records 4"):
        write_manifest(tmp_path, job_id="j", attempt_id="a", step=1, digests={"model.pt": ("ab" * 32, 4)})
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_invalid_fields_write_no_manifest(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"1")
    with pytest.raises(ValueError):
        write_manifest(tmp_path, job_id="j", attempt_id="a", step=-1)
    with pytest.raises(ValueError):
        write_manifest(tmp_path, job_id="j", attempt_id="a", step=1, world_size=0)
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]


def test_cached_parts_are_not_hashed_again(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(os.urandom(1000))
    write_manifest(tmp_path, job_id="j", attempt_id="a", step=1)
    hashed = verification_cache_stats()["hashed_files"]
    write_manifest(tmp_path, job_id="j", attempt_id="a", step=1)
    assert verification_cache_stats()["hashed_files"] == hashed


# --- verify_manifest ---------------------------------------------------------------


def test_verify_ok_and_after_cache_clear(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1, {"model.pt": os.urandom(3 << 20), "optimizer.pt": b"opt"})
    step_dir = tmp_path / "step-000001"
    assert verify_manifest(manifest, step_dir)
    clear_verification_cache()
    assert verify_manifest(manifest, step_dir)
    assert verification_cache_stats()["hashed_files"] == 2


def test_verify_detects_a_flipped_byte_in_a_new_process_view(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1, {"model.pt": os.urandom(1 << 20)})
    part = tmp_path / "step-000001" / "model.pt"
    stat = part.stat()
    _flip_byte(part, 12345)
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: the cache key is unchanged
    clear_verification_cache()  # a new process starts empty and re-hashes
    assert not verify_manifest(manifest, tmp_path / "step-000001")


def test_verify_detects_a_rewritten_part_through_its_new_mtime(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1, {"model.pt": b"a" * 100})
    part = tmp_path / "step-000001" / "model.pt"
    stat = part.stat()
    part.write_bytes(b"b" * 100)
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert not verify_manifest(manifest, tmp_path / "step-000001")


@pytest.mark.parametrize("damage", ["missing", "directory", "truncated", "symlink", "fifo"])
def test_verify_is_false_for_damaged_parts(tmp_path: Path, damage: str) -> None:
    manifest = _step(tmp_path, 1, {"model.pt": b"payload" * 100})
    part = tmp_path / "step-000001" / "model.pt"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(part.read_bytes())
    part.unlink()
    if damage == "directory":
        part.mkdir()
    elif damage == "truncated":
        part.write_bytes(b"payload" * 99)
    elif damage == "symlink":
        part.symlink_to(elsewhere)  # same bytes, but not a regular file in the step
    elif damage == "fifo":
        os.mkfifo(part)  # must not block
    assert verify_manifest(manifest, tmp_path / "step-000001") is False


def test_verify_ignores_extra_files(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1)
    (tmp_path / "step-000001" / "extra.bin").write_bytes(b"x")
    assert verify_manifest(manifest, tmp_path / "step-000001")


@pytest.mark.parametrize("key", ["../step-000002/model.pt", "/etc/hostname", "", ".model.pt.tmp", "a/b"])
def test_verify_refuses_keys_that_are_not_plain_names(tmp_path: Path, key: str) -> None:
    manifest = _step(tmp_path, 1)
    bad = manifest.model_copy(
        update={"parts": [CheckpointPart(key=key, sha256=manifest.parts[0].sha256, size_bytes=1)]}
    )
    assert verify_manifest(bad, tmp_path / "step-000001") is False


def test_verify_never_raises(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1)
    assert verify_manifest(manifest, tmp_path / "missing-dir") is False
    assert verify_manifest(manifest.model_copy(update={"parts": []}), tmp_path / "step-000001") is False
    assert verify_manifest(None, tmp_path) is False  # type: ignore[arg-type]
    assert verify_manifest(manifest, 42) is False  # type: ignore[arg-type]


def test_verify_accepts_upper_case_hex(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1)
    upper = manifest.model_copy(
        update={"parts": [p.model_copy(update={"sha256": p.sha256.upper()}) for p in manifest.parts]}
    )
    assert verify_manifest(upper, tmp_path / "step-000001")


# --- latest_valid_manifest -------------------------------------------------------------


def test_not_a_directory(tmp_path: Path) -> None:
    assert latest_valid_manifest(tmp_path / "nope") is None
    (tmp_path / "file").write_bytes(b"x")
    assert latest_valid_manifest(tmp_path / "file") is None
    assert latest_valid_manifest(tmp_path) is None  # empty


def test_highest_step_wins_and_steps_without_manifest_do_not_count(tmp_path: Path) -> None:
    for step in (1, 3, 2):
        _step(tmp_path, step)
    (tmp_path / "step-000009").mkdir()
    (tmp_path / "step-000009" / "model.pt").write_bytes(b"no manifest yet")
    assert latest_valid_manifest(tmp_path).step == 3


def test_step_in_manifest_not_directory_name_decides(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 5)
    os.rename(tmp_path / "step-000005", tmp_path / "step-zzz")
    _step(tmp_path, 7)
    os.rename(tmp_path / "step-000007", tmp_path / "step-aaa")
    chosen = latest_valid_manifest(tmp_path)
    assert chosen is not None and chosen.step == 7
    assert manifest.step == 5


def test_ties_go_to_the_first_in_sorted_path_order(tmp_path: Path) -> None:
    b = _step(tmp_path, 4, {"model.pt": b"bbb"})
    os.rename(tmp_path / "step-000004", tmp_path / "step-b")
    a = _step(tmp_path, 4, {"model.pt": b"aaa"})
    os.rename(tmp_path / "step-000004", tmp_path / "step-a")
    assert latest_valid_manifest(tmp_path).manifest_id == a.manifest_id
    _flip_byte(tmp_path / "step-a" / "model.pt")
    clear_verification_cache()
    assert latest_valid_manifest(tmp_path).manifest_id == b.manifest_id


def test_corrupt_newest_falls_back_to_previous_step(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _step(tmp_path, step, {"model.pt": os.urandom(100_000), "optimizer.pt": os.urandom(50_000)})
    _flip_byte(tmp_path / "step-000003" / "optimizer.pt", 777)
    clear_verification_cache()
    assert latest_valid_manifest(tmp_path).step == 2


def test_newest_first_stops_at_the_first_that_verifies(tmp_path: Path) -> None:
    for step in range(1, 6):
        _step(tmp_path, step, {"model.pt": os.urandom(200_000)})
    clear_verification_cache()
    assert latest_valid_manifest(tmp_path).step == 5
    stats = verification_cache_stats()
    assert stats["hashed_files"] == 1  # only the chosen step was read, not the four older ones
    assert latest_valid_manifest(tmp_path).step == 5
    assert verification_cache_stats()["hashed_files"] == 1  # second call: served by the cache


def test_world_size_is_not_checked(tmp_path: Path) -> None:
    _step(tmp_path, 1, world_size=4)
    assert latest_valid_manifest(tmp_path).world_size == 4


def test_pattern_selects_other_layouts(tmp_path: Path) -> None:
    step_dir = tmp_path / "checkpoint-500"
    (step_dir).mkdir()
    (step_dir / "model.safetensors").write_bytes(b"weights")
    write_manifest(step_dir, job_id="hf", attempt_id="a", step=500)
    assert latest_valid_manifest(tmp_path) is None
    assert latest_valid_manifest(tmp_path, "checkpoint-*").step == 500


def test_root_with_glob_characters(tmp_path: Path) -> None:
    root = tmp_path / "run[1]*"
    _step(root, 2)
    assert latest_valid_manifest(root).step == 2
    assert latest_valid_manifest(str(root)).step == 2


def _bad_manifests(root: Path) -> None:
    """One of every kind of bad manifest.json, each at a step higher than the good one."""
    good = _step(root, 1)
    template = json.loads((root / "step-000001" / MANIFEST_NAME).read_text())

    def bad(step: int) -> Path:
        step_dir = root / f"step-{step:06d}"
        step_dir.mkdir()
        (step_dir / "model.pt").write_bytes(b"model 1")
        return step_dir / MANIFEST_NAME

    bad(10).write_bytes(b"")  # empty
    bad(11).write_text(json.dumps(template)[:-20])  # truncated
    bad(12).write_bytes(b"\xff\xfe\x00garbage")  # not UTF-8
    bad(13).write_text(json.dumps({**template, "step": -3}))  # schema-invalid
    bad(14).write_text(json.dumps({k: v for k, v in template.items() if k != "parts"}))  # missing field
    bad(15).write_text("[1, 2, 3]")  # wrong shape
    bad(16).mkdir()  # directory-shaped manifest.json
    bad(17).symlink_to(root / "nowhere.json")  # dangling symlink
    os.mkfifo(bad(18))  # a FIFO must not block the scan
    bad(19).write_text(json.dumps({**template, "step": 19, "validation": "invalid"}))  # quarantined
    big = bad(20)
    with open(big, "wb") as handle:  # implausibly large
        handle.truncate(17 << 20)
    bad(21).write_text(json.dumps({**template, "step": 21, "parts": []}))  # nothing to restore
    assert good.step == 1


def test_bad_manifests_are_skipped_never_raised(tmp_path: Path) -> None:
    _bad_manifests(tmp_path)
    chosen = latest_valid_manifest(tmp_path)
    assert chosen is not None and chosen.step == 1


def test_unreadable_manifest_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _step(tmp_path, 1)
    _step(tmp_path, 2)
    if os.geteuid() == 0:
        # root reads anything: make the newest manifest a directory entry that fails to open instead
        target = tmp_path / "step-000002" / MANIFEST_NAME
        target.unlink()
        target.symlink_to(target)  # ELOOP on open
    else:
        (tmp_path / "step-000002" / MANIFEST_NAME).chmod(0)
    assert latest_valid_manifest(tmp_path).step == 1


def test_manifest_listing_a_missing_part_is_skipped(tmp_path: Path) -> None:
    _step(tmp_path, 1)
    _step(tmp_path, 2, {"model.pt": b"m", "optimizer.pt": b"o"})
    (tmp_path / "step-000002" / "optimizer.pt").unlink()
    assert latest_valid_manifest(tmp_path).step == 1


def test_digests_for_missing_parts_are_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"1")
    with pytest.raises(ValueError, match="optimizer.pt"):
        write_manifest(tmp_path, job_id="j", attempt_id="a", step=1, digests={"optimizer.pt": ("ab" * 32, 1)})
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_selection_returns_a_private_copy(tmp_path: Path) -> None:
    _step(tmp_path, 1)
    first = latest_valid_manifest(tmp_path)
    first.step = 999
    first.parts.clear()
    again = latest_valid_manifest(tmp_path)
    assert again.step == 1 and [p.key for p in again.parts] == ["model.pt"]


def test_a_rewritten_manifest_is_read_again(tmp_path: Path) -> None:
    _step(tmp_path, 1)
    assert latest_valid_manifest(tmp_path).job_id == "job"
    path = tmp_path / "step-000001" / MANIFEST_NAME
    stat = path.stat()
    doc = json.loads(path.read_text())
    doc["job_id"] = "renamed-job"  # a different size, so a different cache key
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert latest_valid_manifest(tmp_path).job_id == "renamed-job"


def test_parts_written_by_this_process_are_not_read_again(tmp_path: Path) -> None:
    manifest = _step(tmp_path, 1, {"model.pt": os.urandom(2 << 20), "optimizer.pt": os.urandom(1 << 20)})
    assert verify_manifest(manifest, tmp_path / "step-000001")
    assert latest_valid_manifest(tmp_path).manifest_id == manifest.manifest_id
    stats = verification_cache_stats()
    assert stats["hashed_files"] == 0  # open_part's digests served write, verify and select
    assert stats["hits"] >= 4
