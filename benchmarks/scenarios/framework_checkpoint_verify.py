"""``framework_checkpoint_verify``: what checking a Hugging Face checkpoint before a relaunch
costs, beside what the framework spent writing it.

Comparator: the Hugging Face ``Trainer`` saving its own checkpoint (``_save_checkpoint``, the
call ``save_steps`` makes: ``model.safetensors``, the AdamW state in ``optimizer.pt``, the
scheduler, the RNG states and ``trainer_state.json``) of a GPT-2 built from a config, about
100 MB in all. Ours: ``FrameworkCheckpoints.problem`` on that directory, what a relaunch runs
first: every file against the fingerprint taken when it was written, in the driver that took
it (a file nothing wrote to since is not read again) and in a new driver (every file hashed
again, beside the floor of one bare sha256 pass over the same bytes). Each sample saves a
fresh checkpoint, fingerprints it (timed apart: the watch does it while the run goes on),
verifies it both ways, and removes it. Without transformers the rows are skipped.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row
from benchmarks.targets import FULL_VERIFY_OVER_HASH_FLOOR, VERIFY_OVER_FRAMEWORK_SAVE

NAME = "framework_checkpoint_verify"
SECTION = "performance"
MIN_SAMPLES = 5
WORK_DIR = Path(__file__).resolve().parents[1] / ".work"
COMPARATOR = "Trainer._save_checkpoint"

# GPT-2 with 3 layers of width 512 and a 5000-token vocabulary: ~12.6M parameters (48 MiB) whose
# checkpoint, with AdamW's two moments, is ~100 MB. Smoke: one layer of width 64.
FULL = {"n_layer": 3, "n_embd": 512, "n_head": 8, "vocab_size": 5000, "n_positions": 256}
SMOKE = {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 500, "n_positions": 64}


def _importable() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception:
        return False
    return True


def _trainer(config: dict[str, int], out: Path) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> dict[str, Any]:
            ids = torch.randint(0, config["vocab_size"], (16,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(output_dir=str(out), max_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             per_device_train_batch_size=4, disable_tqdm=True, logging_strategy="no")
    trainer = Trainer(model=GPT2LMHeadModel(GPT2Config(**config)), args=args, train_dataset=Tokens())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train()  # one step: the optimizer has its state, as at any real save
    return trainer


def _bare_sha256(directory: Path) -> None:
    """The floor of checking every byte: one sha256 pass over each file, nothing else."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)


def _samples(trainer: Any, out: Path, count: int) -> tuple[dict[str, list[float]], int]:
    from flashruntime.checkpoint.frameworks import find_checkpoints
    from flashruntime.checkpoint.local import clear_verification_cache
    from flashruntime.local.framework_resume import FrameworkCheckpoints

    times: dict[str, list[float]] = {"save": [], "fingerprint": [], "verify": [], "verify_new": [], "sha256": []}
    size = 0

    def timed(key: str, action: Any) -> Any:
        gc.collect()
        started = time.perf_counter()
        value = action()
        times[key].append((time.perf_counter() - started) * 1e3)
        return value

    for index in range(count + 1):  # the first is a warm-up, discarded
        quiet = contextlib.ExitStack()
        quiet.enter_context(contextlib.redirect_stdout(io.StringIO()))
        quiet.enter_context(contextlib.redirect_stderr(io.StringIO()))
        with quiet:
            timed("save", lambda: trainer._save_checkpoint(trainer.model, trial=None))
        job = out / f"job-{index}"
        checkpoints = FrameworkCheckpoints([out], [], job)
        found = [c for c in find_checkpoints([out]) if c.kind == "huggingface"]
        if len(found) != 1:
            raise RuntimeError(f"{NAME}: expected one Hugging Face checkpoint under {out}, found {found}")
        checkpoint = found[0]
        timed("fingerprint", lambda: checkpoints.record(checkpoint))
        problems = [timed("verify", lambda: checkpoints.problem(checkpoint))]
        restarted = FrameworkCheckpoints([out], [], job)  # a new driver: the fingerprints, read from disk
        clear_verification_cache()  # ... and no digest of this process's
        problems.append(timed("verify_new", lambda: restarted.problem(checkpoint)))
        timed("sha256", lambda: _bare_sha256(checkpoint.path))
        if any(problem is not None for problem in problems):
            raise RuntimeError(f"{NAME}: a checkpoint just written does not verify: {problems}")
        size = sum(path.stat().st_size for path in checkpoint.path.rglob("*") if path.is_file())
        shutil.rmtree(checkpoint.path)
        shutil.rmtree(job, ignore_errors=True)
        if index == 0:
            for values in times.values():
                values.clear()
    return times, size


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    metrics = ("ms_verify_before_relaunch", "ms_verify_in_a_new_process", "ms_fingerprint_while_running")
    if not _importable():
        reason = "torch or transformers is not importable here: the Hugging Face save needs them (skipped)"
        return [skipped_row(NAME, SECTION, metric, "ms", reason) for metric in metrics]
    from benchmarks.host import filesystem_type

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=f"{NAME}-", dir=WORK_DIR))
    try:
        out = base / "out"
        trainer = _trainer(SMOKE if smoke else FULL, out)
        times, size = _samples(trainer, out, samples)
        fs = filesystem_type(base)
        common = [
            f"the checkpoint: what the Hugging Face Trainer writes at a save ({COMPARATOR}: model.safetensors, "
            f"optimizer.pt with AdamW's moments, scheduler, RNG states, trainer_state.json), {size / 1e6:.0f} MB in "
            f"all, on {fs} under benchmarks/.work; the Trainer does no fsync",
            f"{len(times['save'])} sample(s) after one discarded warm-up; each sample saves a fresh checkpoint, "
            "fingerprints it, verifies it both ways, hashes it bare and removes it (files in the page cache, as on "
            "a relaunch on the same machine)",
        ]
        save = (COMPARATOR, times["save"])
        return [
            measured_row(NAME, SECTION, metrics[0], "ms", times["verify"], comparator=save,
                         target=VERIFY_OVER_FRAMEWORK_SAVE, notes=[
                             "ours = FrameworkCheckpoints.problem(checkpoint) in the process that fingerprinted it, "
                             "as flash.submit runs it before a relaunch: every file's size, and its digest from the "
                             "checkpoint verification cache (device, inode, size, mtime unchanged since this "
                             "process hashed it); a file written to since is hashed again", *common]),
            measured_row(NAME, SECTION, metrics[1], "ms", times["verify_new"],
                         comparator=("bare sha256 of every file", times["sha256"]),
                         target=FULL_VERIFY_OVER_HASH_FLOOR, notes=[
                             "ours = FrameworkCheckpoints.problem(checkpoint) in a new driver, with the fingerprints "
                             "read from disk and the verification cache cleared: every file hashed again and compared; comparator = the floor of "
                             "reading every byte, one hashlib.sha256 pass over each file", *common]),
            measured_row(NAME, SECTION, metrics[2], "ms", times["fingerprint"], comparator=save, notes=[
                             "ours = FrameworkCheckpoints.record(checkpoint): size and sha256 of every file, as the "
                             "watch takes them on its own thread while training goes on (off the training path)",
                             *common]),
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "Checking a framework's checkpoint before a relaunch (its format and every byte against the fingerprint "
        "taken when it was written) costs well under what the framework spent writing it."
    ),
    section=SECTION,
    run=run,
)
