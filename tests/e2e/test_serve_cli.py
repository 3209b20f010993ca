"""``flashruntime serve`` as users start it, driven by the CLI's HTTP subcommands."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = pytest.mark.service
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

SPEC = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "cli-sweep"},
        "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                 "workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}, {"C": 0.1}]}}}}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flashruntime.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_serve_then_submit_status_events_cancel_and_a_clean_stop(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = process_env(FLASHML_RUNTIME_API=url)
    server = subprocess.Popen([sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port),
                               "--data-dir", str(tmp_path / "data")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, process=server)
        spec_file = tmp_path / "job.json"
        spec_file.write_text(json.dumps(SPEC))
        submitted = _cli("submit-spec", "--json", str(spec_file), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job = json.loads(submitted.stdout)
        assert job["state"] == "RUNNING" and job["backend"] == "leases"
        status = _cli("status", "--json", job["job_id"], env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["job_id"] == job["job_id"]
        events = json.loads(_cli("events", "--json", job["job_id"], env=env).stdout)
        assert [e["type"] for e in events[:2]] == ["JOB_ACCEPTED", "BACKEND_SELECTED"]
        shown = _cli("events", job["job_id"], env=env).stdout.splitlines()
        assert shown[0].split() == ["AGE", "TYPE", "MESSAGE"] and shown[1].split()[1] == "JOB_ACCEPTED", shown
        cancelled = _cli("cancel", job["job_id"], env=env)
        assert cancelled.returncode == 0 and cancelled.stdout.splitlines()[1].startswith("state    CANCELLED, ")
        missing = _cli("status", "--json", "000000000000", env=env)
        assert missing.returncode == 1 and "404" in missing.stderr
        assert (tmp_path / "data" / "flashruntime.db").is_file() and not (tmp_path / "data" / "leases.db").exists()
        assert (tmp_path / "data" / "artifacts").is_dir()
    finally:
        out = stop_process(server)
    assert server.returncode == 0, out
    assert f"FlashRuntime coordinator on {url}" in out
    unreachable = _cli("status", "--json", job["job_id"], env=env)
    assert unreachable.returncode == 2


def test_serve_over_tls_with_tokens_and_the_cli_with_its_token(tmp_path: Path) -> None:
    """HTTPS from uvicorn's own TLS (``--ssl-certfile``/``--ssl-keyfile``), a certificate from a
    throwaway CA; the CLI trusts that CA through SSL_CERT_FILE and sends ``--token`` or
    FLASHML_TOKEN, and says what to do when it has no token."""
    trustme = pytest.importorskip("trustme")
    httpx = pytest.importorskip("httpx")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    trusted = ssl.create_default_context(cafile=str(ca_file))
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    env = process_env(FLASHML_RUNTIME_API=url, FLASHML_SUBMITTER_TOKENS="alice:tok-alice", SSL_CERT_FILE=str(ca_file))
    server = subprocess.Popen([sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port),
                               "--data-dir", str(tmp_path / "data"), "--ssl-certfile", str(cert_file),
                               "--ssl-keyfile", str(key_file)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "the TLS coordinator never became healthy"
            try:
                if httpx.get(f"{url}/healthz", verify=trusted, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)  # no plain HTTP on the TLS port
        spec_file = tmp_path / "job.json"
        spec_file.write_text(json.dumps(SPEC))
        anonymous = _cli("submit-spec", "--json", str(spec_file), env=env)
        assert anonymous.returncode == 1
        assert "401" in anonymous.stderr and "pass --token or set FLASHML_TOKEN" in anonymous.stderr
        submitted = _cli("submit-spec", "--json", str(spec_file), "--token", "tok-alice", env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = json.loads(submitted.stdout)["job_id"]
        status = _cli("status", "--json", job_id, env={**env, "FLASHML_TOKEN": "tok-alice"})
        assert status.returncode == 0 and json.loads(status.stdout)["submitted_by"]["name"] == "alice"
    finally:
        out = stop_process(server)
    assert server.returncode == 0, out
    assert f"FlashRuntime coordinator on {url}" in out


def test_an_open_coordinator_on_every_interface_refuses_to_start_without_insecure(tmp_path: Path) -> None:
    refused = subprocess.run([sys.executable, "-m", "flashruntime.cli", "serve", "--host", "0.0.0.0",
                              "--port", str(free_port()), "--data-dir", str(tmp_path / "data")],
                             env=process_env(), capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2
    assert "refusing to serve an open coordinator on 0.0.0.0" in refused.stderr and "--insecure" in refused.stderr
    assert not (tmp_path / "data").exists()


def test_serve_hosts_the_rendezvous_store_and_stops_it_with_itself(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from torch.distributed import TCPStore

    port, store_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port), "--data-dir",
                               str(tmp_path / "data"), "--rendezvous-port", str(store_port)], env=process_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, timeout_s=120, process=server)
        # A client of the store, as torchrun's rendezvous is (is_host=0): keys set are read back.
        client = TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=30))
        client.set("flashruntime-probe", "1")
        assert client.get("flashruntime-probe") == b"1"
        del client
    finally:
        out = stop_process(server)
    assert server.returncode == 0, out
    assert f"rendezvous port {store_port} on every interface" in out and "listens on port" in out
    with socket.socket() as probe:  # the store went with serve
        assert probe.connect_ex(("127.0.0.1", store_port)) != 0


def test_serve_refuses_a_rendezvous_port_it_cannot_use(tmp_path: Path) -> None:
    port = free_port()
    same = _cli("serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), "--rendezvous-port", str(port),
                env=process_env())
    assert same.returncode == 2 and "is the API's --port" in same.stderr
    from_env = subprocess.run([sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port), "--data-dir",
                               str(tmp_path / "data")], env=process_env(FLASHML_RENDEZVOUS_PORT=str(port)),
                              capture_output=True, text=True, timeout=120, check=False)
    assert from_env.returncode == 2 and "is the API's --port" in from_env.stderr
    pytest.importorskip("torch")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = _cli("serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), "--rendezvous-port",
                    str(taken.getsockname()[1]), env=process_env())
    assert busy.returncode == 2, busy.stdout + busy.stderr
    assert "the rendezvous store on port" in busy.stderr and "did not start" in busy.stderr


def test_a_killed_serve_leaves_no_rendezvous_store_holding_its_port(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    port, store_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port), "--data-dir",
                               str(tmp_path / "data"), "--rendezvous-port", str(store_port)], env=process_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=120, process=server)
        server.kill()  # no chance to stop its child: the store sees its standard input end
        server.communicate(timeout=30)

        def port_free() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", store_port)) != 0

        deadline = time.monotonic() + 60
        while not port_free() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_free(), "the store outlived the serve that started it"
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
