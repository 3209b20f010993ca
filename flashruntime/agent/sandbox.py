"""Where a task's child runs: bubblewrap namespaces that keep the worker's credentials out of reach.

Two confinements, both built on ``bwrap``. The sandbox (``--runner sandboxed``): fresh mount,
pid, ipc, uts and (unless the job asks for the network) network namespaces, the whole
filesystem read-only but the task's own directories (``task_writable``), ``/tmp``, ``/run``
and ``/var`` emptied (``emptied_dirs``), the worker's work root and token file out of sight,
no capabilities. The light namespace (``--runner trusted``): the filesystem read-write and the host network as before, but a pid
namespace of its own (the worker's ``/proc`` entries are not there), the worker's token file
and other leases' directories out of sight, its lease directory read-only but for the task's
own directories, no capabilities. The argv builders are pure; ``probe_bwrap`` and
``prepare_task_dirs`` do the I/O.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flashruntime.agent.inputs import LeaseDirs, task_cwd
from flashruntime.errors import WorkerConfigError

__all__ = [
    "BwrapProbe",
    "Confinement",
    "TaskUser",
    "as_task_user",
    "confine",
    "emptied_dirs",
    "gpu_device_nodes",
    "namespace_argv",
    "network_requested",
    "prepare_task_dirs",
    "probe_bwrap",
    "python_paths",
    "resolve_task_user",
    "sandbox_argv",
    "task_given",
    "task_home",
    "task_tmp",
    "task_writable",
    "uncover_problem",
]

# What the sandbox is built from; the probe runs exactly these namespaces once at start.
_SANDBOX_NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts")
_COMMON = ("--die-with-parent", "--new-session")
_TMP = Path("/tmp")
# Emptied in the sandbox: /run and /var hold the host's unix sockets (a container engine's,
# D-Bus, a user session's under /run; kubelet's, LXD's, snapd's under /var/lib and /var/snap),
# which a read-only mount still lets a process connect to. /var/tmp comes back empty and
# world-writable, as programs expect it.
_SOCKET_DIRS = (Path("/run"), Path("/var"))
_VAR_TMP = Path("/var/tmp")
# Emptied too when the task itself is root (a root worker without --task-user): the homes of
# the machine's users, and the places where services, add-on software and mounted volumes keep
# their files and sockets, which root may read and connect to whatever their modes say.
_ROOT_TASK_HIDDEN = (Path("/root"), Path("/home"), Path("/srv"), Path("/opt"), Path("/mnt"), Path("/media"))
# A task switching to --task-user keeps only what setgid/setuid need; they go with the switch.
_USER_SWITCH_CAPS = ("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")
# Run inside the confinement when the task has its own user: groups, then gid, then uid,
# then exec the command. Isolated (-I) and without site (-S): nothing from the job's
# directories or environment is imported before the switch.
_SWITCH_USER = ("import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1])); "
                "os.execvp(sys.argv[3], sys.argv[3:])")


@dataclass(frozen=True)
class BwrapProbe:
    """Whether ``bwrap`` can build the sandbox on this machine, and why not when it cannot."""

    path: str | None
    works: bool
    reason: str


@dataclass(frozen=True)
class TaskUser:
    """The user a task runs as (``--task-user``), resolved once at start."""

    name: str
    uid: int
    gid: int


Mode = Literal["sandbox", "namespace", "none"]


@dataclass(frozen=True)
class Confinement:
    """How this worker confines every task it starts.

    ``mode``: "sandbox" (the full sandbox), "namespace" (the light one of ``--runner trusted``)
    or "none" (a plain child: bwrap missing, or a runner that does not ask for one).
    ``hidden``: files the task must not read (the worker's token file), masked by an empty file.
    ``readable``: paths the sandbox keeps readable although they lie under a place it hides
    (datasets given by ``--dataset``, the Python installation).
    ``worker_is_root``: with no ``task_user``, the sandbox's tasks run as root, so it also
    hides the users' homes (/root, /home) but for the ``readable`` paths."""

    mode: Mode
    work_root: Path
    bwrap: str | None = None
    hidden: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    devices: tuple[Path, ...] = ()
    task_user: TaskUser | None = None
    worker_is_root: bool = False

    def __post_init__(self) -> None:
        if self.mode != "none" and not self.bwrap:
            raise ValueError(f"confinement mode {self.mode!r} needs the bwrap executable's path")
        if self.mode == "sandbox":
            problem = uncover_problem(self.readable, root_task=self.task_user is None and self.worker_is_root)
            if problem is not None:
                raise WorkerConfigError(problem)


def task_home(dirs: LeaseDirs) -> Path:
    """The task's ``HOME``: inside its lease directory, never the worker's."""
    return dirs.root / "home"


def task_tmp(dirs: LeaseDirs) -> Path:
    """The task's ``TMPDIR``: inside its lease directory."""
    return dirs.root / "tmp"


def network_requested(payload: Mapping[str, Any]) -> bool:
    """Whether the job asked its sandboxed tasks to reach the network (``isolation.network``)."""
    isolation = payload.get("isolation")
    return isinstance(isolation, Mapping) and isolation.get("network") is True


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _hidden_masks(hidden: Iterable[Path]) -> list[str]:
    argv: list[str] = []
    for path in _unique(hidden):
        argv += ["--ro-bind", "/dev/null", str(path)]
    return argv


def _parent_dirs(path: Path, tmpfs: Sequence[Path]) -> list[str]:
    """``--dir`` for every directory above ``path`` that lies on one of the sandbox's ``tmpfs``
    mounts: bwrap would make them 0700, which a task user could not pass through."""
    argv: list[str] = []
    for parent in reversed(path.parents):
        if any(base in parent.parents for base in tmpfs):
            argv += ["--perms", "0755", "--dir", str(parent)]
    return argv


def _lease_binds(writable: Sequence[Path], work_root: Path, tmpfs: Sequence[Path] = (),
                 given: Sequence[Path] = ()) -> list[str]:
    """The work root replaced by an empty tmpfs, then what the worker ``given`` the task bound
    back read-only (the lease directory), and its ``writable`` directories over that."""
    argv = [*_parent_dirs(work_root, tmpfs), "--perms", "0755", "--tmpfs", str(work_root)]
    for path in _unique(given):
        argv += [*_parent_dirs(path, (*tmpfs, work_root)), "--ro-bind", str(path), str(path)]
    for path in _unique(writable):
        argv += [*_parent_dirs(path, (*tmpfs, work_root)), "--bind", str(path), str(path)]
    return argv


def task_writable(dirs: LeaseDirs) -> list[Path]:
    """What a task may write: its outputs, home, temp and checkpoint directories. The rest of
    the lease directory is read-only to it: the worker reads and uploads its log and telemetry
    there, which a task could otherwise swap for links to files only the worker may read."""
    return [dirs.out, task_home(dirs), task_tmp(dirs), dirs.ckpt]


def task_given(dirs: LeaseDirs) -> list[Path]:
    """What a task reads but may not change: its lease directory (inputs, ``spec.json``,
    ``inputs.json``, its own log)."""
    return [dirs.root]


def sandbox_argv(bwrap: str, argv: Sequence[str], *, work_root: Path, writable: Sequence[Path], cwd: Path,
                 given: Sequence[Path] = (), hidden: Sequence[Path] = (), readable: Sequence[Path] = (),
                 devices: Sequence[Path] = (), network: bool = False, switch_user: bool = False,
                 root_task: bool = False) -> list[str]:
    """The bwrap command line of the full sandbox around ``argv``. Later mounts cover earlier
    ones, so the order is: everything read-only, fresh /dev and /proc, ``emptied_dirs`` (for a
    ``root_task`` the users' homes and the service directories too), the ``readable`` paths under them bound
    back, the work root emptied and the lease's ``writable`` directories bound back into it,
    the ``hidden`` files masked last."""
    command = [bwrap, *_COMMON, *_SANDBOX_NAMESPACES]
    if not network:
        command.append("--unshare-net")
    command += ["--cap-drop", "ALL", *(_USER_SWITCH_CAPS if switch_user else ())]
    # The fresh /dev's shm is root's 0755: a task user's shared memory (DataLoader workers) needs 1777.
    command += ["--ro-bind", "/", "/", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    for device in _unique(devices):
        command += ["--dev-bind", str(device), str(device)]
    emptied = emptied_dirs(root_task=root_task)
    command += ["--proc", "/proc"]
    for directory in emptied:
        command += ["--perms", "0755", "--tmpfs", str(directory)]
    if _VAR_TMP.parent in emptied:
        command += ["--perms", "1777", "--dir", str(_VAR_TMP)]
    if network:  # the resolver's configuration may live under /run (systemd-resolved)
        readable = [*readable, *_resolver_files()]
    for path in _unique(readable):
        if any(base in path.parents or base == path for base in emptied):  # elsewhere the read-only root shows it
            command += [*_parent_dirs(path, emptied), "--ro-bind", str(path), str(path)]
    command += _lease_binds(writable, work_root, tuple(emptied), given)
    command += _hidden_masks(hidden)
    command += ["--chdir", str(cwd), "--", *argv]
    return command


def emptied_dirs(*, root_task: bool = False) -> list[Path]:
    """The directories the sandbox replaces by an empty tmpfs (those of them that exist here as
    directories of their own): /tmp, /run and /var always, and for a ``root_task`` the homes and
    the service, add-on and mount directories as well."""
    return [_TMP, *_real_dirs(_SOCKET_DIRS), *(_real_dirs(_ROOT_TASK_HIDDEN) if root_task else ())]


def _real_dirs(paths: Iterable[Path]) -> list[Path]:
    """Those of ``paths`` that are directories of their own, not links to one."""
    return [path for path in paths if path.is_dir() and not path.is_symlink()]


def uncover_problem(readable: Iterable[Path], *, root_task: bool = False) -> str | None:
    """Why ``readable`` would undo the sandbox, or None: a path bound back that is one of the
    emptied directories, or holds one, shows all of it again."""
    emptied = emptied_dirs(root_task=root_task)
    for path in _unique(readable):
        resolved = Path(os.path.realpath(path))
        for directory in emptied:
            if resolved == directory or resolved in directory.parents:
                return (f"{path} is readable in the sandbox, but the sandbox empties {directory} (it holds the "
                        f"host's sockets and other users' files): name the directory inside {directory} that the "
                        "tasks need instead")
    return None


def _resolver_files() -> list[Path]:
    """/etc/resolv.conf as the file it resolves to, when that is not under /etc itself."""
    target = Path("/etc/resolv.conf").resolve()
    return [target] if target.is_file() and Path("/etc") not in target.parents else []


def namespace_argv(bwrap: str, argv: Sequence[str], *, work_root: Path, writable: Sequence[Path], cwd: Path,
                   given: Sequence[Path] = (), hidden: Sequence[Path] = (), switch_user: bool = False) -> list[str]:
    """The bwrap command line of the light namespace (``--runner trusted``): the filesystem,
    devices and network shared as they are, but a pid namespace with its own /proc, no
    capabilities, the work root but this lease's directories and the ``hidden`` files masked."""
    command = [bwrap, *_COMMON, "--unshare-pid", "--cap-drop", "ALL", *(_USER_SWITCH_CAPS if switch_user else ())]
    command += ["--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    command += _lease_binds(writable, work_root, (), given)
    command += _hidden_masks(hidden)
    command += ["--chdir", str(cwd), "--", *argv]
    return command


def as_task_user(argv: Sequence[str], user: TaskUser, python: str = sys.executable) -> list[str]:
    """``argv`` started after switching to ``user`` (groups cleared, then gid, then uid)."""
    return [python, "-I", "-S", "-c", _SWITCH_USER, str(user.uid), str(user.gid), *argv]


def confine(argv: Sequence[str], dirs: LeaseDirs, payload: Mapping[str, Any], confinement: Confinement) -> list[str]:
    """The final argv of a task: ``argv`` as the task user when there is one, inside the
    confinement's namespaces when it has any."""
    command = list(argv)
    user = confinement.task_user
    if user is not None:
        command = as_task_user(command, user)
    writable, given = task_writable(dirs), task_given(dirs)
    bwrap = confinement.bwrap or ""  # never empty in these modes: see Confinement.__post_init__
    if confinement.mode == "sandbox":
        return sandbox_argv(bwrap, command, work_root=confinement.work_root, writable=writable, given=given,
                            cwd=task_cwd(payload, dirs), hidden=confinement.hidden, readable=confinement.readable,
                            devices=confinement.devices, network=network_requested(payload),
                            switch_user=user is not None, root_task=user is None and confinement.worker_is_root)
    if confinement.mode == "namespace":
        return namespace_argv(bwrap, command, work_root=confinement.work_root, writable=writable, given=given,
                              cwd=task_cwd(payload, dirs), hidden=confinement.hidden, switch_user=user is not None)
    return command


def prepare_task_dirs(dirs: LeaseDirs, user: TaskUser | None = None, work_root: Path | None = None) -> None:
    """Create the task's home, temp and checkpoint directories; with a task user, hand it the
    directories it may write (``task_writable``) and let it pass through the directories from
    ``work_root`` down to them (traverse, not list). The lease directory stays the worker's."""
    for path in (task_home(dirs), task_tmp(dirs), dirs.ckpt):
        path.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    work_root = dirs.ckpt.parent.parent if work_root is None else work_root
    for directory in (work_root, *_between(work_root, dirs.root), dirs.root):
        mode = directory.stat().st_mode
        if not mode & 0o001:
            directory.chmod((mode & 0o7777) | 0o001)
    for top in task_writable(dirs):
        os.chown(top, user.uid, user.gid)
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (*dirnames, *filenames):
                _hand_over(os.path.join(dirpath, name), user)


def _hand_over(path: str, user: TaskUser) -> None:
    """Give one entry of a task's directories to its user; never through a link. A file
    with more than one hard link may be another name of a file outside the lease (an
    earlier attempt could make one), so it keeps its owner."""
    status = os.lstat(path)
    if (status.st_uid, status.st_gid) == (user.uid, user.gid):
        return
    if not stat.S_ISDIR(status.st_mode) and status.st_nlink > 1:
        return
    os.chown(path, user.uid, user.gid, follow_symlinks=False)


def _between(root: Path, leaf: Path) -> list[Path]:
    """The directories strictly between ``root`` and ``leaf``."""
    parents = []
    for parent in leaf.parents:
        if parent == root:
            break
        parents.append(parent)
    return list(reversed(parents))


def resolve_task_user(name: str, *, euid: int | None = None) -> TaskUser:
    """``--task-user NAME`` as a ``TaskUser``; ``ValueError`` when the worker is not root or
    the user does not exist."""
    import pwd

    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise ValueError(f"--task-user {name!r} needs a worker running as root (this one runs as uid {euid}); "
                         "start the worker as root, or leave --task-user out and run the worker itself as the "
                         "user its tasks should have")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"--task-user {name!r}: no such user on this machine; create it (e.g. useradd "
                         f"--system {name}) or name an existing one") from None
    if entry.pw_uid == 0:
        raise ValueError(f"--task-user {name!r} is root (uid 0), which gives tasks the worker's own user; name an "
                         "unprivileged user")
    return TaskUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def gpu_device_nodes(pattern: str = "/dev/nvidia*") -> tuple[Path, ...]:
    """The NVIDIA device nodes of this machine (the sandbox's fresh /dev has none)."""
    return tuple(Path(path) for path in sorted(glob.glob(pattern)))


def python_paths(environ: Mapping[str, str] = os.environ) -> tuple[Path, ...]:
    """The Python installation the worker runs from (prefixes, site-packages, ``PYTHONPATH``): a
    sandboxed module task runs the same interpreter and must see it even when it lies under /tmp."""
    import site

    extra = [Path(entry) for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    found = [Path(sys.prefix), Path(sys.base_prefix), *map(Path, site.getsitepackages()), *extra]
    return tuple(path for path in _unique(found) if path.is_absolute() and path.exists())


def probe_bwrap(executable: str | None = None, *, timeout_s: float = 15.0) -> BwrapProbe:
    """Try the sandbox's namespaces once (``bwrap ... true``): unprivileged user namespaces may
    be off, or bwrap missing. Never raises."""
    path = executable or shutil.which("bwrap")
    if path:  # a relative PATH entry must not let the task's working directory choose the launcher
        path = os.path.abspath(path)
    if not path:
        return BwrapProbe(None, False, "bwrap (bubblewrap) is not installed; install it (Debian/Ubuntu: "
                                       "apt-get install bubblewrap) to sandbox tasks")
    probe = [path, *_COMMON, *_SANDBOX_NAMESPACES, "--unshare-net", "--cap-drop", "ALL", "--ro-bind", "/", "/",
             "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/tmp/probe", "--",
             "true"]
    try:
        result = subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return BwrapProbe(path, False, f"{path} could not be run: {exc}")
    if result.returncode != 0:
        said = result.stdout.decode("utf-8", "replace").strip().splitlines()
        detail = said[-1] if said else f"exit {result.returncode}"
        return BwrapProbe(path, False, f"{path} cannot create namespaces here ({detail}); unprivileged user "
                                       "namespaces may be disabled (sysctl kernel.unprivileged_userns_clone)")
    return BwrapProbe(path, True, f"{path} creates the sandbox's namespaces here")
