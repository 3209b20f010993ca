"""Where a coordinator's time goes under the ``coordinator_claims`` load, by layer.

    pip install py-spy
    python -m benchmarks.profile_coordinator [--tasks 1200] [--clients 4] [--rate 250] [--postgres] [--idle]

Starts a ``flashruntime serve`` subprocess (data under ``benchmarks/.work``; with
``--postgres``, on a throwaway PostgreSQL server started for the run), samples it
with ``py-spy record`` (every thread, idle ones excluded) while ``--clients`` threads drain
a job of ``--tasks`` tasks with the benchmark's cycle (claim → upload metrics.json →
complete), and prints each layer's share of the samples. A sample belongs to the first
layer met walking its stack from the innermost frame out, so the database's time is
counted where a statement or a commit runs, not where the route asked for it.

Shares, not times: the figure is comparable between runs on a noisy host, and between
releases. The layers are the rows of ``LAYERS``; what matches none is "other".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from benchmarks.scenarios import _coordinator_http as http

# (layer, fragments of a frame: "function (file:line)", file relative to its sys.path entry).
# First match from the innermost frame wins; the order breaks ties between layers that call
# each other (a store's statement runs inside the manager's transition). py-spy counts a
# thread blocked in a system call as active, so the event loop's poll and idle pool threads
# get a layer of their own, which is no work of the coordinator's.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("waiting (event loop poll, idle worker threads)", (
        "EpollSelector.select", "Condition.wait", "_worker (concurrent/futures/thread.py", "_read_from_self",
        "_write_to_self", "Condition.notify")),
    ("database: transaction begin/commit", ("flashruntime/db/",)),
    ("database: lease store statements", ("flashruntime/leases/sqlite_store.py", "flashruntime/leases/_sqlite",
                                          "flashruntime/leases/postgres_store.py", "flashruntime/leases/_sql")),
    ("database: ledger (jobs, events, evidence)", ("flashruntime/coordinator/ledger",)),
    ("database: nodes", ("flashruntime/coordinator/sqlite_node_store.py", "flashruntime/coordinator/postgres_node")),
    ("database: checkpoint manifests", ("flashruntime/checkpoint/sqlite_store.py",
                                        "flashruntime/checkpoint/postgres_store.py")),
    ("database driver (psycopg, its pool)", ("psycopg/", "psycopg_pool/")),
    ("lease manager and placement", ("flashruntime/leases/", "flashruntime/scheduler/")),
    ("artifacts (upload, sha256, fsync)", ("flashruntime/coordinator/artifacts.py", "flashruntime/files.py")),
    ("auth, access, rate limit", ("flashruntime/coordinator/auth.py", "flashruntime/coordinator/access.py",
                                  "flashruntime/coordinator/guard.py", "flashruntime/coordinator/rate_limit.py")),
    ("pydantic", ("pydantic/", "pydantic_core/")),
    ("JSON", ("json/",)),
    ("coordinator logic", ("flashruntime/coordinator/", "flashruntime/protocol/")),
    ("FastAPI and Starlette", ("fastapi/", "starlette/")),
    ("uvicorn and h11", ("uvicorn/", "h11/")),
    ("asyncio, anyio and threads", ("asyncio/", "anyio/", "concurrent/", "threading.py", "selectors.py")),
)


def layer_of(frames: list[str]) -> str:
    """The layer of one sample; ``frames`` from the innermost out, each ``function (file:line)``."""
    for frame in frames:
        for layer, fragments in LAYERS:
            if any(fragment in frame for fragment in fragments):
                return layer
    return "other"


def read_collapsed(path: Path) -> tuple[collections.Counter[str], dict[str, collections.Counter[str]]]:
    """py-spy's ``--format raw`` output (collapsed stacks: root;...;leaf count) → samples by
    layer, and by layer the samples of each innermost frame."""
    counts: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = list(reversed(stack.split(";")))
        layer = layer_of(frames)
        counts[layer] += int(count)
        leaves[layer][frames[0]] += int(count)
    return counts, leaves


def _drain(url: str, tasks: int, clients: int) -> None:
    with http.http_client(url) as admin:
        job_id = http.submit(admin, http.job_spec(tasks, 60.0, name="profile"))
        for index in range(clients):
            http.register(admin, f"profile-{index}")

    def loop(node_id: str) -> None:
        with http.http_client(url) as client:
            while True:
                claimed = client.post("/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": job_id})
                if claimed.status_code == 204:
                    return
                if claimed.status_code != 200:
                    raise RuntimeError(f"claim answered {claimed.status_code}: {claimed.text}")
                if http.upload_and_complete(client, claimed.json()) != {"accepted": True}:
                    raise RuntimeError("a commit was not accepted")

    threads = [threading.Thread(target=loop, args=(f"profile-{index}",)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_coordinator", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--postgres", action="store_true", help="serve on a throwaway PostgreSQL server")
    parser.add_argument("--idle", action="store_true", help="also sample threads that wait (where requests queue)")
    parser.add_argument("--frames", type=int, default=0, metavar="N",
                        help="also print each layer's N most sampled innermost frames")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        print("profile_coordinator needs py-spy: pip install py-spy", file=sys.stderr)
        return 2
    work = http.make_work_dir("profile")
    try:
        with contextlib.ExitStack() as stack:
            database_url = None
            if args.postgres:
                from benchmarks.scenarios import _postgres

                missing = _postgres.postgres_missing()
                if missing:
                    print(f"profile_coordinator --postgres: {missing}", file=sys.stderr)
                    return 2
                database_url = stack.enter_context(_postgres.postgres_database())
            server = stack.enter_context(http.serving(work / "data", database_url=database_url))
            assert server.process is not None
            out = work / "profile.txt"
            recorder = subprocess.Popen([py_spy, "record", "--pid", str(server.process.pid), "--rate", str(args.rate),
                                         "--format", "raw", "--output", str(out), "--nonblocking",
                                         *(["--idle"] if args.idle else [])],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _drain(server.url, args.tasks, args.clients)
            finally:
                recorder.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
                _, err = recorder.communicate(timeout=60)
            if not out.exists():
                print(f"py-spy wrote nothing: {err.decode(errors='replace')[-400:]}", file=sys.stderr)
                return 1
            counts, leaves = read_collapsed(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(counts.values()) or 1
    print(f"{total} samples of the coordinator's threads, {args.tasks} cycles, {args.clients} clients")
    for layer, count in counts.most_common():
        print(f"  {count / total:6.1%}  {layer}")
        for frame, samples in leaves[layer].most_common(args.frames):
            print(f"           {samples / total:6.1%}  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
