"""The bubblewrap sandbox around a real task: the argv ``build_command`` returns, with the
environment ``child_env`` builds, run as the worker runs it. No network unless the job asks,
nothing written outside the lease's directories, a task user that is who it says, and a
gloo job on loopback that still works inside."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.inputs import lease_dirs, write_spec
from flashruntime.agent.sandbox import Confinement, probe_bwrap, python_paths, resolve_task_user
from flashruntime.agent.task_command import build_command, child_env
from flashruntime.errors import WorkerConfigError
from flashruntime.protocol.v1alpha1 import Lease

BWRAP = probe_bwrap()
pytestmark = pytest.mark.skipif(not BWRAP.works, reason=f"bubblewrap does not work here: {BWRAP.reason}")
GRANTED = {"role": "submitter", "name": "alice", "may_run_code": True}


def run_task(tmp_path: Path, code: str, *, mode: str = "sandbox", network: bool = False, user: Any = None,
             hidden: tuple[Path, ...] = (), timeout: float = 120,
             work: Path | None = None, argv: list[str] | None = None) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``python -c code`` (or ``argv``) as a sandboxed-tier command in a fresh lease of
    ``work`` (default ``tmp_path/work``)."""
    work = tmp_path / "work" if work is None else work
    dirs = lease_dirs(work, "job-1", "task-000", "ls-1")
    payload = {"argv": argv or [sys.executable, "-c", code], "env": {"MINE": "1"}, "submitted_by": GRANTED,
               "isolation": {"tier": "sandboxed", **({"network": True} if network else {})}}
    confinement = Confinement(mode, work, BWRAP.path, hidden=hidden, readable=python_paths(),  # type: ignore[arg-type]
                              task_user=user)
    argv, env = build_command(payload, "sandboxed" if mode == "sandbox" else "trusted", dirs,
                              require_code_grant=True, confinement=confinement)
    write_spec(dirs, "task-000", {}, {})
    lease = Lease(lease_id="ls-1", job_id="job-1", task_id="task-000", node_id="n", payload=payload,
                  attempt_number=1, deadline=datetime(2030, 1, 1, tzinfo=timezone.utc))
    result = subprocess.run(argv, cwd=dirs.root, env=child_env(env, dirs, lease), stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=timeout, check=False)
    return result, dirs


CONNECT = """
import json, os, socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else {port}), timeout=5).close()
    reached = True
except OSError as exc:
    reached = type(exc).__name__
json.dump({{"reached": reached}}, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


@pytest.fixture
def listener() -> Any:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    yield server
    server.close()


def test_a_sandboxed_task_cannot_reach_the_host_network(tmp_path: Path, listener: socket.socket) -> None:
    result, dirs = run_task(tmp_path, CONNECT.format(port=listener.getsockname()[1]))
    assert result.returncode == 0, result.stderr
    assert json.loads((dirs.out / "metrics.json").read_text()) == {"reached": "ConnectionRefusedError"}


def test_a_job_that_asks_for_the_network_reaches_it(tmp_path: Path, listener: socket.socket) -> None:
    result, dirs = run_task(tmp_path, CONNECT.format(port=listener.getsockname()[1]), network=True)
    assert result.returncode == 0, result.stderr
    assert json.loads((dirs.out / "metrics.json").read_text()) == {"reached": True}


WRITES = """
import errno, json, os, sys
out = os.environ["FLASHML_OUTPUT_DIR"]
results = {}
for target in sys.argv[1:] + [os.path.join(os.environ["HOME"], "h"), os.path.join(os.environ["TMPDIR"], "t"),
                              os.path.join(os.environ["FLASHML_CKPT_DIR"], "c"), os.path.join(out, "o")]:
    try:
        open(target, "w").write("x")
        results[target] = "written"
    except OSError as exc:
        results[target] = errno.errorcode.get(exc.errno, str(exc))
json.dump(results, open(os.path.join(out, "metrics.json"), "w"))
"""


def test_a_sandboxed_task_writes_only_inside_its_lease(tmp_path: Path) -> None:
    beside = tmp_path / "beside"  # under /tmp: the sandbox's /tmp is its own
    var_tmp = Path("/var/tmp") / f"flashruntime-sandbox-{os.getpid()}"  # the sandbox's /var/tmp is its own too
    disk = Path.home() / f"flashruntime-sandbox-{os.getpid()}"  # read-only in the sandbox
    other_lease = tmp_path / "work" / "job-0" / "task-000" / "ls-0" / "out"
    other_lease.mkdir(parents=True)
    outside = (str(beside), str(var_tmp), str(disk), str(other_lease / "x"))
    try:
        code = WRITES.replace("sys.argv[1:]", repr(list(outside)))
        result, dirs = run_task(tmp_path, code)
        assert result.returncode == 0, result.stderr
        written = json.loads((dirs.out / "metrics.json").read_text())
        assert written[str(disk)] == "EROFS"
        assert written[str(other_lease / "x")] == "ENOENT"  # the work root is empty but for this lease
        assert written[str(beside)] == written[str(var_tmp)] == "written"  # in the sandbox's own, emptied ones
        assert not any(Path(path).exists() for path in (beside, var_tmp, disk, other_lease / "x"))
        inside = {key: value for key, value in written.items() if key not in outside}
        assert set(inside.values()) == {"written"}
        for target in inside:
            assert Path(target).read_text() == "x"  # on the host: the lease's directories are the real ones
    finally:
        disk.unlink(missing_ok=True)
        var_tmp.unlink(missing_ok=True)


UNIX_CONNECT = """
import json, os, socket, sys
found = {}
for path in sys.argv[1:]:
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(path)
        found[path] = "connected"
    except OSError as exc:
        found[path] = type(exc).__name__
    finally:
        client.close()
json.dump(found, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


def _listening(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    return server


@pytest.mark.parametrize("where", ["/run", "/var/lib", "/var/snap"])
def test_a_sandboxed_task_cannot_reach_the_host_s_unix_sockets(tmp_path: Path, where: str) -> None:
    # A container engine's socket (/run/docker.sock), kubelet's (/var/lib/kubelet/...) or LXD's
    # (/var/snap/lxd/...) is root on the host, or near it, to whoever connects.
    service = Path(where) / f"flashruntime-test-{os.getpid()}"
    engine = service / "api.sock"
    server = _listening(engine)
    try:
        result, dirs = run_task(tmp_path, "", argv=[sys.executable, "-c", UNIX_CONNECT, str(engine)])
        assert result.returncode == 0, result.stderr
        assert json.loads((dirs.out / "metrics.json").read_text()) == {str(engine): "FileNotFoundError"}
    finally:
        server.close()
        shutil.rmtree(service)


def test_a_readable_path_that_would_show_an_emptied_directory_again_is_refused(tmp_path: Path) -> None:
    for readable in (Path("/var"), Path("/")):
        with pytest.raises(WorkerConfigError, match=r"the sandbox empties /(var|tmp|run)"):
            Confinement("sandbox", tmp_path, BWRAP.path, readable=(*python_paths(), readable))
    Confinement("sandbox", tmp_path, BWRAP.path, readable=(*python_paths(), Path("/var/lib/datasets")))


@pytest.mark.skipif(os.geteuid() != 0, reason="a root task exists only under a root worker")
def test_a_root_task_sees_no_home_of_the_machine_s_users_and_no_service_s_socket(tmp_path: Path) -> None:
    secret = Path("/root") / f"flashruntime-test-{os.getpid()}.secret"
    secret.write_text("root's own")
    secret.chmod(0o600)
    services = [Path(top) / f"flashruntime-test-{os.getpid()}" for top in ("/srv", "/opt")]
    servers = [_listening(service / "api.sock") for service in services]
    try:
        code = ("import json, os, socket, sys\ntry:\n    seen = open(sys.argv[1]).read()\nexcept OSError as exc:\n"
                "    seen = type(exc).__name__\n"
                "sockets = []\nfor path in sys.argv[2:]:\n    try:\n        socket.socket(socket.AF_UNIX).connect(path)\n"
                "        sockets.append('connected')\n    except OSError as exc:\n"
                "        sockets.append(type(exc).__name__)\n"
                f"json.dump({{'seen': seen, 'sockets': sockets, "
                f"'python': sys.version_info[:2] == {tuple(sys.version_info[:2])}}}, "
                "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")
        work = tmp_path / "work"
        dirs = lease_dirs(work, "job-1", "task-000", "ls-1")
        payload = {"argv": [sys.executable, "-c", code, str(secret), *(str(service / "api.sock") for service in services)],
                   "submitted_by": GRANTED,
                   "isolation": {"tier": "sandboxed"}}
        confinement = Confinement("sandbox", work, BWRAP.path, readable=python_paths(), worker_is_root=True)
        argv, env = build_command(payload, "sandboxed", dirs, confinement=confinement)
        write_spec(dirs, "task-000", {}, {})
        lease = Lease(lease_id="ls-1", job_id="job-1", task_id="task-000", node_id="n", payload=payload,
                      attempt_number=1, deadline=datetime(2030, 1, 1, tzinfo=timezone.utc))
        result = subprocess.run(argv, cwd=dirs.root, env=child_env(env, dirs, lease), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        # The worker's Python (here under /root) is bound back; root's other files are not there.
        assert json.loads((dirs.out / "metrics.json").read_text()) == {
            "seen": "FileNotFoundError", "sockets": ["FileNotFoundError"] * 2, "python": True}
    finally:
        secret.unlink()
        for server, service in zip(servers, services):
            server.close()
            shutil.rmtree(service)


def test_the_trusted_runner_s_namespace_masks_the_token_file_and_hides_the_worker(tmp_path: Path) -> None:
    token = tmp_path / "secrets" / "token"
    token.parent.mkdir()
    token.write_text("node-secret")
    token.chmod(0o600)
    code = f"""
import json, os
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
try:
    data = open({str(token)!r}, 'rb').read().decode(errors='replace')
except OSError as exc:
    data = type(exc).__name__
json.dump(dict(pids=pids, token=data), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))
"""
    result, dirs = run_task(tmp_path, code, mode="namespace", hidden=(token,))
    assert result.returncode == 0, result.stderr
    seen = json.loads((dirs.out / "metrics.json").read_text())
    assert "node-secret" not in json.dumps(seen) and seen["token"] in ("", "PermissionError")
    assert os.getpid() not in seen["pids"] and max(seen["pids"]) < 10  # its own pid namespace


@pytest.fixture
def task_user() -> Any:
    """A user created for the test (root and useradd needed), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creating a task user needs root and useradd")
    name = f"flt{os.getpid() % 100000}"
    created = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                             capture_output=True, text=True, check=False)
    if created.returncode != 0:
        pytest.skip(f"useradd failed: {created.stderr.strip()}")
    try:
        yield resolve_task_user(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


# A shell, not the worker's Python: that one may lie where only the worker's user can read it.
IDENTITY = ["/bin/sh", "-c", ('echo shared > /dev/shm/flashruntime-test && '
                              'printf \'{"uid": %s, "euid": %s, "gid": %s, "groups": "%s"}\' "$(id -ru)" "$(id -u)" '
                              '"$(id -g)" "$(id -G)" > "$FLASHML_OUTPUT_DIR/metrics.json"')]


@pytest.mark.parametrize("mode", ["sandbox", "namespace", "none"])
def test_a_task_runs_as_the_task_user_in_directories_handed_to_it(tmp_path: Path, task_user: Any,
                                                                         mode: str) -> None:
    # The worker's default work root is a new directory in /tmp; pytest's own are private to root.
    work = Path(tempfile.mkdtemp(prefix="flashruntime-worker-", dir="/var/tmp"))
    try:
        result, dirs = run_task(tmp_path, "", mode=mode, user=task_user, work=work, argv=IDENTITY)
        assert result.returncode == 0, result.stderr
        seen = json.loads((dirs.out / "metrics.json").read_text())
        # No supplementary groups: id -G names the primary group alone.
        assert seen == {"uid": task_user.uid, "euid": task_user.uid, "gid": task_user.gid,
                        "groups": str(task_user.gid)}
        assert (dirs.out / "metrics.json").stat().st_uid == task_user.uid
        assert pwd.getpwuid(dirs.out.stat().st_uid).pw_name == task_user.name
        assert dirs.root.stat().st_uid == 0  # the lease directory, with the log the worker reads, stays root's
    finally:
        shutil.rmtree(work, ignore_errors=True)
        Path("/dev/shm/flashruntime-test").unlink(missing_ok=True)  # the host's, outside the sandbox


GLOO = """
import json, os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank(index, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=2)
    value = torch.tensor([float(index + 1)])
    dist.all_reduce(value)
    if index == 0:
        json.dump({"sum": value.item()}, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(rank, args=(port,), nprocs=2, start_method="fork")
"""


@pytest.mark.torch
def test_a_gloo_job_on_loopback_works_inside_the_sandbox(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result, dirs = run_task(tmp_path, GLOO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((dirs.out / "metrics.json").read_text()) == {"sum": 3.0}
