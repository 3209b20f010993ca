"""Launch on this machine: one process group and one process container per attempt, the
environment contract, and a sweep that leaves no rank alive after its attempt ends or is
cancelled (the container, see ``containment``, also holds children that left both the group
and the environment).
"""

from __future__ import annotations

import os
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO

from flashruntime.launchers import Launcher, LaunchError, LaunchHandle, LaunchState
from flashruntime.launchers._sweep import attempt_processes, live_groups, proc_available, sweep
from flashruntime.launchers.containment import (
    CONTAINMENT_ENV,
    AttemptContainer,
    containment,
    end_leftover_cgroup,
)
from flashruntime.strategies import LaunchSpec
from flashruntime.strategies.command import torchrun_options

__all__ = [
    "LocalLaunchHandle",
    "LocalProcessLauncher",
    "open_container",
    "proc_available",
    "spawn_contained",
    "stop_leftover_attempt",
]

LOG_NAME = "launcher.log"


LOG_TAIL_BYTES = 1024 * 1024


def read_log_tail(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a log as text ("" when unreadable): a large log is never read whole."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, lines: int) -> str:
    text = read_log_tail(path).splitlines()
    return "\n".join(text[-lines:]) if lines > 0 else ""


def _output_marker(attempt_dir: Path) -> bytes:
    """The environment entry that tags every process of an attempt, as the child's
    environment holds it: the path's own bytes (``os.fsencode``), so a directory name
    that is not UTF-8 matches too. Raises UnicodeEncodeError for a path no filesystem
    call could take either."""
    return b"FLASHML_OUTPUT_DIR=" + os.fsencode(attempt_dir)


def stop_leftover_attempt(output_dir: Path, grace_s: float, *, pgids: Iterable[int] = (),
                          cgroup: str | None = None) -> set[int]:
    """Stop what is left of an attempt whose driver died (its worker killed with ``kill -9``):
    every process whose environment carries the attempt's marker (``FLASHML_OUTPUT_DIR=
    <output_dir>``), and the other members of those ``pgids`` (the groups recorded for the
    attempt) that such a process belongs to. A recorded group no marked process is in is
    left alone: once the attempt's processes had gone, its id may name someone else's group.
    Then everything in the attempt's recorded ``cgroup`` (see ``end_leftover_cgroup``),
    which is removed. SIGTERM, then SIGKILL after ``grace_s``; returns the pids signalled.
    Needs /proc (Linux): elsewhere nothing can be told to be the attempt's, and nothing is stopped."""
    if not proc_available():
        return set()
    swept = _stop_marked(Path(output_dir), grace_s, pgids)
    if cgroup is not None:
        swept |= end_leftover_cgroup(cgroup, _grace_seconds(grace_s))
    return swept


def _stop_marked(output_dir: Path, grace_s: float, pgids: Iterable[int]) -> set[int]:
    marker = _output_marker(output_dir)
    recorded = set(pgids)
    trusted: set[int] = set()

    def find() -> dict[int, int | None]:
        marked = attempt_processes(marker, ())
        # A group proven the attempt's stays so while the sweep runs: its marked members may
        # die first, and the rest (a child that cleared its environment) must still be found.
        trusted.update(group for group in marked.values() if group in recorded)
        return attempt_processes(marker, trusted) if trusted else marked

    return sweep(find, _grace_seconds(grace_s))


# This process's attempts not yet settled: a subreaper scope must leave their processes alone.
_live_handles: weakref.WeakSet[LocalLaunchHandle] = weakref.WeakSet()
_live_lock = threading.Lock()


def _known_to_others(output_dir: Path) -> set[int]:
    """The leaders and marked processes of this process's other live attempts."""
    with _live_lock:
        others = [handle for handle in _live_handles if handle.output_dir != output_dir]
    known: set[int] = set()
    for handle in others:
        known |= handle._known()
    return known


def open_container(output_dir: Path, name: str) -> AttemptContainer:
    """A new process container for the attempt that will run in ``output_dir``."""
    return containment().open(name, known_elsewhere=lambda: _known_to_others(output_dir))


class LocalLaunchHandle(LaunchHandle):
    """A running attempt. ``exit_code`` is the raw return code (negative = signal).
    ``container`` holds the attempt's processes (see ``containment``); it is emptied and
    released when the attempt settles."""

    def __init__(
        self, process: subprocess.Popen[bytes], output_dir: Path, term_grace_s: float, *,
        previous_dir: Path | None = None, marker: bytes | None = None,
        container: AttemptContainer | None = None,
    ) -> None:
        self._process = process
        self.container = container if container is not None else AttemptContainer()
        self.launched_as = f"pid {process.pid}, containment {self.container.describe()}"
        self.output_dir = output_dir
        # Where an earlier run's directory for this attempt id was moved before launch, if one was.
        self.previous_dir = previous_dir
        self._term_grace_s = term_grace_s
        # The launcher builds the marker before it spawns (building it can fail); see _output_marker.
        self._marker = marker if marker is not None else _output_marker(output_dir)
        # Re-entrant: a signal handler on the thread that is settling may cancel the same handle.
        self._lock = threading.RLock()
        self._cancel_requested = False
        self._state: LaunchState | None = None
        self.exit_code: int | None = None
        # Fallback where /proc is missing: pids seen by the resource sampler.
        self.extra_pids: Callable[[], set[int]] = set
        with _live_lock:
            _live_handles.add(self)
        weakref.finalize(self, self.container.release_if_empty)

    @property
    def execution_id(self) -> str:
        return str(self._process.pid)

    def _known(self) -> set[int]:
        """The leader and the processes carrying the marker (not the container's members)."""
        known = set(attempt_processes(self._marker, [self._process.pid])) if proc_available() else set()
        return known | {self._process.pid}

    def _find(self) -> dict[int, int | None]:
        leader = self._process.pid
        # The leader is judged by Popen, never by the sampler's view: unreaped, it is a
        # zombie that kill(pid, 0) reports alive, and that would stall the sweep.
        found = attempt_processes(self._marker, [leader], set(self.extra_pids()) - {leader})
        members = self.container.members() - {leader} - set(found)
        found.update(live_groups(members))
        if not proc_available() and self._process.poll() is None:
            # Without /proc the leader's group cannot be listed, so name the leader
            # itself; its group id is its pid (own session / CREATE_NEW_PROCESS_GROUP).
            found[leader] = leader
        return found

    def processes(self) -> set[int]:
        """The attempt's live processes now: the leader, every process carrying its marker and
        every member of its container."""
        return set(self._find())

    def _settle(self, returncode: int, grace_s: float | None = None) -> LaunchState:
        """Called once the leader has exited: sweep the rest, then cache the result."""
        with self._lock:
            if self._state is not None:
                return self._state
            sweep(self._find, self._term_grace_s if grace_s is None else grace_s)
            self.container.close()
            with _live_lock:
                _live_handles.discard(self)
            self.exit_code = returncode
            if self._cancel_requested:
                self._state = LaunchState.CANCELLED
            elif returncode == 0:
                self._state = LaunchState.SUCCEEDED
            else:
                self._state = LaunchState.FAILED
            return self._state

    def poll(self) -> LaunchState:
        if self._state is not None:
            return self._state
        returncode = self._process.poll()
        if returncode is None:
            return LaunchState.RUNNING
        return self._settle(returncode)

    def wait(self, timeout_seconds: float | None = None) -> LaunchState:
        if self._state is not None:
            return self._state
        try:
            returncode = self._process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            return LaunchState.RUNNING
        return self._settle(returncode)

    def cancel(self, *, grace_s: float | None = None) -> None:
        """SIGTERM the attempt's processes, SIGKILL what is left after ``grace_s`` (default:
        the launcher's ``term_grace_s``; 0 kills at once, as when a second interrupt says hurry)."""
        grace = self._term_grace_s if grace_s is None else _grace_seconds(grace_s)
        if self._state is not None:
            return
        returncode = self._process.poll()
        if returncode is not None:  # it already exited: the exit decides, not this late cancel
            if grace_s is not None:
                # Outside the lock: another thread may be settling with the full grace period.
                sweep(self._find, grace)
            self._settle(returncode, grace)
            return
        self._cancel_requested = True
        sweep(self._find, grace)
        try:
            returncode = self._process.wait(timeout=grace + 30)
        except subprocess.TimeoutExpired:
            return
        self._settle(returncode, grace)

    def logs(self, tail_lines: int = 200) -> str:
        return _tail(self.output_dir / LOG_NAME, tail_lines)


def _grace_seconds(value: object) -> float:
    """An explicit ``grace_s`` as float seconds, refused before anything is signalled."""
    try:
        seconds = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except OverflowError:
        seconds = None
    if seconds is None or not 0 <= seconds < float("inf"):
        raise ValueError(f"grace_s must be a finite number of seconds >= 0 or None, got {value!r}")
    return seconds


def aside_path(attempt_dir: Path, now: datetime) -> Path:
    """A free sibling name for an earlier run's attempt directory:
    ``<attempt_id>.prev-<UTC yyyymmddTHHMMSS>``, with ``-1``, ``-2``, ... when taken."""
    base = f"{attempt_dir.name}.prev-{now.astimezone(timezone.utc):%Y%m%dT%H%M%S}"
    candidate, n = attempt_dir.with_name(base), 0
    while os.path.lexists(candidate):
        n += 1
        candidate = attempt_dir.with_name(f"{base}-{n}")
    return candidate


def _move_aside(attempt_dir: Path) -> Path | None:
    """Attempt ids repeat run to run: an earlier run's non-empty attempt directory is
    renamed (never reused, never deleted) so nothing of it is read as this attempt's."""
    try:
        if not os.path.lexists(attempt_dir):
            return None
        if attempt_dir.is_dir() and not attempt_dir.is_symlink() and not any(attempt_dir.iterdir()):
            return None  # empty: nothing to credit or mix in
        target = aside_path(attempt_dir, datetime.now(timezone.utc))
        os.rename(attempt_dir, target)
    except OSError as exc:
        raise LaunchError(
            f"an earlier run left {str(attempt_dir)!r} and it could not be moved aside ({exc}); "
            "move or remove it, or use another output_dir"
        ) from exc
    return target


RANK_LOGS_DIR = "rank-logs"
# torchrun's own options that already say where the ranks' output goes.
_TORCHRUN_OUTPUT_OPTIONS = ("-t", "--tee", "-r", "--redirects", "--log-dir", "--log_dir", "--logs-specs", "--logs_specs")


def _is_torchrun(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == "torchrun"


def torchrun_output_env(argv: list[str], attempt_dir: Path) -> dict[str, str]:
    """For a torchrun command, ask torchrun (through the ``PET_*`` variables its options read)
    to tag every rank's lines ``[default<N>]:`` and keep each rank's own log under
    ``<attempt>/rank-logs/``, as ``--tee 3 --log-dir`` would. The command's own output
    options, and ``PET_*`` variables already set, win. Empty for any other command."""
    if not _is_torchrun(argv):
        return {}
    if any(option in _TORCHRUN_OUTPUT_OPTIONS for option in torchrun_options(argv)):
        return {}
    if any(name in os.environ for name in ("PET_TEE", "PET_REDIRECTS", "PET_LOG_DIR", "PET_LOGS_SPECS")):
        return {}
    return {"PET_TEE": "3", "PET_LOG_DIR": str(attempt_dir / RANK_LOGS_DIR)}


def _safe_relative(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise LaunchError(f"LaunchSpec.files name {name!r} must be a relative path inside the attempt directory")
    return path


class LocalProcessLauncher(Launcher):
    name = "local"

    def __init__(
        self, output_root: str | Path, *, term_grace_s: float = 10.0, checkpoint_dir: str | Path | None = None
    ) -> None:
        self.output_root = Path(os.path.expanduser(str(output_root))).resolve()
        self.term_grace_s = term_grace_s
        self.checkpoint_dir = (
            None if checkpoint_dir is None else Path(os.path.expanduser(str(checkpoint_dir))).resolve()
        )

    def checkpoint_root(self, job_id: str) -> Path:
        """The FLASHML_CKPT_DIR every attempt of ``job_id`` gets."""
        return self.checkpoint_dir or self.output_root / job_id / "ckpt"

    def attempt_dir(self, job_id: str, attempt_id: str) -> Path:
        return self.output_root / job_id / attempt_id

    def launch(self, spec: LaunchSpec, job_id: str, attempt_id: str) -> LocalLaunchHandle:
        if not spec.argv:
            raise LaunchError("cannot launch an empty command: give argv, e.g. ['python', 'train.py']")
        workdir = Path(os.path.expanduser(spec.workdir_hint or "."))
        if not workdir.is_dir():
            raise LaunchError(f"working directory {str(workdir)!r} does not exist; set Source(path=...) to your project")
        files = {_safe_relative(name): text for name, text in spec.files.items()}
        attempt_dir = self.attempt_dir(job_id, attempt_id)
        # Everything that can fail is done before the spawn: a child must never be left
        # running without a handle to stop it.
        try:
            marker = _output_marker(attempt_dir)
        except UnicodeEncodeError as exc:
            raise LaunchError(
                f"attempt directory {str(attempt_dir)!r} cannot be encoded as a file name ({exc.reason}); "
                "use another output_dir"
            ) from exc
        previous_dir = _move_aside(attempt_dir)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        for relative, text in files.items():
            target = attempt_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        env = {
            **os.environ,
            **torchrun_output_env(spec.argv, attempt_dir),
            **spec.env,
            "FLASHML_OUTPUT_DIR": str(attempt_dir),
            "FLASHML_CKPT_DIR": str(self.checkpoint_root(job_id)),
            "FLASHML_JOB_ID": job_id,
            "FLASHML_ATTEMPT_ID": attempt_id,
        }
        try:
            container = open_container(attempt_dir, f"{job_id}-{attempt_id}")
        except OSError as exc:
            raise LaunchError(f"could not make a process container for {attempt_id!r}: {exc}") from exc
        with open(attempt_dir / LOG_NAME, "wb") as log:
            try:
                process = spawn_contained(spec.argv, container, cwd=workdir, env=env, stdout=log)
            except OSError as exc:
                raise LaunchError(f"could not start {spec.argv[0]!r}: {exc}") from exc
            except subprocess.SubprocessError as exc:
                raise LaunchError(f"could not start {spec.argv[0]!r} inside its process container "
                                  f"({container.describe()}): {exc}; set {CONTAINMENT_ENV}=subreaper to "
                                  "contain attempts without cgroups") from exc
        return LocalLaunchHandle(process, attempt_dir, self.term_grace_s, previous_dir=previous_dir, marker=marker,
                                 container=container)


def spawn_contained(argv: list[str], container: AttemptContainer, *, cwd: Path, env: dict[str, str],
                    stdout: IO[bytes] | int) -> subprocess.Popen[bytes]:
    """Start ``argv`` as an attempt's first process: no shell, its own process group (its own
    session on POSIX), stdout and stderr to ``stdout``, inside ``container`` before it runs
    any of its own code. A child that cannot enter the container is never left running:
    the spawn fails (``subprocess.SubprocessError``, or ``OSError``) and the container is closed."""
    posix = os.name == "posix"
    try:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
            # The container's preexec makes raw system calls only (open, write, close).
            start_new_session=posix, preexec_fn=container.preexec,  # noqa: PLW1509
            creationflags=0 if posix else subprocess.CREATE_NEW_PROCESS_GROUP,  # type: ignore[attr-defined]
        )
    except BaseException:
        container.close()
        raise
    container.started(process.pid)
    return process


