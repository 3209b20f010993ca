"""A bounded walk of a script's working directory, for what a run looks for in it (a
framework's checkpoints, its metrics files): a few levels down, links never followed (a
sweep trial's view links the shared project, which is not the trial's), version-control and
tool directories skipped, and at most so many entries, so a large project is never walked
whole. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "SKIPPED_DIRS", "walk"]

MAX_DEPTH = 4  # below the root: out/checkpoint-10, lightning_logs/version_0/checkpoints/x.ckpt
MAX_ENTRIES = 20_000
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", "wandb"})


def walk(root: Path, *, enter: Callable[[Path, list[os.DirEntry[str]]], bool] = lambda directory, entries: True,
         max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Iterator[tuple[Path, list[os.DirEntry[str]]]]:
    """``(directory, its entries sorted by name)`` for ``root`` and the directories below it.
    ``enter(directory, entries)`` False keeps the walk out of that directory's subdirectories
    (a checkpoint's insides hold no further checkpoints); the root is always entered."""
    stack, budget = [(Path(root), 0)], max_entries
    while stack and budget > 0:
        directory, depth = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError:
            continue
        budget -= len(entries)
        yield directory, entries
        if depth >= max_depth or (depth > 0 and not enter(directory, entries)):
            continue
        for entry in reversed(entries):
            if not entry.is_symlink() and entry.is_dir() and entry.name not in SKIPPED_DIRS \
                    and not entry.name.startswith("."):
                stack.append((Path(entry.path), depth + 1))
