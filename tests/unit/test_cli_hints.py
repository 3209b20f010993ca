"""What the command says when it is given something it cannot take: the usage of the
command meant, and what was probably meant."""

from __future__ import annotations

import argparse

import pytest

from flashruntime.cli.dispatch import _build_parser, main
from flashruntime.workloads.command import CommandWorkload, unfilled_placeholders


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_an_unquoted_command_after_submit_is_shown_quoted(capsys: pytest.CaptureFixture[str]) -> None:
    said = _refusal(capsys, "submit", "python", "train.py", "--epochs=3")
    assert said.startswith("usage: flashruntime submit ")
    assert ("flashruntime submit: error: unrecognized arguments: train.py --epochs=3; quote the command, so it is "
            "one argument: flashruntime submit 'python train.py --epochs=3' (see flashruntime submit --help)") in said


def test_a_misspelt_option_gets_the_closest_option_of_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    said = _refusal(capsys, "submit", "python train.py", "--restarts", "2")
    assert "unrecognized arguments: --restarts 2; --restarts: did you mean --max-restarts?" in said
    assert "did you mean --json?" in _refusal(capsys, "runs", "--jsn")
    assert "did you mean" not in _refusal(capsys, "runs", "--zzzzzz")


def test_every_command_describes_itself_in_its_help() -> None:
    def commands(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.ArgumentParser]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    found += [(f"{name} {sub_name}", sub), *commands(sub, f"{name} {sub_name}")]
        return found

    listed = commands(_build_parser(), "flashruntime")
    assert {"flashruntime view", "flashruntime demo", "flashruntime submit"} <= {name for name, _ in listed}
    assert [name for name, sub in listed if not (sub.description or "").strip()] == []


def test_a_placeholder_without_task_params_is_named_and_the_sweep_shown(
        capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert unfilled_placeholders(CommandWorkload(command="python train.py --lr {lr} --bs {bs} {{x}} {}")) \
        == ["{lr}", "{bs}"]
    assert unfilled_placeholders(CommandWorkload(command="python train.py --lr {lr}", task_params=[{"lr": 1}])) == []
    code = main(["submit", "python -c pass --lr {lr}", "--source", str(tmp_path), "--no-watch", "--quiet",
                 "--output-dir", str(tmp_path / "run")])
    assert code == 0
    assert ("warning: the command has the placeholder {lr} but no --task-params to fill it, so it runs as written; "
            "to sweep, add --task-params '[{\"lr\": 0.1}]'") in capsys.readouterr().err


def test_a_wrong_token_is_told_where_each_program_reads_its_token() -> None:
    from flashruntime.coordinator.auth import StaticTokenAuthenticator, resolve_identity
    from flashruntime.errors import AuthFailure

    with pytest.raises(AuthFailure) as refused:
        resolve_identity(StaticTokenAuthenticator({"box-1": "tok-box-1"}), "Bearer not-a-token", [])
    assert refused.value.status_code == 401
    assert str(refused.value).startswith(
        "unknown bearer token: send 'Authorization: Bearer <token>' (the CLI's job commands: --token or "
        "FLASHML_TOKEN; a worker: --token-file, FLASHML_NODE_TOKEN_FILE or FLASHML_NODE_TOKEN)")
