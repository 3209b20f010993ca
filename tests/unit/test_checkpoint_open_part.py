"""``open_part``: one pass, hashed on a helper thread while written, even
when the writer reuses its buffer right after each ``write`` returns."""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashruntime.checkpoint import open_part
from flashruntime.checkpoint.local import clear_verification_cache, verification_cache_stats


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_clean_exit_renames_and_records_digest(tmp_path: Path) -> None:
    step = tmp_path / "step-000001"
    with open_part(step, "model.pt") as f:
        assert (step / ".model.pt.tmp").exists()
        assert not (step / "model.pt").exists()
        assert f.digest is None
        f.write(b"hello ")
        f.write(bytearray(b"world"))
        f.write(memoryview(b"!"))
        assert f.tell() == 12
    assert (step / "model.pt").read_bytes() == b"hello world!"
    assert not (step / ".model.pt.tmp").exists()
    assert f.digest == (_sha(b"hello world!"), 12)


def test_the_hash_is_computed_on_a_helper_thread(tmp_path: Path) -> None:
    with open_part(tmp_path, "p.bin") as f:
        names = {t.name for t in threading.enumerate()}
        assert "flashruntime-part-sha256" in names
        f.write(b"x")
    assert "flashruntime-part-sha256" not in {t.name for t in threading.enumerate()}


def test_empty_part(tmp_path: Path) -> None:
    with open_part(tmp_path, "empty") as f:
        pass
    assert f.digest == (_sha(b""), 0)
    assert (tmp_path / "empty").read_bytes() == b""


def test_exception_removes_the_temporary_file_and_records_nothing(tmp_path: Path) -> None:
    clear_verification_cache()
    with pytest.raises(RuntimeError, match="boom"):
        with open_part(tmp_path, "model.pt") as f:
            f.write(os.urandom(3 << 20))
            raise RuntimeError("boom")
    assert f.digest is None
    assert sorted(os.listdir(tmp_path)) == []
    assert verification_cache_stats()["entries"] == 0
    assert not [t for t in threading.enumerate() if t.name == "flashruntime-part-sha256"]


def test_exception_keeps_an_older_committed_part(tmp_path: Path) -> None:
    with open_part(tmp_path, "model.pt") as f:
        f.write(b"old")
    with pytest.raises(KeyboardInterrupt):
        with open_part(tmp_path, "model.pt") as g:
            g.write(b"new")
            raise KeyboardInterrupt
    assert (tmp_path / "model.pt").read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]


def test_clean_exit_records_in_the_verification_cache(tmp_path: Path) -> None:
    clear_verification_cache()
    with open_part(tmp_path, "model.pt") as f:
        f.write(b"abc")
    assert verification_cache_stats()["entries"] == 1


def test_writes_after_close_are_refused(tmp_path: Path) -> None:
    with open_part(tmp_path, "model.pt") as f:
        f.write(b"abc")
        f.close()
        assert f.closed
        with pytest.raises(ValueError, match="closed"):
            f.write(b"more")
    assert f.digest == (_sha(b"abc"), 3)


def test_step_dir_is_created(tmp_path: Path) -> None:
    with open_part(tmp_path / "a" / "b", "x") as f:
        f.write(b"1")
    assert (tmp_path / "a" / "b" / "x").read_bytes() == b"1"


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "manifest.json", "nul\x00"])
def test_bad_part_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        with open_part(tmp_path, name):
            pass
    assert os.listdir(tmp_path) == []


def test_pickle_into_a_part(tmp_path: Path) -> None:
    state = {"w": os.urandom(5 << 20), "b": bytearray(os.urandom(1000)), "n": list(range(1000))}
    with open_part(tmp_path, "state.pkl") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    data = (tmp_path / "state.pkl").read_bytes()
    assert f.digest == (_sha(data), len(data))
    assert pickle.loads(data) == state


def test_a_writer_reusing_its_buffer(tmp_path: Path) -> None:
    """The caller may overwrite a lent buffer as soon as write() returns."""
    buffer = bytearray(3 << 20)
    expected = hashlib.sha256()
    size = 0
    with open_part(tmp_path, "reused") as f:
        for round_ in range(12):
            chunk = os.urandom(len(buffer) - round_ * 1000)
            view = memoryview(buffer)[: len(chunk)]
            view[:] = chunk
            f.write(view)
            view[:] = b"\xff" * len(chunk)  # scribble over it at once
            expected.update(chunk)
            size += len(chunk)
    assert f.digest == (expected.hexdigest(), size)
    assert hashlib.sha256((tmp_path / "reused").read_bytes()).hexdigest() == expected.hexdigest()


def test_non_byte_memoryviews(tmp_path: Path) -> None:
    import array

    numbers = array.array("d", range(300_000))  # 2.4 MB of 8-byte items
    with open_part(tmp_path, "floats") as f:
        f.write(memoryview(numbers))
        f.write(numbers)
    raw = numbers.tobytes() * 2
    assert f.digest == (_sha(raw), len(raw))


_write_sizes = st.lists(
    st.one_of(st.integers(0, 300), st.integers(60_000, 70_000), st.integers(1 << 20, (3 << 20) + 17)),
    min_size=0,
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=_write_sizes, kinds=st.lists(st.sampled_from(["bytes", "bytearray", "lent"]), min_size=12, max_size=12))
def test_any_write_pattern_hashes_like_hashlib(tmp_path: Path, sizes: list[int], kinds: list[str]) -> None:
    source = os.urandom(sum(sizes))
    lent = bytearray(max(sizes, default=0))
    offset = 0
    with open_part(tmp_path, "prop") as f:
        for size, kind in zip(sizes, kinds, strict=False):
            piece = source[offset : offset + size]
            offset += size
            if kind == "bytes":
                f.write(piece)
            elif kind == "bytearray":
                f.write(bytearray(piece))
            else:
                view = memoryview(lent)[:size]
                view[:] = piece
                f.write(view)
                view[:] = bytes(size)
    assert f.digest == (_sha(source), len(source))
    assert (tmp_path / "prop").read_bytes() == source


def _pool_blocks_out() -> int:
    from flashruntime.checkpoint._hashing import POOL

    return POOL.outstanding()


def test_a_lent_write_larger_than_the_copy_pool(tmp_path: Path) -> None:
    data = bytearray(os.urandom(48 << 20))  # more than the pool's 32 blocks: the writer waits for the hasher
    with open_part(tmp_path, "big") as f:
        f.write(memoryview(data))
        data[:] = bytes(len(data))
        f.write(b"tail")
    assert f.digest[1] == (48 << 20) + 4
    assert f.digest[0] == _sha((tmp_path / "big").read_bytes())
    assert _pool_blocks_out() == 0


def test_parts_written_concurrently(tmp_path: Path) -> None:
    payloads = {f"part{i}": os.urandom((5 << 20) + i) for i in range(4)}
    digests: dict[str, tuple[str, int] | None] = {}

    def write(name: str) -> None:
        buffer = bytearray(1 << 20)
        data = payloads[name]
        with open_part(tmp_path, name) as f:
            for offset in range(0, len(data), 7000):  # small writes, coalesced in pool blocks
                f.write(data[offset : offset + 7000])
            for offset in range(0, len(data), len(buffer)):  # lent writes of a reused buffer
                piece = data[offset : offset + len(buffer)]
                view = memoryview(buffer)[: len(piece)]
                view[:] = piece
                f.write(view)
        digests[name] = f.digest

    threads = [threading.Thread(target=write, args=(name,)) for name in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, data in payloads.items():
        assert digests[name] == (_sha(data * 2), 2 * len(data))
    assert _pool_blocks_out() == 0


def test_pool_blocks_come_back_after_an_exception(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        with open_part(tmp_path, "x") as f:
            f.write(b"a" * 1000)  # a partly filled pool block
            f.write(bytearray(3 << 20))
            raise OSError("disk full")
    assert _pool_blocks_out() == 0
