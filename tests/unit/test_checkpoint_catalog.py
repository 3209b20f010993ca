"""``CheckpointCatalog``: two-phase commit, the validation ladder,
topology-compatible selection, ``lost_work`` and its events."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import flashruntime.checkpoint as checkpoint_pkg
import flashruntime.errors
from flashruntime.checkpoint import CheckpointCatalog, CheckpointError, InMemoryManifestStore, SqliteManifestStore
from flashruntime.checkpoint import catalog as catalog_module
from flashruntime.protocol.v1alpha1 import CheckpointPart, CheckpointValidation, Event, EventType

SHA_A = "a" * 64
SHA_B = "b" * 64


def _part(key: str, sha: str = SHA_A, size: int = 10) -> CheckpointPart:
    return CheckpointPart(key=key, sha256=sha, size_bytes=size)


@pytest.fixture(params=["memory", "sqlite"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[CheckpointCatalog, list[Event]]:
    events: list[Event] = []
    store = InMemoryManifestStore() if request.param == "memory" else SqliteManifestStore(tmp_path / "ck.db")
    return CheckpointCatalog(on_event=events.append, store=store), events


def _commit(cat: CheckpointCatalog, job: str = "job", step: int = 10, attempt: str = "a0", **kwargs: object):
    parts = [_part("model.pt"), _part("optimizer.pt", SHA_B)]
    for part in parts:
        cat.register_part(job, attempt, step, part)
    return cat.commit(
        job_id=job, attempt_id=attempt, step=step, expected_parts=parts, storage_prefix=f"s3://b/{step}", **kwargs
    )


def test_checkpoint_error_is_the_shared_class() -> None:
    assert CheckpointError is flashruntime.errors.CheckpointError
    assert catalog_module.CheckpointError is checkpoint_pkg.CheckpointError
    assert issubclass(CheckpointError, flashruntime.errors.FlashRuntimeError)


def test_default_store_is_in_memory() -> None:
    assert isinstance(CheckpointCatalog().store, InMemoryManifestStore)


def test_commit_success(catalog) -> None:
    cat, events = catalog
    manifest = _commit(cat, world_size=2, framework="pytorch-2.13.0", strategy_family="ddp", checkpoint_duration_s=1.5)
    assert manifest.manifest_id.startswith("ck-") and len(manifest.manifest_id) == 15
    assert manifest.validation == CheckpointValidation.HASH_VERIFIED
    assert manifest.compatible_world_sizes == [2]
    assert (manifest.framework, manifest.strategy_family, manifest.checkpoint_duration_s) == (
        "pytorch-2.13.0",
        "ddp",
        1.5,
    )
    assert cat.store.get(manifest.manifest_id) == manifest
    assert [e.type for e in events] == [EventType.CHECKPOINT_MANIFEST_COMMITTED]
    assert events[0].source == "flashruntime.checkpoint" and events[0].job_id == "job"
    assert events[0].data["manifest_id"] == manifest.manifest_id


def test_commit_with_explicit_compatible_sizes(catalog) -> None:
    cat, _ = catalog
    manifest = _commit(cat, world_size=4, compatible_world_sizes=[2, 4, 8])
    assert manifest.compatible_world_sizes == [2, 4, 8]


def test_commit_collects_every_problem(catalog) -> None:
    cat, events = catalog
    cat.register_part("job", "a0", 5, _part("model.pt", SHA_A))
    cat.register_part("job", "a0", 5, _part("extra.bin", SHA_A))  # registered but not expected: ignored
    expected = [_part("model.pt", SHA_B), _part("optimizer.pt")]
    with pytest.raises(CheckpointError) as caught:
        cat.commit(job_id="job", attempt_id="a0", step=5, expected_parts=expected, storage_prefix="p")
    message = str(caught.value)
    assert message == (
        f"step 5: part 'model.pt' sha256 mismatch (expected {SHA_B}, registered {SHA_A}); "
        "part 'optimizer.pt' not registered"
    )
    assert [e.type for e in events] == [EventType.CHECKPOINT_REJECTED]
    assert events[0].message == message
    assert cat.store.all() == []


def test_commit_with_no_expected_parts(catalog) -> None:
    cat, events = catalog
    with pytest.raises(CheckpointError, match=r"^step 3: no expected parts$"):
        cat.commit(job_id="job", attempt_id="a0", step=3, expected_parts=[], storage_prefix="p")
    assert events[0].type == EventType.CHECKPOINT_REJECTED


@pytest.mark.parametrize(("world_size", "compatible"), [(0, None), (-2, None), (2, [2, 0]), (True, None)])
def test_commit_with_a_world_size_below_one_is_rejected_with_its_event(catalog, world_size, compatible) -> None:
    """The request models leave world sizes unconstrained; the manifest needs >= 1. The catalog
    refuses such a commit as it refuses any other problem: CheckpointError, CHECKPOINT_REJECTED."""
    cat, events = catalog
    cat.register_part("job", "a0", 5, _part("model.pt"))
    with pytest.raises(CheckpointError, match=r"^step 5: world sizes must be integers >= 1, got \[.*\]$"):
        cat.commit(job_id="job", attempt_id="a0", step=5, expected_parts=[_part("model.pt")], storage_prefix="p",
                   world_size=world_size, compatible_world_sizes=compatible)
    assert [e.type for e in events] == [EventType.CHECKPOINT_REJECTED]
    assert cat.store.all() == []


@pytest.mark.parametrize("field", ["step", "size_bytes"])
def test_a_part_beyond_sqlites_integers_is_refused_and_stores_nothing(tmp_path: Path, field: str) -> None:
    """Steps and sizes are unbounded on the wire; the SQLite part registry holds 64-bit integers.
    Beyond that: a ValueError that says so (the coordinator answers 422), not a bare OverflowError."""
    cat = CheckpointCatalog(store=SqliteManifestStore(tmp_path / "ck.db"))
    huge = 2**63
    step = huge if field == "step" else 5
    part = _part("model.pt", size=huge if field == "size_bytes" else 10)
    with pytest.raises(ValueError, match=f"{field} {huge} is beyond the largest integer"):
        cat.register_part("job", "a0", step, part)
    assert cat.store.parts("job", "a0", step) == {}
    with pytest.raises(CheckpointError, match="part 'model.pt' not registered"):
        cat.commit(job_id="job", attempt_id="a0", step=step, expected_parts=[part], storage_prefix="p")
    cat.register_part("job", "a0", 5, _part("model.pt", size=2**63 - 1))  # the largest it holds
    assert cat.store.parts("job", "a0", 5) == {"model.pt": (SHA_A, 2**63 - 1)}


def test_parts_are_scoped_by_job_attempt_and_step(catalog) -> None:
    cat, _ = catalog
    cat.register_part("job", "a0", 5, _part("model.pt"))
    for job, attempt, step in (("other", "a0", 5), ("job", "a1", 5), ("job", "a0", 6)):
        with pytest.raises(CheckpointError, match="not registered"):
            cat.commit(
                job_id=job, attempt_id=attempt, step=step, expected_parts=[_part("model.pt")], storage_prefix="p"
            )


def test_last_registration_wins_and_sizes_are_not_compared(catalog) -> None:
    cat, _ = catalog
    cat.register_part("job", "a0", 5, _part("model.pt", SHA_A, 1))
    cat.register_part("job", "a0", 5, _part("model.pt", SHA_B, 2))
    manifest = cat.commit(
        job_id="job", attempt_id="a0", step=5, expected_parts=[_part("model.pt", SHA_B, 999)], storage_prefix="p"
    )
    assert manifest.parts[0].size_bytes == 999


def test_register_part_emits_no_event(catalog) -> None:
    cat, events = catalog
    cat.register_part("job", "a0", 1, _part("model.pt"))
    assert events == []


def test_no_events_are_built_without_a_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    def _fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("an Event was built")

    monkeypatch.setattr(catalog_module, "Event", _fail)
    cat = CheckpointCatalog()
    manifest = _commit(cat)
    cat.mark_restore_verified(manifest.manifest_id)
    cat.quarantine(manifest.manifest_id, "bad")
    with pytest.raises(CheckpointError):
        cat.commit(job_id="j", attempt_id="a", step=1, expected_parts=[], storage_prefix="p")


def test_mark_restore_verified(catalog) -> None:
    cat, events = catalog
    manifest = _commit(cat)
    updated = cat.mark_restore_verified(manifest.manifest_id)
    assert updated.validation == CheckpointValidation.RESTORE_VERIFIED
    assert cat.store.get(manifest.manifest_id).validation == CheckpointValidation.RESTORE_VERIFIED
    assert events[-1].type == EventType.CHECKPOINT_RESTORE_VERIFIED


def test_quarantine(catalog) -> None:
    cat, events = catalog
    manifest = _commit(cat)
    updated = cat.quarantine(manifest.manifest_id, "restore failed: bad magic")
    assert updated.validation == CheckpointValidation.INVALID
    assert events[-1].type == EventType.CHECKPOINT_REJECTED
    assert events[-1].message == "restore failed: bad magic"
    assert cat.latest_valid("job") is None
    with pytest.raises(CheckpointError, match="quarantined"):
        cat.mark_restore_verified(manifest.manifest_id)
    assert cat.latest_valid("job") is None


@pytest.mark.parametrize("method", ["mark_restore_verified", "quarantine"])
def test_unknown_manifest_ids_raise(catalog, method: str) -> None:
    cat, events = catalog
    args = ("ck-000000000000",) if method == "mark_restore_verified" else ("ck-000000000000", "why")
    with pytest.raises(CheckpointError, match=r"unknown manifest id 'ck-000000000000'"):
        getattr(cat, method)(*args)
    assert events == []


def test_latest_valid_selection_ladder(catalog) -> None:
    cat, _ = catalog
    assert cat.latest_valid("job") is None
    m10 = _commit(cat, step=10)
    m20 = _commit(cat, step=20, attempt="a1")
    _commit(cat, step=99, job="other")
    assert cat.latest_valid("job").manifest_id == m20.manifest_id
    assert cat.latest_valid("job", require_restore_verified=True) is None
    cat.mark_restore_verified(m10.manifest_id)
    assert cat.latest_valid("job", require_restore_verified=True).manifest_id == m10.manifest_id
    assert cat.latest_valid("job").manifest_id == m20.manifest_id  # step first
    cat.quarantine(m20.manifest_id, "bad")
    assert cat.latest_valid("job").manifest_id == m10.manifest_id


def test_same_step_prefers_restore_verified_then_newest(catalog) -> None:
    cat, _ = catalog
    first = _commit(cat, step=10, attempt="a0")
    time.sleep(0.002)
    second = _commit(cat, step=10, attempt="a1")
    assert cat.latest_valid("job").manifest_id == second.manifest_id  # later created
    cat.mark_restore_verified(first.manifest_id)
    assert cat.latest_valid("job").manifest_id == first.manifest_id


def test_topology_compatibility(catalog) -> None:
    cat, _ = catalog
    two = _commit(cat, step=10, world_size=2)
    four = _commit(cat, step=20, attempt="a1", world_size=4)
    reshardable = _commit(cat, step=5, attempt="a2", world_size=4, compatible_world_sizes=[4, 8])
    assert cat.latest_valid("job", world_size=2).manifest_id == two.manifest_id
    assert cat.latest_valid("job", world_size=4).manifest_id == four.manifest_id
    assert cat.latest_valid("job", world_size=8).manifest_id == reshardable.manifest_id
    assert cat.latest_valid("job", world_size=3) is None


def test_lost_work(catalog) -> None:
    cat, _ = catalog
    assert cat.lost_work("job", 50) is None
    _commit(cat, step=40, world_size=2)
    assert cat.lost_work("job", 55) == 15
    assert cat.lost_work("job", 30) == 0
    assert cat.lost_work("job", 55, world_size=2) == 15
    assert cat.lost_work("job", 55, world_size=4) is None


def test_listener_errors_propagate_after_the_commit_is_stored() -> None:
    def boom(event: Event) -> None:
        raise RuntimeError("listener failed")

    cat = CheckpointCatalog(on_event=boom)
    cat.register_part("job", "a0", 1, _part("model.pt"))
    with pytest.raises(RuntimeError, match="listener failed"):
        cat.commit(job_id="job", attempt_id="a0", step=1, expected_parts=[_part("model.pt")], storage_prefix="p")
    assert cat.latest_valid("job") is not None
