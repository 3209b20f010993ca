"""Checkpoints that frameworks keep on their own, recognised where the script leaves them.

A script that saves with Hugging Face's ``Trainer`` (``checkpoint-<step>/``), Lightning
(``*.ckpt``, ``last.ckpt``), accelerate's ``save_state`` (``checkpoint_<n>/``, ``step_<n>/``),
PyTorch DCP (a directory with ``.metadata``) or in a file named by the user (``snapshot.pt``)
resumes itself; the runtime only needs to know what is there, which step it holds, and
whether its bytes are still the ones the framework wrote. Everything here is stdlib: the step
inside a torch file is read by an unpickler that builds nothing but inert stand-ins.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import pickletools
import re
import struct
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.checkpoint._hashing import hash_fd, open_regular
from flashruntime.workdir_walk import walk

__all__ = [
    "KINDS",
    "FrameworkCheckpoint",
    "checkpoint_files",
    "file_problem",
    "find_checkpoints",
    "fingerprint",
    "fingerprint_problem",
    "newest",
    "torch_file_step",
]

KINDS = ("huggingface", "lightning", "accelerate", "dcp", "pattern")

_HF_DIR = re.compile(r"^checkpoint-([0-9]+)$")
_ACCELERATE_DIR = re.compile(r"^(checkpoint|step)_([0-9]+)$")
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=([0-9]+)")
_MAX_PICKLE_BYTES = 1 << 20  # a step sits at the top of a dict: structure only, the tensors are elsewhere
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "optimizer.bin", "model.bin")


@dataclass(frozen=True)
class FrameworkCheckpoint:
    """One checkpoint a framework wrote: a directory (HF, accelerate, DCP) or a file."""

    kind: str
    path: Path
    step: int | None  # the training step (or epoch, see unit) it holds, when it can be told
    order: tuple[int, int]  # (step or save number, mtime): larger is newer
    unit: str = "step"  # "epoch" for a file that records how many epochs ran (EPOCHS_RUN, epoch)

    def describe(self, root: Path | None = None) -> str:
        """``huggingface checkpoint out/checkpoint-20 (step 20)``; the path relative to ``root``."""
        shown = self.path
        if root is not None:
            try:
                shown = self.path.relative_to(root)
            except ValueError:
                pass
        step = f"{self.unit} {self.step}" if self.step is not None else "step unknown"
        return f"{self.kind} checkpoint {shown} ({step})"


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _newest_mtime(path: Path) -> int:
    if path.is_file():
        return _mtime_ns(path)
    return max((_mtime_ns(f) for f in _walk_files(path)), default=_mtime_ns(path))


def _walk_files(directory: Path) -> Iterator[Path]:
    """Regular files below ``directory`` (links not followed), in a stable order."""
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not path.is_symlink() and path.is_file():
                yield path


def _hf_step(directory: Path, from_name: int) -> int:
    step = _by_content(directory / "trainer_state.json", _global_step)
    return step if step is not None else from_name


def _global_step(path: Path) -> int | None:
    try:
        step = json.loads(path.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


_READ: dict[tuple[str, int, int], Any] = {}  # (path, size, mtime) -> what was read from it


def _by_content(path: Path, read: Any) -> Any:
    """``read(path)``, read again only when the file's size or mtime changed: the watch looks
    at every checkpoint twice a second, and a step does not change while its file does not."""
    try:
        info = path.stat()
    except OSError:
        return None
    key = (str(path), info.st_size, info.st_mtime_ns)
    if key not in _READ:
        if len(_READ) > 4096:
            _READ.clear()
        _READ[key] = read(path)
    return _READ[key]


def _recognise_dir(directory: Path, names: set[str]) -> FrameworkCheckpoint | None:
    hf = _HF_DIR.match(directory.name)
    if hf and ("trainer_state.json" in names or names & set(_WEIGHT_FILES) or "config.json" in names):
        step = _hf_step(directory, int(hf.group(1)))
        return FrameworkCheckpoint("huggingface", directory, step, (step, _newest_mtime(directory)))
    accelerate = _ACCELERATE_DIR.match(directory.name)
    if accelerate and (names & set(_WEIGHT_FILES) or any(n.startswith("random_states_") for n in names)):
        number = int(accelerate.group(2))
        step = number if accelerate.group(1) == "step" else None  # checkpoint_<n> counts saves, not steps
        return FrameworkCheckpoint("accelerate", directory, step, (number, _newest_mtime(directory)))
    if ".metadata" in names and "manifest.json" not in names:
        digits = re.findall(r"[0-9]+", directory.name)
        step = int(digits[-1]) if digits else None
        return FrameworkCheckpoint("dcp", directory, step, (step or 0, _newest_mtime(directory)))
    return None


def _recognise_file(path: Path) -> FrameworkCheckpoint | None:
    if path.suffix != ".ckpt":
        return None
    named = _LIGHTNING_STEP.search(path.stem)
    position = (int(named.group(1)), "step") if named else torch_file_step(path)
    step, unit = position if position is not None else (None, "step")
    return FrameworkCheckpoint("lightning", path, step, (step if step is not None else -1, _mtime_ns(path)), unit)


def find_checkpoints(roots: Iterable[Path], patterns: Iterable[str] = (), *,
                     exclude: Iterable[Path] = ()) -> list[FrameworkCheckpoint]:
    """Every framework checkpoint below ``roots`` (at most a few levels down, links not
    followed, hidden and tool directories skipped), plus files matching the user's ``patterns``
    (globs relative to each root), oldest first. Our own ``manifest.json`` checkpoints are not
    a framework's and are left to the manifest catalog. Nothing at or below ``exclude`` is
    looked at (the run's own quarantine and kept copies, should they lie below a root)."""
    found: dict[Path, FrameworkCheckpoint] = {}
    patterns = list(patterns)
    excluded = [Path(path) for path in exclude]

    def outside(path: Path) -> bool:
        return not any(path == other or path.is_relative_to(other) for other in excluded)
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for pattern in patterns:
            for match in sorted(root.glob(pattern)):
                if match.is_symlink() or match in found or not outside(match):
                    continue
                if match.is_file() or match.is_dir():
                    position = torch_file_step(match) if match.is_file() else None
                    step, unit = position if position is not None else (None, "step")
                    found[match] = FrameworkCheckpoint("pattern", match, step,
                                                       (step if step is not None else -1, _newest_mtime(match)), unit)
        recognised_dirs: dict[Path, FrameworkCheckpoint | None] = {}

        def recognise(directory: Path, entries: list[os.DirEntry[str]]) -> FrameworkCheckpoint | None:
            if directory not in recognised_dirs:
                recognised_dirs[directory] = _recognise_dir(directory, {entry.name for entry in entries})
            return recognised_dirs[directory]

        # A checkpoint's insides are not searched for more checkpoints.
        for directory, entries in walk(root, enter=lambda d, e: outside(d) and recognise(d, e) is None):
            if not outside(directory):
                continue
            if directory != root and recognise(directory, entries) is not None:
                found.setdefault(directory, recognised_dirs[directory])  # type: ignore[arg-type]
                continue
            for entry in entries:
                path = Path(entry.path)
                if not entry.is_symlink() and entry.is_file() and path not in found:
                    recognised = _recognise_file(path)
                    if recognised is not None:
                        found[path] = recognised
    return sorted(found.values(), key=lambda c: (c.order, str(c.path)))


def newest(checkpoints: Iterable[FrameworkCheckpoint]) -> FrameworkCheckpoint | None:
    """The checkpoint a script resuming "from its latest" takes: largest step, then newest."""
    return max(checkpoints, key=lambda c: (c.order, str(c.path)), default=None)


def checkpoint_files(checkpoint: FrameworkCheckpoint) -> list[Path]:
    """The checkpoint's regular files (the file itself for a one-file checkpoint)."""
    if checkpoint.path.is_file():
        return [checkpoint.path]
    return list(_walk_files(checkpoint.path))


def _sha256(path: Path, *, use_cache: bool = True) -> str:
    """The file's sha256 through the checkpoint package's verification cache: a digest this
    process computed is reused while the file's (device, inode, size, mtime) are unchanged;
    a new process reads every byte again."""
    fd, st = open_regular(path)
    try:
        return hash_fd(fd, st, use_cache=use_cache)
    finally:
        os.close(fd)


def fingerprint(checkpoint: FrameworkCheckpoint) -> dict[str, dict[str, Any]]:
    """``{relative file name: {"size", "sha256"}}`` of every file of the checkpoint, as now."""
    base = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
    return {str(path.relative_to(base)): {"size": path.stat().st_size, "sha256": _sha256(path, use_cache=False)}
            for path in checkpoint_files(checkpoint)}


def fingerprint_problem(checkpoint: FrameworkCheckpoint, recorded: Mapping[str, Mapping[str, Any]]) -> str | None:
    """How the checkpoint differs from the fingerprint taken when the framework finished it,
    or None when every recorded file is there with its size and sha256 (see ``_sha256``: a file
    this process hashed and nothing wrote to since is not read again)."""
    base = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
    for name, expected in sorted(recorded.items()):
        path = base / name
        try:
            info = path.stat()
        except OSError:
            return f"{name} is missing"
        if info.st_size != expected.get("size"):
            return f"{name} is {info.st_size} bytes, {expected.get('size')} when it was written"
        if _sha256(path) != expected.get("sha256"):
            return f"{name} changed since it was written (sha256 differs)"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header, then the tensors' bytes:
    the header must parse and the last tensor must end where the file ends."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{path.name} is {size} bytes: too short for a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8 or length > 100 << 20:
            return f"{path.name}: its header claims {length} bytes but the file has {size}"
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return f"{path.name}: its header is not valid JSON (torn or changed)"
    if not isinstance(header, dict):
        return f"{path.name}: its header is not a JSON object"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2]
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"{path.name} is {size} bytes but its header describes {expected} (truncated or torn)"
    return None


def _zip_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"{path.name} is not a readable zip archive ({exc}): truncated or torn"
    except Exception as exc:  # noqa: BLE001 - zlib.error and friends: a corrupt member
        return f"{path.name}: a member does not decompress ({type(exc).__name__}: {exc})"
    if bad is not None:
        return f"{path.name}: member {bad} fails its CRC check (a changed or torn byte)"
    return None


def file_problem(path: Path) -> str | None:
    """Whether one file of a checkpoint reads as what it claims to be: a safetensors file's
    header and length, a torch file's zip archive and CRCs, a JSON file's syntax. None when it
    does, or when its format has nothing to check."""
    try:
        if path.suffix == ".safetensors":
            return _safetensors_problem(path)
        if path.suffix in (".pt", ".pth", ".ckpt", ".bin") and _looks_like_zip(path):
            return _zip_problem(path)
        if path.suffix in (".pt", ".pth", ".ckpt") and path.stat().st_size == 0:
            return f"{path.name} is empty"
        if path.suffix == ".json":
            json.loads(path.read_text())
    except ValueError:
        return f"{path.name} is not valid JSON (torn or changed)"
    except OSError as exc:
        return f"{path.name} cannot be read ({exc})"
    except (TypeError, KeyError, IndexError, RecursionError):
        return f"{path.name}: its header does not describe its contents (torn or changed)"
    return None


def _looks_like_zip(path: Path) -> bool:
    """torch.save writes zip archives; a torn one still starts with the local-header magic."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"


class _Inert:
    """What every class and function of a torch pickle becomes: accepts anything, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


_ALLOWED = {("collections", "OrderedDict"): collections.OrderedDict}


class _StepReader(pickle.Unpickler):
    """Reads a torch pickle's plain containers and numbers; every global is inert and storages
    are never loaded, so nothing of the file can run."""

    def find_class(self, module: str, name: str) -> Any:
        return _ALLOWED.get((module, name), _Inert())

    def persistent_load(self, pid: Any) -> None:
        return None


_POSITION_KEYS = (("global_step", "step"), ("step", "step"), ("steps", "step"), ("EPOCHS_RUN", "epoch"),
                  ("epoch", "epoch"))


def _harmless(data: bytes) -> bool:
    """Whether the pickle can be loaded without asking for much memory: every memo index it
    names is below its count of opcodes (CPython grows the memo to the largest index asked)."""
    try:
        opcodes = list(pickletools.genops(data))
    except Exception:  # noqa: BLE001 - not a pickle we can read: not one to load
        return False
    limit = len(opcodes)
    return all(not (opcode.name in _MEMO_OPS and isinstance(argument, int) and argument > limit)
               for opcode, argument, _ in opcodes)


_MEMO_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"})
def torch_file_step(path: Path) -> tuple[int, str] | None:
    """``(n, "step")`` or ``(n, "epoch")``: what a torch-saved dictionary records at its top
    level (``global_step``, ``step``, ``EPOCHS_RUN``, ``epoch``), or None for any other file."""
    return _by_content(path, _read_step)


def _read_step(path: Path) -> tuple[int, str] | None:
    try:
        if not _looks_like_zip(path):
            return None
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None or archive.getinfo(name).file_size > _MAX_PICKLE_BYTES:
                return None
            raw = archive.open(name).read(_MAX_PICKLE_BYTES + 1)
        if len(raw) > _MAX_PICKLE_BYTES or not _harmless(raw):
            return None
        data = _StepReader(io.BytesIO(raw)).load()
    except Exception:  # noqa: BLE001 - whatever is in the file, the answer is "cannot tell"
        return None
    if not isinstance(data, dict):
        return None
    for key, unit in _POSITION_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, unit
    return None
