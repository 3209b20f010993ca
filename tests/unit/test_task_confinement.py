"""What a task gets of the worker: its environment (``child_env``), its command line inside
bubblewrap (``sandbox_argv``, ``namespace_argv``, ``build_command``), and the worker's own
credential handling (token file, task user, runner choice, registration)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.inputs import LeaseDirs
from flashruntime.agent.node_token import forget_token_environment, read_token_file
from flashruntime.agent.sandbox import (
    BwrapProbe,
    Confinement,
    TaskUser,
    namespace_argv,
    network_requested,
    prepare_task_dirs,
    resolve_task_user,
    sandbox_argv,
)
from flashruntime.agent.task_command import build_command, child_env, is_credential_name, is_loader_name
from flashruntime.agent.worker import WorkerAgent
from flashruntime.agent.worker_cli import build_parser, default_runner, resolve_token
from flashruntime.errors import TaskRefused, WorkerConfigError
from flashruntime.protocol.v1alpha1 import Lease
from flashruntime.scheduler.gates import gate_argv

WORKS = BwrapProbe("/usr/bin/bwrap", True, "probed")
BROKEN = BwrapProbe("/usr/bin/bwrap", False, "user namespaces are off")
GRANTED = {"role": "submitter", "name": "alice", "may_run_code": True}


def dirs_in(tmp_path: Path) -> LeaseDirs:
    root = tmp_path / "work" / "job-1" / "task-000" / "ls-1"
    (root / "out").mkdir(parents=True)
    (root / "inputs").mkdir()
    return LeaseDirs(root=root, ckpt=root.parent / "ckpt")


def lease() -> Lease:
    return Lease(lease_id="ls-1", job_id="job-1", task_id="task-000", node_id="box-1", payload={}, attempt_number=1,
                 deadline=datetime(2030, 1, 1, tzinfo=timezone.utc))


def argv_payload(tier: str = "sandboxed", **extra: Any) -> dict[str, Any]:
    return {"argv": ["python", "train.py"], "env": {}, "isolation": {"tier": tier}, "submitted_by": GRANTED, **extra}


# --- the task's environment -----------------------------------------------------------


def test_a_task_environment_takes_only_the_allowlist_from_the_worker(tmp_path: Path) -> None:
    dirs = dirs_in(tmp_path)
    worker_env = {
        "PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "TERM": "xterm",
        "CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all",
        "FLASHML_NODE_TOKEN": "node-secret", "FLASHML_NODE_TOKEN_FILE": "/etc/flash/token",
        "FLASHML_TOKEN": "client-secret", "FLASHML_JOIN_CODE": "join-secret",
        "FLASHML_SUBMITTER_TOKENS": "alice:secret", "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "HOME": "/root", "TMPDIR": "/tmp", "PYTHONPATH": "/opt/tasks", "SSH_AUTH_SOCK": "/run/ssh",
    }
    env = child_env({}, dirs, lease(), worker_env)
    assert "secret" not in " ".join(env.values())
    assert {name: env[name] for name in ("PATH", "LANG", "LC_ALL", "TZ", "TERM", "CUDA_VISIBLE_DEVICES",
                                         "NVIDIA_VISIBLE_DEVICES")} == {
        "PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "TERM": "xterm",
        "CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}
    assert env["HOME"] == str(dirs.root / "home") and env["TMPDIR"] == str(dirs.root / "tmp")
    assert env["PYTHONPATH"] == "/opt/tasks"  # where the worker's Python finds the task modules
    assert not {"SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY"} & set(env)
    assert env["FLASHML_OUTPUT_DIR"] == str(dirs.out) and env["FLASHML_CKPT_DIR"] == str(dirs.ckpt)
    assert (env["FLASHML_JOB_ID"], env["FLASHML_TASK_ID"], env["FLASHML_ATTEMPT_ID"]) == ("job-1", "task-000", "ls-1")
    assert env["FLASHML_INPUTS_FILE"] == str(dirs.inputs_file)


def test_the_contract_variables_win_over_the_job_env_and_no_credential_name_survives(tmp_path: Path) -> None:
    dirs = dirs_in(tmp_path)
    env = child_env({"FLASHML_OUTPUT_DIR": "/elsewhere", "FLASHML_JOB_ID": "other", "LR": "0.1", "HOME": "/mine",
                     "FLASHML_NODE_TOKEN": "planted"}, dirs, lease(), {})
    assert env["FLASHML_OUTPUT_DIR"] == str(dirs.out) and env["FLASHML_JOB_ID"] == "job-1"
    assert env["LR"] == "0.1" and env["HOME"] == "/mine"  # the job's own variables are its own
    assert "FLASHML_NODE_TOKEN" not in env
    assert env["PATH"] == os.defpath  # a worker without PATH still gives its tasks one


@pytest.mark.parametrize("name", ["FLASHML_NODE_TOKEN", "FLASHML_TOKEN", "FLASHML_NODE_TOKEN_FILE",
                                  "FLASHML_JOIN_CODE", "FLASHML_NODE_TOKENS", "FLASHML_OPERATOR_TOKENS",
                                  "FLASHML_SUBMITTER_TOKENS"])
def test_credential_names(name: str) -> None:
    assert is_credential_name(name)


@pytest.mark.parametrize("name", ["PATH", "FLASHML_OUTPUT_DIR", "TOKENIZERS_PARALLELISM", "HF_TOKEN_PATH_HINT"])
def test_names_that_are_no_credential_of_ours(name: str) -> None:
    assert not is_credential_name(name)


def test_a_job_that_sets_a_credential_name_is_refused_with_the_name(tmp_path: Path) -> None:
    payload = argv_payload(env={"FLASHML_NODE_TOKEN": "x", "LR": "1"})
    with pytest.raises(TaskRefused, match=r"payload env sets FLASHML_NODE_TOKEN, a credential name .* another name"):
        build_command(payload, "trusted", dirs_in(tmp_path))


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES",
                                  "MALLOC_CHECK_", "LOCPATH"])
def test_a_job_that_sets_a_loader_variable_is_refused_with_the_fix(tmp_path: Path, name: str) -> None:
    # bwrap and the task-user switch run with the job's env before the task is confined.
    payload = argv_payload(env={name: "inputs/evil.so", "LR": "1"})
    with pytest.raises(TaskRefused, match=rf"payload env sets {name}, which the C library's loader acts on .*"
                                          r"argv \['env', 'NAME=value'"):
        build_command(payload, "trusted", dirs_in(tmp_path))


@pytest.mark.parametrize("name", ["LR", "TMPDIR", "OLD_PRELOAD", "CUDA_LAUNCH_BLOCKING"])
def test_names_the_loader_does_not_act_on(name: str) -> None:
    assert not is_loader_name(name)


# --- which runner runs what -------------------------------------------------------------


def sandbox(tmp_path: Path, **extra: Any) -> Confinement:
    return Confinement("sandbox", tmp_path / "work", "/usr/bin/bwrap", **extra)


def test_the_sandboxed_runner_runs_sandboxed_tier_commands_inside_bwrap(tmp_path: Path) -> None:
    dirs = dirs_in(tmp_path)
    argv, _ = build_command(argv_payload(), "sandboxed", dirs, require_code_grant=True,
                            confinement=sandbox(tmp_path))
    assert argv[0] == "/usr/bin/bwrap" and argv[-3:] == ["--", "python", "train.py"]
    assert "--unshare-net" in argv
    assert (dirs.root / "home").is_dir() and (dirs.root / "tmp").is_dir() and dirs.ckpt.is_dir()
    text = " ".join(argv)
    read_only = text.index(f"--ro-bind {dirs.root} {dirs.root}")  # its log and telemetry stay the worker's
    for writable in (dirs.out, dirs.root / "home", dirs.root / "tmp", dirs.ckpt):
        assert text.index(f"--bind {writable} {writable}") > read_only
    assert f" --bind {dirs.root} " not in text


def test_the_sandboxed_runner_refuses_a_command_of_another_tier(tmp_path: Path) -> None:
    with pytest.raises(TaskRefused, match=r"tier 'standard' run only on an agent started with --runner trusted"):
        build_command(argv_payload("standard"), "sandboxed", dirs_in(tmp_path), confinement=sandbox(tmp_path))


def test_the_sandboxed_runner_without_a_sandbox_runs_no_command(tmp_path: Path) -> None:
    with pytest.raises(TaskRefused, match=r"no working sandbox"):
        build_command(argv_payload(), "sandboxed", dirs_in(tmp_path),
                      confinement=Confinement("none", tmp_path / "work"))


def test_the_subprocess_runner_names_both_runners_that_run_commands(tmp_path: Path) -> None:
    with pytest.raises(TaskRefused, match=r"--runner sandboxed \(tier 'sandboxed'\) or --runner trusted"):
        build_command(argv_payload(), "subprocess", dirs_in(tmp_path))


def test_a_module_task_runs_in_the_sandbox_too(tmp_path: Path) -> None:
    dirs = dirs_in(tmp_path)
    argv, env = build_command({"module": "flashml_workloads.sgd_trainer"}, "sandboxed", dirs,
                              confinement=sandbox(tmp_path))
    assert argv[0] == "/usr/bin/bwrap" and env == {}
    assert argv[argv.index("--") + 1:] == [sys.executable, "-m", "flashml_workloads.sgd_trainer", "--spec",
                                           str(dirs.spec_file), "--out", str(dirs.out)]


def test_the_job_asks_for_the_network_in_its_isolation() -> None:
    assert network_requested({"isolation": {"tier": "sandboxed", "network": True}})
    assert not network_requested({"isolation": {"tier": "sandboxed", "network": "yes"}})
    assert not network_requested({"isolation": {"tier": "sandboxed"}})
    assert not network_requested({})


def test_a_sandboxed_command_is_placed_on_a_sandbox_capable_node() -> None:
    sandboxed = {"argv": ["x"], "isolation": {"tier": "sandboxed", "allowFallback": False}}
    assert gate_argv(sandboxed, {"node_id": "n", "sandbox_capable": True})
    assert not gate_argv(sandboxed, {"node_id": "n", "sandbox_capable": "true"})
    assert not gate_argv({**sandboxed, "isolation": {"tier": "standard"}}, {"node_id": "n", "sandbox_capable": True})
    assert not gate_argv(sandboxed, {"node_id": "n"})


# --- the bwrap command lines --------------------------------------------------------------


def test_the_sandbox_argv_mounts_in_an_order_where_the_lease_and_masks_come_last(tmp_path: Path) -> None:
    work, lease_root, ckpt = Path("/srv/work"), Path("/srv/work/j/t/ls"), Path("/srv/work/j/t/ckpt")
    argv = sandbox_argv("bwrap", ["python", "x.py"], work_root=work, writable=[lease_root / "out", ckpt], cwd=lease_root,
                        given=[lease_root], hidden=[Path("/etc/flash/token")],
                        readable=[Path("/tmp/venv"), Path("/data/set")],
                        devices=[Path("/dev/nvidia0"), Path("/dev/nvidiactl")])
    assert argv[0] == "bwrap"
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                 "--new-session"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL" and "--cap-add" not in argv
    text = " ".join(argv)
    order = ["--ro-bind / /", "--dev /dev", "--dev-bind /dev/nvidia0 /dev/nvidia0", "--proc /proc", "--tmpfs /tmp",
             "--ro-bind /tmp/venv /tmp/venv", f"--tmpfs {work}", f"--ro-bind {lease_root} {lease_root}",
             f"--bind {lease_root}/out {lease_root}/out", f"--bind {ckpt} {ckpt}",
             "--ro-bind /dev/null /etc/flash/token", f"--chdir {lease_root}", "-- python x.py"]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions), text
    assert "/data/set" not in text  # outside /tmp, the read-only root shows it already
    # Directories bwrap makes on its tmpfs mounts on the way to a bind are 0755, for a task user.
    assert "--perms 0755 --dir /srv/work/j --perms 0755 --dir /srv/work/j/t --ro-bind /srv/work/j/t/ls" in text
    assert text.endswith("-- python x.py")


def test_the_sandbox_empties_run_and_for_a_root_task_the_homes_but_for_what_it_must_read() -> None:
    common = {"work_root": Path("/w"), "writable": [Path("/w/l")], "cwd": Path("/w/l"),
              "readable": [Path("/root/.pyenv/versions/3.11"), Path("/usr/lib/python3")]}
    text = " ".join(sandbox_argv("bwrap", ["true"], **common))  # type: ignore[arg-type]
    assert "--tmpfs /run" in text and "--tmpfs /root" not in text and "--tmpfs /home" not in text
    assert "--tmpfs /var/run" not in text or not Path("/var/run").is_symlink()
    root = " ".join(sandbox_argv("bwrap", ["true"], root_task=True, **common))  # type: ignore[arg-type]
    assert root.index("--tmpfs /run") < root.index("--tmpfs /root") < root.index(
        "--ro-bind /root/.pyenv/versions/3.11 /root/.pyenv/versions/3.11")
    assert "--tmpfs /home" in root and "--ro-bind /usr/lib/python3" not in root  # the read-only root shows it


def test_the_sandbox_keeps_the_network_when_the_job_asks_and_lets_a_task_user_switch(tmp_path: Path) -> None:
    argv = sandbox_argv("bwrap", ["true"], work_root=Path("/w"), writable=[Path("/w/l")], cwd=Path("/w/l"),
                        network=True, switch_user=True)
    assert "--unshare-net" not in argv
    assert " ".join(argv).count("--cap-add") == 2 and "CAP_SETUID" in argv and "CAP_SETGID" in argv


def test_the_light_namespace_shares_the_filesystem_and_network_but_not_the_pids() -> None:
    argv = namespace_argv("bwrap", ["sh", "-c", "echo"], work_root=Path("/w"), writable=[Path("/w/l")],
                          cwd=Path("/w/l"), hidden=[Path("/etc/flash/token")])
    text = " ".join(argv)
    assert "--unshare-pid" in argv and "--unshare-net" not in argv and "--ro-bind / /" not in text
    assert "--bind / / --dev-bind /dev /dev --proc /proc --perms 0755 --tmpfs /w --bind /w/l /w/l" in text
    assert text.index("--ro-bind /dev/null /etc/flash/token") < text.index("-- sh -c echo")
    assert argv[argv.index("--cap-drop") + 1] == "ALL"


def test_a_task_user_switches_before_the_command_runs(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing a lease directory to another user needs root")
    user = TaskUser("runner", 1234, 2345)
    dirs = dirs_in(tmp_path)
    argv, _ = build_command(argv_payload(), "trusted", dirs,
                            confinement=Confinement("none", tmp_path / "work", task_user=user))
    assert argv[:3] == [sys.executable, "-I", "-S"] and argv[5:7] == ["1234", "2345"]
    assert argv[-2:] == ["python", "train.py"]
    for writable in (dirs.out, dirs.root / "home", dirs.root / "tmp", dirs.ckpt):
        assert (os.stat(writable).st_uid, os.stat(writable).st_gid) == (1234, 2345)
    # The lease directory stays the worker's (its log is the worker's to read), passable by the task.
    assert os.stat(dirs.root).st_uid == 0 and os.stat(dirs.inputs).st_uid == 0
    assert os.stat(tmp_path / "work").st_mode & 0o001 and os.stat(dirs.root).st_mode & 0o001


# --- the worker's credential, user and runner -----------------------------------------


def test_a_token_file_others_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("tok-123\n")
    path.chmod(0o644)
    with pytest.raises(WorkerConfigError, match=r"has mode 0644.*must be 0600 or stricter: chmod 600"):
        read_token_file(path)
    path.chmod(0o600)
    assert read_token_file(path) == "tok-123"
    path.write_text("  \n")
    with pytest.raises(WorkerConfigError, match=r"is empty"):
        read_token_file(path)
    with pytest.raises(WorkerConfigError, match=r"cannot be read"):
        read_token_file(tmp_path / "missing")


def test_the_worker_takes_its_token_from_the_file_and_masks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("tok-from-file")
    path.chmod(0o400)
    agent = WorkerAgent("http://127.0.0.1:1", token_file=path, runner="sandboxed", sandbox_probe=WORKS)
    assert agent.client.authenticates
    confinement = agent.confinement(tmp_path / "work")
    assert confinement.mode == "sandbox" and confinement.hidden == (path.resolve(),)


def test_the_token_comes_from_the_option_then_the_file_then_the_environment() -> None:
    parser = build_parser()
    assert resolve_token(parser.parse_args([]), {"FLASHML_NODE_TOKEN": "env"}) == ("env", None)
    assert resolve_token(parser.parse_args([]), {"FLASHML_NODE_TOKEN": "env", "FLASHML_NODE_TOKEN_FILE": "/f"}) \
        == (None, "/f")
    assert resolve_token(parser.parse_args(["--token-file", "/g"]), {"FLASHML_NODE_TOKEN_FILE": "/f"}) == (None, "/g")
    assert resolve_token(parser.parse_args(["--token", "t", "--token-file", "/g"]), {}) == ("t", "/g")


def test_the_worker_forgets_its_credentials_from_its_environment() -> None:
    environ = {"FLASHML_NODE_TOKEN": "t", "FLASHML_NODE_TOKEN_FILE": "/f", "FLASHML_JOIN_CODE": "j", "PATH": "/bin"}
    forget_token_environment(environ)
    assert environ == {"PATH": "/bin"}


def test_the_worker_becomes_non_dumpable() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux's")
    code = ("import ctypes; from flashruntime.agent.node_token import make_non_dumpable; "
            "assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 1; assert make_non_dumpable(); "
            "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_a_task_user_needs_a_root_worker_and_an_unprivileged_user() -> None:
    with pytest.raises(ValueError, match=r"--task-user 'nobody' needs a worker running as root \(this one runs as uid "
                                         r"1000\)"):
        resolve_task_user("nobody", euid=1000)
    with pytest.raises(ValueError, match=r"no such user"):
        resolve_task_user("no-such-user-here", euid=0)
    with pytest.raises(ValueError, match=r"is root \(uid 0\)"):
        resolve_task_user("root", euid=0)


def test_the_default_runner_is_the_sandbox_where_bwrap_works() -> None:
    assert default_runner(WORKS)[0] == "sandboxed"
    runner, why = default_runner(BROKEN)
    assert runner == "subprocess" and "user namespaces are off" in why
    assert build_parser().parse_args([]).runner is None


def test_the_sandboxed_runner_needs_a_working_bwrap() -> None:
    with pytest.raises(WorkerConfigError, match=r"--runner sandboxed needs bubblewrap: user namespaces are off"):
        WorkerAgent("http://127.0.0.1:1", runner="sandboxed", sandbox_probe=BROKEN)


@pytest.mark.parametrize(("runner", "sandbox_capable", "unsandboxed"),
                         [("sandboxed", True, False), ("trusted", False, True), ("subprocess", False, False)])
def test_the_registration_says_what_the_runner_runs(runner: str, sandbox_capable: bool, unsandboxed: bool) -> None:
    registration = WorkerAgent("http://127.0.0.1:1", runner=runner, sandbox_probe=WORKS).registration()
    assert (registration.sandbox_capable, registration.unsandboxed_argv_capable) == (sandbox_capable, unsandboxed)
    assert registration.argv_capable is False


def test_the_trusted_runner_without_bwrap_runs_plain_children(tmp_path: Path) -> None:
    agent = WorkerAgent("http://127.0.0.1:1", runner="trusted", sandbox_probe=BROKEN)
    assert agent.confinement(tmp_path).mode == "none"
    assert WorkerAgent("http://127.0.0.1:1", runner="trusted", sandbox_probe=WORKS).confinement(tmp_path).mode \
        == "namespace"


@pytest.mark.skipif(os.geteuid() != 0, reason="handing directories to a task user needs root")
def test_handing_the_checkpoints_to_the_task_user_never_goes_through_a_link(tmp_path: Path) -> None:
    dirs = dirs_in(tmp_path)
    dirs.ckpt.mkdir()
    outside = tmp_path / "root-only"
    outside.write_text("root's")
    os.link(outside, dirs.ckpt / "step-1.pt")  # another name of a file outside the lease
    (dirs.ckpt / "to-outside").symlink_to(outside)
    (dirs.ckpt / "mine.pt").write_text("saved")
    user = TaskUser("nobody", 65534, 65534)
    prepare_task_dirs(dirs, user, tmp_path / "work")
    assert (outside.stat().st_uid, outside.stat().st_gid) == (0, 0)
    assert (dirs.ckpt / "mine.pt").stat().st_uid == 65534 and dirs.ckpt.stat().st_uid == 65534
    assert os.lstat(dirs.ckpt / "to-outside").st_uid == 65534  # the link itself, not what it names


def test_a_worker_whose_dataset_would_show_var_again_stops_before_it_registers(tmp_path: Path, caplog: Any) -> None:
    # The coordinator's address answers nothing: the worker must stop before it ever calls it.
    agent = WorkerAgent("http://127.0.0.1:1", runner="sandboxed", sandbox_probe=WORKS, work_dir=tmp_path / "work",
                        datasets={"everything": "/var"})
    with caplog.at_level("ERROR", logger="flashruntime"):
        assert agent.run() == 1
    assert "/var is readable in the sandbox, but the sandbox empties /var" in caplog.text
    assert "registration" not in caplog.text and "unreachable" not in caplog.text
