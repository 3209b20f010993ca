"""A sweep trial's own working directory: a view of the source directory in which every
entry is a symlink to the original, so the trial's command reads the project as it is,
while what it writes into its working directory (``metrics.json``, a framework's
``checkpoint-<step>/``, ``lightning_logs/``) is its own and never read as another trial's.

Writing *into* a linked subdirectory still reaches the shared original: the collection
step refuses to credit such a file to a trial while other trials may write it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePath

__all__ = ["WORKDIR_NAME", "is_shared", "link_source_view"]

WORKDIR_NAME = "workdir"


def _written_names(collect: Iterable[str]) -> set[str]:
    """The names the trial is expected to write: the first path component of every collect
    pattern that names it literally (``metrics.json``, ``results/*.csv``). A wildcard there
    (``*.json``) would hide the project's own files, so such entries stay linked."""
    names = set()
    for pattern in collect:
        parts = PurePath(pattern).parts
        if parts and not any(char in parts[0] for char in "*?["):
            names.add(parts[0])
    return names


def link_source_view(source: Path, view: Path, collect: Iterable[str], *, skip: Iterable[Path] = ()) -> Path:
    """Make (or bring up to date) ``view`` as a view of ``source``: a symlink per entry of
    ``source``, except entries a collect pattern names (those the trial writes itself, see
    ``_written_names``) and
    entries holding any of ``skip`` (the run's own directory, when it lies inside the source).
    Entries the trial already made in ``view`` are kept. Returns ``view``."""
    source = source.resolve()
    view.mkdir(parents=True, exist_ok=True)
    written = _written_names(collect)
    skipped = [Path(path).resolve() for path in skip]
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.name in written:
                continue
            original = source / entry.name
            if any(path == original or path.is_relative_to(original) for path in skipped):
                continue
            link = view / entry.name
            if os.path.lexists(link):
                continue
            os.symlink(original, link, target_is_directory=entry.is_dir())
    return view


def is_shared(path: Path, view: Path) -> bool:
    """Whether ``path`` (found through ``view``) is really a file of the shared source: it
    resolves outside the view, through one of the view's links."""
    try:
        return not path.resolve().is_relative_to(view.resolve())
    except (OSError, RuntimeError):
        return True
