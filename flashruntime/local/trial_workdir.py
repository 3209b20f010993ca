"""A sweep trial's own working directory: a view of the source directory in which every
directory is a directory of the view's own and every file a symlink to the original, so the
trial's command reads the project as it is, while whatever it writes (``metrics.json``, a
framework's ``checkpoint-<step>/`` under an ``out/`` that already existed, ``lightning_logs/``)
is its own and never read as another trial's.

The view mirrors at most ``MAX_DEPTH`` levels and ``MAX_ENTRIES`` entries; past that, a
directory is linked whole, and a file written into it reaches the shared original: the
collection step refuses to credit such a file to a trial while other trials may write it too.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from pathlib import Path, PurePath

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "WORKDIR_NAME", "is_shared", "link_source_view"]

WORKDIR_NAME = "workdir"
MAX_DEPTH = 4
MAX_ENTRIES = 20_000


def _written(collect: Iterable[str]) -> list[str]:
    """The patterns of what the trial writes (collected outputs, its own checkpoints): a match in
    the source is not linked, since writing it would write through to the original."""
    return [str(PurePath(pattern)) for pattern in collect if PurePath(pattern).parts]


def link_source_view(source: Path, view: Path, collect: Iterable[str], *, skip: Iterable[Path] = ()) -> Path:
    """Make (or bring up to date) ``view`` as a view of ``source`` (see the module's text):
    files matching one of the ``collect`` patterns, and entries holding any of ``skip`` (the run's own
    directory, when it lies inside the source), are left out. Entries the trial already made
    in ``view`` are kept. Returns ``view``."""
    source = source.resolve()
    patterns = _written(collect)
    skipped = [Path(path).resolve() for path in skip]
    budget = [MAX_ENTRIES]
    view.mkdir(parents=True, exist_ok=True)
    _mirror(source, view, PurePath(), patterns, skipped, budget, 0)
    return view


def _mirror(directory: Path, into: Path, relative: PurePath, patterns: list[str], skipped: list[Path],
            budget: list[int], depth: int) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return
    budget[0] -= len(entries)
    for entry in entries:
        original = directory / entry.name
        name = str(relative / entry.name)
        if any(original == path or path.is_relative_to(original) for path in skipped):
            continue
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            continue  # the trial writes it: a link would write through to the shared original
        target = into / entry.name
        real_dir = entry.is_dir(follow_symlinks=False)
        if real_dir and depth < MAX_DEPTH and budget[0] > 0:
            if os.path.lexists(target) and not target.is_dir():
                continue  # the trial put something of its own there
            target.mkdir(exist_ok=True)
            _mirror(original, target, relative / entry.name, patterns, skipped, budget, depth + 1)
        elif not os.path.lexists(target):
            os.symlink(original, target, target_is_directory=entry.is_dir())


def is_shared(path: Path, view: Path) -> bool:
    """Whether ``path`` (found through ``view``) is really a file of the shared source: it
    resolves outside the view, through one of the view's links."""
    try:
        return not path.resolve().is_relative_to(view.resolve())
    except (OSError, RuntimeError):
        return True
