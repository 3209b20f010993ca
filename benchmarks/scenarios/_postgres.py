"""A throwaway PostgreSQL server for the coordinator scenarios: ``initdb`` into a fresh
directory under ``benchmarks/.work``, started on a free port of 127.0.0.1 with trust
authentication and ``fsync`` on (what a production server does), one empty database,
stopped and removed on the way out. Run as root, the server runs as the ``postgres`` OS
user (``initdb`` refuses root).

The underscore keeps the registry from treating this module as a scenario. Benchmarks
never import from ``tests/``, so the tests' cluster is written out again here, sized to
what the scenarios need.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks.scenarios._coordinator_http import WORK_DIR, free_port

_OS_USER = "postgres"


def _binaries() -> tuple[Path, Path] | None:
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb), Path(pg_ctl)
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(directory, "initdb").is_file() and Path(directory, "pg_ctl").is_file():
            return Path(directory, "initdb"), Path(directory, "pg_ctl")
    return None


def postgres_missing() -> str | None:
    """Why a PostgreSQL server cannot be started here (a skip reason), or None when it can."""
    if any(importlib.util.find_spec(name) is None for name in ("psycopg", "psycopg_pool")):
        return "the postgres extra is not installed: pip install 'flashruntime[postgres]'"
    if _binaries() is None:
        return "PostgreSQL's server binaries (initdb, pg_ctl) are missing: apt-get install postgresql"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root, the PostgreSQL server needs runuser to run as the postgres user"
    return None


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A running server with one empty database for the block → its URL."""
    binaries = _binaries()
    if binaries is None:
        raise RuntimeError(postgres_missing() or "no PostgreSQL server binaries")
    initdb, pg_ctl = binaries
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="postgres-", dir=WORK_DIR))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, _OS_USER, _OS_USER)
        as_user = ["runuser", "-u", _OS_USER, "--"]

    def run(*argv: str) -> None:
        done = subprocess.run([*as_user, *argv], capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")

    port = free_port()
    started = False
    try:
        run(str(initdb), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync",
            "--no-instructions")
        with open(data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{root}'\n"
                       "fsync = on\nsynchronous_commit = on\nmax_connections = 200\n")
        run(str(pg_ctl), "-D", str(data), "start", "-w", "-t", "60", "-l", str(root / "server.log"))
        started = True
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench TEMPLATE template0")
        yield f"postgresql://postgres@127.0.0.1:{port}/bench"
    finally:
        try:
            if started:
                run(str(pg_ctl), "-D", str(data), "stop", "-m", "immediate", "-w", "-t", "60")
        finally:
            shutil.rmtree(root, ignore_errors=True)
