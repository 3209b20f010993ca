"""``flashruntime logs / tasks / artifacts`` and the global options after the command, against
the stdlib fake coordinator of ``test_cli_jobs`` on 127.0.0.1: the request each sends, what it
prints, its exit codes, and what ``artifacts --download`` writes or refuses."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flashruntime.cli import dispatch as cli
from flashruntime.cli.job_output import _LogFollower, new_text, safe_destination
from tests.integration.test_cli_jobs import RECORD, FakeCoordinator, _handler_for

JOB = "0123456789ab"
LOGS = {"logs": "--- trial-000 (COMPLETED) ---\nhello\n--- trial-001 (FAILED) ---\nboom\n",
        "tasks": [{"task_id": "trial-000", "state": "COMPLETED", "node_id": "w1", "log": "hello\n",
                   "truncated": False},
                  {"task_id": "trial-001", "state": "FAILED", "node_id": "w1", "log": "boom\n", "truncated": False}]}
TASKS = [{"task_id": "trial-000", "state": "COMPLETED", "attempts": 1, "max_attempts": 4, "node_id": "w1"},
         {"task_id": "trial-001", "state": "FAILED", "attempts": 4, "max_attempts": 4, "node_id": "worker-long"}]


@pytest.fixture
def fake() -> Iterator[FakeCoordinator]:
    coordinator = FakeCoordinator(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(coordinator))
    coordinator.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield coordinator
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLASHML_RUNTIME_API", "FLASHML_TOKEN", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))


def test_logs_prints_the_text_and_passes_task_and_tail(fake: FakeCoordinator,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/logs")] = (200, LOGS)
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/logs?task=trial-001&tail=5")] = (200, {**LOGS, "logs": "boom\n"})
    assert run_cli("--api", fake.url, "logs", JOB) == 0
    assert capsys.readouterr().out == LOGS["logs"]
    assert run_cli("logs", JOB, "--task", "trial-001", "--tail", "5", "--api", fake.url) == 0
    assert capsys.readouterr().out == "boom\n"
    assert run_cli("logs", JOB, "--json", "--api", fake.url) == 0
    assert json.loads(capsys.readouterr().out) == LOGS


def test_logs_of_an_unknown_task_exits_1_with_the_coordinators_words(fake: FakeCoordinator,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/logs?task=nope")] = (404, {"detail": "job has no task 'nope'"})
    assert run_cli("logs", JOB, "--task", "nope", "--api", fake.url) == 1
    assert "-> 404 Not Found: job has no task 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("tail", ["-1", "x"])
def test_a_bad_tail_is_a_usage_error(tail: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli("logs", JOB, "--tail", tail)
    assert exit_info.value.code == 2 and "--tail" in capsys.readouterr().err


def test_tasks_prints_an_aligned_table(fake: FakeCoordinator, capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/tasks")] = (200, TASKS)
    assert run_cli("tasks", JOB, "--api", fake.url) == 0
    assert capsys.readouterr().out.splitlines() == [
        "TASK       STATE      NODE         ATTEMPTS",
        "trial-000  COMPLETED  w1           1/4",
        "trial-001  FAILED     worker-long  4/4",
    ]
    assert run_cli("tasks", JOB, "--json", "--api", fake.url) == 0
    assert json.loads(capsys.readouterr().out) == TASKS


def _listing(*files: tuple[str, bytes], sha256: str | None = None) -> list[dict[str, Any]]:
    return [{"uri": f"artifact://{key}", "key": key, "size_bytes": len(data),
             "sha256": sha256 or hashlib.sha256(data).hexdigest()} for key, data in files]


def test_artifacts_lists_key_size_and_sha256(fake: FakeCoordinator, capsys: pytest.CaptureFixture[str]) -> None:
    files = ((f"jobs/{JOB}/trial-000/metrics.json", b'{"loss": 1}'), (f"jobs/{JOB}/trial-000/task.log", b"x" * 4096))
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/artifacts")] = (200, _listing(*files))
    assert run_cli("artifacts", JOB, "--api", fake.url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KEY", "SIZE", "SHA256"]
    assert lines[1].split() == [files[0][0], "11", "B", hashlib.sha256(files[0][1]).hexdigest()]
    assert lines[2].split()[:3] == [files[1][0], "4.0", "KiB"]


def test_artifacts_download_writes_each_file_under_its_path_and_checks_it(
        fake: FakeCoordinator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = (f"jobs/{JOB}/trial-000/sub/metrics.json", b'{"loss": 1}')
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/artifacts")] = (200, _listing(good))
    fake.routes[("GET", f"/v1alpha1/artifacts/{good[0]}")] = (200, good[1])
    out = tmp_path / "out"
    assert run_cli("artifacts", JOB, "--download", str(out), "--api", fake.url) == 0
    assert (out / "trial-000" / "sub" / "metrics.json").read_bytes() == good[1]
    printed = capsys.readouterr().out
    assert f"[1/1] {good[0]} -> {out / 'trial-000' / 'sub' / 'metrics.json'} (11 B, sha256 ok)" in printed
    assert [p.name for p in (out / "trial-000" / "sub").iterdir()] == ["metrics.json"]  # no temporary file left


def test_artifacts_download_refuses_a_wrong_digest_and_a_path_out_of_the_directory(
        fake: FakeCoordinator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tampered = (f"jobs/{JOB}/trial-000/metrics.json", b'{"loss": 1}')
    escaping = (f"jobs/{JOB}/../../evil.txt", b"evil")
    fine = (f"jobs/{JOB}/trial-001/metrics.json", b"{}")
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}/artifacts")] = (200, [
        *_listing(tampered, sha256="0" * 64), *_listing(escaping), *_listing(fine)])
    for key, data in (tampered, escaping, fine):
        fake.routes[("GET", f"/v1alpha1/artifacts/{key}")] = (200, data)
    out = tmp_path / "deep" / "out"
    assert run_cli("artifacts", JOB, "--download", str(out), "--api", fake.url) == 1
    err = capsys.readouterr().err
    assert f"{tampered[0]}: sha256 {hashlib.sha256(tampered[1]).hexdigest()} is not the listed {'0' * 64}" in err
    assert f"{escaping[0]}: refused: its path would land outside {out}" in err
    assert "2 of 3 files not downloaded" in err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "deep/out/trial-001/metrics.json"]


def test_safe_destination_stays_strictly_inside(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path.parent)
    assert safe_destination(tmp_path, "j", "jobs/j/t/a.txt") == tmp_path / "t" / "a.txt"
    for key in ("jobs/j/../x", "jobs/j//x", "jobs/other/x", "jobs/j/", "jobs/j/link/x", "jobs/j/a\\b", "/etc/passwd"):
        assert safe_destination(tmp_path, "j", key) is None, key


def test_global_options_after_the_command_and_token_before_it(fake: FakeCoordinator,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("GET", f"/v1alpha1/jobs/{JOB}")] = (200, RECORD)
    assert run_cli("status", JOB, "--api", fake.url, "--json") == 0
    assert json.loads(capsys.readouterr().out) == RECORD
    assert run_cli("--api", "http://127.0.0.1:9", "status", "--api", fake.url, JOB, "--json") == 0  # after wins
    assert run_cli("--token", "tok-before", "--api", fake.url, "status", JOB, "--json") == 0
    assert run_cli("--token", "tok-before", "status", JOB, "--token", "tok-after", "--api", fake.url, "--json") == 0
    assert [r.headers.get("Authorization") for r in fake.requests] == [
        None, None, "Bearer tok-before", "Bearer tok-after"]


def test_follow_prints_each_line_once_through_growth_cuts_and_retries() -> None:
    printed: list[str] = []
    follower = _LogFollower(tail=1, write=printed.append)

    def answer(*logs: tuple[str, str, str]) -> dict[str, Any]:
        return {"tasks": [{"task_id": task, "state": state, "log": log} for task, state, log in logs]}

    follower.show(answer(("t0", "LEASED", "a\nb\npart")), final=False)  # tail 1: only b; "part" waits
    follower.show(answer(("t0", "LEASED", "a\nb\npartial\nc\n"), ("t1", "PENDING", "")), final=False)
    follower.show(answer(("t0", "LEASED", "[cut]\npartial\nc\nd\n")), final=False)  # the worker cut the start
    follower.show(answer(("t0", "COMPLETED", "[cut]\npartial\nc\nd\n"), ("t1", "FAILED", "x\nno newline")),
                  final=True)
    # t1 had printed nothing when first seen, so all its lines are new ones
    assert "".join(printed) == ("--- t0 (LEASED) ---\nb\npartial\nc\nd\n"
                                "--- t1 (FAILED) ---\nx\nno newline\n")
    assert new_text("a\nb\n", "a\nb\nc\n") == "c\n"
    assert new_text("x\ny\n", "other\n") == "other\n"  # a new attempt: all of it


@pytest.mark.parametrize("command", ["logs", "tasks", "artifacts"])
def test_an_unreachable_coordinator_exits_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(command, JOB, "--api", "http://127.0.0.1:9") == 2
    assert "cannot reach the coordinator at http://127.0.0.1:9" in capsys.readouterr().err


def test_the_commands_that_ask_a_coordinator_take_api_after_them_and_local_ones_do_not_offer_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("logs", "tasks", "artifacts", "status", "worker", "runs", "submit", "view", "serve"):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(command, "--help")
        assert exit_info.value.code == 0
        offered = "--api API" in capsys.readouterr().out
        assert offered is (command in ("logs", "tasks", "artifacts", "status", "worker")), command

