"""One process container per attempt, so a child that leaves its process group and clears
its environment (``setsid`` + ``execve`` with no environment) is still the attempt's.

Best available first: a cgroup v2 per attempt (``<own cgroup>/flashruntime/<attempt>``,
ended with ``cgroup.kill``); else, on Linux, this process becomes a child subreaper so
orphans re-parent to it and are found as its descendants; else the process group and the
environment marker alone (``_sweep``). ``containment().describe()`` says which is in force.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import enum
import errno
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CGROUP_PARENT",
    "CONTAINMENT_ENV",
    "AttemptCgroup",
    "AttemptContainer",
    "Containment",
    "ContainmentKind",
    "SubreaperScope",
    "containment",
    "containment_in_force",
    "detect_containment",
    "end_leftover_cgroup",
    "own_cgroup",
    "parse_cgroup2_mount",
]

CGROUP_PARENT = "flashruntime"  # the directory below the agent's own cgroup that holds the attempts'
CONTAINMENT_ENV = "FLASHML_CONTAINMENT"  # auto (default), cgroup, subreaper or process-group
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_CREATOR = re.compile(r"-([0-9]+)-[0-9]+$")  # <attempt>-<pid of the process that made it>-<serial>
_KILL_WAIT_S = 30.0  # a member that outlives SIGKILL this long is in the kernel's hands (D state)
_POLL_S = 0.02
_PR_SET_CHILD_SUBREAPER = 36


class ContainmentKind(enum.Enum):
    CGROUP = "cgroup"
    SUBREAPER = "subreaper"
    PROCESS_GROUP = "process-group"


@dataclasses.dataclass(frozen=True)
class Containment:
    """What contains this process's attempts: the kind, the cgroup directory the attempts'
    cgroups are made in (cgroup only), and why a better kind is not in force."""

    kind: ContainmentKind
    parent: Path | None = None
    reason: str = ""

    def describe(self) -> str:
        if self.kind is ContainmentKind.CGROUP:
            return f"cgroup v2 ({self.parent})"
        if self.kind is ContainmentKind.SUBREAPER:
            return "subreaper"
        return "process group only"

    def open(self, name: str, *, known_elsewhere: Callable[[], set[int]] = set) -> AttemptContainer:
        """A new, empty container for one attempt (``name`` is made safe and unique).
        ``known_elsewhere``: pids of this process's other live attempts, which a subreaper
        scope must never take for this one's."""
        if self.kind is ContainmentKind.CGROUP and self.parent is not None:
            return AttemptCgroup.create(self.parent, name)
        if self.kind is ContainmentKind.SUBREAPER:
            return SubreaperScope(known_elsewhere)
        return AttemptContainer()


def parse_cgroup2_mount(mountinfo: str) -> tuple[Path, str] | None:
    """(mount point, root within the hierarchy) of the cgroup v2 mount in a
    ``/proc/<pid>/mountinfo`` text: ``/sys/fs/cgroup`` when it is cgroup2, else the first
    cgroup2 mount (on a hybrid layout, the ``unified`` one beside the v1 controllers)."""
    found: list[tuple[Path, str]] = []
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or not tail or tail[0] != "cgroup2":
            continue
        found.append((Path(_unescape(fields[4])), _unescape(fields[3])))
    for mount in found:
        if mount[0] == Path("/sys/fs/cgroup"):
            return mount
    return found[0] if found else None


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path from a ``/proc/<pid>/cgroup`` text (its ``0::`` line)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            path = line[3:].strip()
            return path if path.startswith("/") else None
    return None


def _cgroup_dir(mount: tuple[Path, str], path: str) -> Path | None:
    """The directory of cgroup ``path`` under the mount, which may show the hierarchy from
    a root below the top (a container's bind mount): None when ``path`` is not below it."""
    point, root = mount
    root = root.rstrip("/") or "/"
    if root == "/":
        relative = path.lstrip("/")
    elif path == root or path.startswith(root + "/"):
        relative = path[len(root):].lstrip("/")
    else:
        return None
    return point / relative if relative else point


def detect_containment(
    *,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path | None = None,
    requested: str | None = None,
    platform: str = sys.platform,
    become_subreaper: Callable[[], bool] | None = None,
) -> Containment:
    """Probe what can contain attempts here. ``cgroup_root`` stands for this process's own
    cgroup directory (found from ``mountinfo`` and ``proc_cgroup`` when None); ``requested``
    is ``FLASHML_CONTAINMENT``'s value when None; ``become_subreaper`` makes this process a
    child subreaper (``prctl``) and says whether it did. The cgroup probe creates
    ``<own cgroup>/flashruntime/``, then places a short-lived child in a cgroup below it."""
    from flashruntime.errors import LaunchError

    wanted = (os.environ.get(CONTAINMENT_ENV, "") if requested is None else requested).strip().lower() or "auto"
    choices = ("auto", *(kind.value for kind in ContainmentKind))
    if wanted not in choices:
        raise LaunchError(f"{CONTAINMENT_ENV}={wanted!r} is not a containment; use one of {', '.join(choices)}")
    if not platform.startswith("linux"):
        return Containment(ContainmentKind.PROCESS_GROUP, reason=f"{platform} has neither cgroups nor subreapers")
    if wanted == ContainmentKind.PROCESS_GROUP.value:
        return Containment(ContainmentKind.PROCESS_GROUP, reason=f"{CONTAINMENT_ENV}={wanted}")
    reason = f"{CONTAINMENT_ENV}={wanted}"
    if wanted in ("auto", ContainmentKind.CGROUP.value):
        own = cgroup_root if cgroup_root is not None else _own_cgroup_dir(mountinfo, proc_cgroup)
        parent, reason = _probe_cgroup(own) if isinstance(own, Path) else (None, own)
        if parent is not None:
            return Containment(ContainmentKind.CGROUP, parent)
        if wanted == ContainmentKind.CGROUP.value:
            raise LaunchError(f"{CONTAINMENT_ENV}=cgroup but no cgroup can be made here: {reason}; "
                              "run as root or in a delegated cgroup v2 subtree, or set it to auto")
    if (become_subreaper or _set_child_subreaper)():
        return Containment(ContainmentKind.SUBREAPER, reason=reason)
    return Containment(ContainmentKind.PROCESS_GROUP, reason=f"{reason}; prctl(PR_SET_CHILD_SUBREAPER) failed")


def _own_cgroup_dir(mountinfo: Path, proc_cgroup: Path) -> Path | str:
    """This process's cgroup v2 directory, or why there is none."""
    try:
        mount = parse_cgroup2_mount(mountinfo.read_text(errors="replace"))
        path = own_cgroup(proc_cgroup.read_text(errors="replace"))
    except OSError as exc:
        return f"cannot read {exc.filename}: {exc.strerror}"
    if mount is None:
        return "no cgroup v2 hierarchy is mounted"
    if path is None:
        return f"{proc_cgroup} names no cgroup v2 path"
    directory = _cgroup_dir(mount, path)
    return directory if directory is not None else f"cgroup {path} is outside the mount at {mount[0]}"


def _probe_cgroup(own: Path) -> tuple[Path | None, str]:
    """(the attempts' parent directory, "") when a child can be placed in a cgroup made
    below ``own``, else (None, why not)."""
    if not (own / "cgroup.procs").is_file():
        return None, f"{own} is not a cgroup v2 directory"
    parent = own / CGROUP_PARENT
    try:
        parent.mkdir(exist_ok=True)
        _remove_abandoned(parent)
        probe = AttemptCgroup.create(parent, "probe")
    except OSError as exc:
        return None, f"cannot create a cgroup under {own}: {exc.strerror or exc}"
    try:
        # Placement is what can still fail (a parent with controllers enabled takes no
        # processes below it under the no-internal-processes rule, or a subtree not delegated).
        subprocess.run([sys.executable, "-c", ""], preexec_fn=probe.preexec, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot place a process in a cgroup under {parent}: {exc}"
    finally:
        probe.close()
    return parent, ""


def _remove_abandoned(parent: Path) -> None:
    """Remove the empty attempt cgroups of processes that are gone (an emptied cgroup whose
    handle was dropped unsettled). One that still holds processes is refused by the kernel
    and kept: only the journal of the agent that made it says whose they are."""
    for entry in os.scandir(parent):
        owner = _CREATOR.search(entry.name)
        if owner is None or not entry.is_dir(follow_symlinks=False) or _alive(int(owner.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.rmdir(entry.path)


def _another_live_agent(pid: int) -> bool:
    """Whether ``pid`` is a live flashruntime process other than this one. A pid the kernel
    has given to another program since its agent died is not: its cgroups are leftovers."""
    if pid == os.getpid():
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)  # no /proc to read: a live pid may be the agent
    return b"flashruntime" in cmdline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _set_child_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


_detected: Containment | None = None
_detect_lock = threading.Lock()


def containment() -> Containment:
    """What contains this process's attempts, probed on first use and then kept (a
    subreaper, once set, stays set)."""
    global _detected
    with _detect_lock:
        if _detected is None:
            _detected = detect_containment()
        return _detected


def containment_in_force() -> str:
    """A short phrase for start-up lines: ``cgroup v2 (/sys/fs/cgroup/...)``, ``subreaper``
    or ``process group only``."""
    return containment().describe()


class AttemptContainer:
    """A container that holds nothing: the process group and the marker are all there is."""

    path: Path | None = None

    def describe(self) -> str:
        return "process group only"

    @property
    def preexec(self) -> Callable[[], None] | None:
        """What the child runs between fork and exec to enter the container (None: nothing)."""
        return None

    def started(self, pid: int) -> None:
        """The attempt's first process is ``pid``."""

    def members(self) -> set[int]:
        """The container's live processes now."""
        return set()

    def close(self) -> None:
        """SIGKILL whatever is still in the container, wait until it is empty, release it."""

    def release_if_empty(self) -> None:
        """Release the container if it holds nothing, signalling nobody (a handle dropped unsettled)."""


class AttemptCgroup(AttemptContainer):
    """One attempt's cgroup v2 directory."""

    _serial = itertools.count()

    def __init__(self, path: Path) -> None:
        self.path = path
        self._procs = os.fsencode(path / "cgroup.procs")
        self._closed = False

    def describe(self) -> str:
        return f"cgroup v2 ({self.path})"

    @classmethod
    def create(cls, parent: Path, name: str) -> AttemptCgroup:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120] or "attempt"
        path = parent / f"{safe}-{os.getpid()}-{next(cls._serial)}"
        path.mkdir()
        return cls(path)

    @property
    def preexec(self) -> Callable[[], None]:
        procs = self._procs

        def enter() -> None:
            # Between fork and exec: only raw system calls. "0" names the writing process.
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

        return enter

    def members(self) -> set[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return set()
        return {int(line) for line in text.split() if line.isdigit()}

    def populated(self) -> bool:
        try:
            events = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        except OSError:
            return bool(self.members())
        return "populated 1" in events.splitlines()

    def signal(self, sig: int) -> None:
        for pid in self.members():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def kill(self, *, use_cgroup_kill: bool = True) -> bool:
        """SIGKILL every member (``cgroup.kill`` where the kernel has it, else each pid until
        the cgroup reads empty); True once it is empty."""
        killed_at_once = False
        if use_cgroup_kill:
            try:
                fd = os.open(self.path / "cgroup.kill", os.O_WRONLY)
            except OSError:
                pass  # no cgroup.kill before Linux 5.14: each member is killed below
            else:
                try:
                    os.write(fd, b"1")
                    killed_at_once = True
                except OSError:
                    pass
                finally:
                    os.close(fd)
        deadline = time.monotonic() + _KILL_WAIT_S
        while self.populated():
            if time.monotonic() >= deadline:
                return False
            if not killed_at_once:
                self.signal(signal.SIGKILL)
            time.sleep(_POLL_S)
        return True

    def stop(self, grace_s: float) -> None:
        """SIGTERM every member, SIGKILL what is left after ``grace_s``, then release."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.populated() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        if self.kill():
            self._remove()

    def release_if_empty(self) -> None:
        """Remove the cgroup if nothing is in it, without signalling anyone."""
        if not self._closed and not self.populated():
            self._remove()

    def _remove(self) -> None:
        # An emptied cgroup can refuse removal for a moment while its last task is released.
        for _ in range(50):
            try:
                self.path.rmdir()
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
                time.sleep(_POLL_S)
                continue
            break
        self._closed = True


def end_leftover_cgroup(path: str | os.PathLike[str], grace_s: float, *,
                        own: Path | None = None) -> set[int]:
    """Stop an attempt cgroup an earlier agent recorded (``grace_s`` between SIGTERM and
    SIGKILL) and remove it; returns the pids it held. Only a directory named like the ones
    ``AttemptCgroup.create`` makes, directly under this process's own
    ``<cgroup>/flashruntime`` directory (``own``: that cgroup, found when None), is touched:
    a damaged journal must never name a cgroup that holds anyone else's processes, another
    agent's attempts on this machine included. An agent restarted in the same cgroup (the
    same service) finds what its predecessor left. One whose creator (the pid in its name)
    is another live flashruntime process is that agent's, and is left alone."""
    candidate = Path(os.path.realpath(path))
    if own is None:
        found = _own_cgroup_dir(Path("/proc/self/mountinfo"), Path("/proc/self/cgroup"))
        if not isinstance(found, Path):
            return set()
        own = found
    if (candidate.parent != Path(os.path.realpath(own / CGROUP_PARENT)) or not _NAME.fullmatch(candidate.name)
            or not (candidate / "cgroup.procs").is_file()):
        return set()
    creator = _CREATOR.search(candidate.name)
    if creator is None or _another_live_agent(int(creator.group(1))):
        return set()
    cgroup = AttemptCgroup(candidate)
    held = cgroup.members()
    cgroup.stop(grace_s)
    return held


_live_scopes: set[SubreaperScope] = set()  # this process's attempts started and not yet closed
_live_lock = threading.Lock()


class SubreaperScope(AttemptContainer):
    """An attempt's orphans, where this process is a child subreaper: its descendants in
    another session than its own (every process of an attempt is, the attempt's first one
    starting a session of its own), started no earlier than the attempt, and not known as
    another live attempt's (``known_elsewhere``). One attempt at a time gets all of them;
    with several at once an orphan is the first-ending attempt's unless another one knows it."""

    def __init__(self, known_elsewhere: Callable[[], set[int]] = set) -> None:
        self._known_elsewhere = known_elsewhere
        self._leader: int | None = None
        self._leader_start: int | None = None

    def describe(self) -> str:
        return "subreaper"

    def started(self, pid: int) -> None:
        self._leader = pid
        row = _proc_table().get(pid)
        self._leader_start = row.start if row is not None else None
        with _live_lock:
            _live_scopes.add(self)

    def members(self) -> set[int]:
        if self._leader is None or self._leader_start is None:
            return set()
        me = os.getpid()
        table = _proc_table()
        mine = table.get(me)
        if mine is None:
            return set()
        with _live_lock:
            other_leaders = {scope._leader for scope in _live_scopes if scope is not self} - {None}
        excluded = self._known_elsewhere()
        found: set[int] = set()
        for pid, row in table.items():
            if pid == me or pid in excluded or row.session == mine.session or row.start < self._leader_start:
                continue
            ancestry = _ancestry(pid, table)
            if me not in ancestry or ancestry & other_leaders or pid in other_leaders:
                continue
            if row.state in ("Z", "X"):
                if row.parent == me and pid != self._leader:
                    _reap(pid)  # an adopted orphan that ended: nobody else waits for it
                continue
            found.add(pid)
        return found

    def release_if_empty(self) -> None:
        with _live_lock:
            _live_scopes.discard(self)

    def close(self) -> None:
        deadline = time.monotonic() + _KILL_WAIT_S
        left = self.members()
        while left and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)
            left = self.members()
        with _live_lock:
            _live_scopes.discard(self)


@dataclasses.dataclass(frozen=True)
class _ProcRow:
    state: str
    parent: int
    session: int
    start: int  # clock ticks after boot


def _proc_table() -> dict[int, _ProcRow]:
    table: dict[int, _ProcRow] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read().decode(errors="replace")
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2:].split()  # comm may hold spaces and parentheses
        try:
            table[int(name)] = _ProcRow(rest[0], int(rest[1]), int(rest[3]), int(rest[19]))
        except (IndexError, ValueError):
            continue
    return table


def _ancestry(pid: int, table: dict[int, _ProcRow]) -> set[int]:
    seen: set[int] = set()
    current = table.get(pid)
    while current is not None and current.parent > 0 and current.parent not in seen:
        seen.add(current.parent)
        current = table.get(current.parent)
    return seen


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)

