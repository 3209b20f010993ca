"""A throwaway PostgreSQL cluster for the tests: one per test session, an empty namespace per test.

``postgres_cluster`` (session scope) runs ``initdb`` into a temporary directory and starts
the server on a free port of 127.0.0.1 with trust authentication, its socket in that
directory and ``fsync`` on; at the end of the session it is stopped (``pg_ctl stop -m
immediate``) and the directory removed. ``postgres_url`` (function scope) is the URL of an
empty database for one test: a schema of its own in the session's test database, made
first in the URL's ``search_path`` and dropped after the test (a schema costs a
millisecond, a ``CREATE DATABASE`` with fsync on a sixth of a second).
``PostgresCluster.create_database`` makes a whole database for a test that needs one. Run
as root, the server runs as the ``postgres`` OS user (``initdb`` refuses root). Without
the server binaries or psycopg both fixtures skip, saying what to install.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["PostgresCluster", "find_server_binaries", "postgres_cluster", "postgres_url"]

_INSTALL_SERVER = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not on PATH nor under /usr/lib/postgresql/*/bin; "
    "install them (Debian/Ubuntu: apt-get install postgresql)"
)
_INSTALL_DRIVER = "psycopg is not installed; install it with pip install 'flashruntime[postgres]' (psycopg, psycopg-pool)"
_OS_USER = "postgres"


def find_server_binaries() -> tuple[Path, Path] | None:
    """``(initdb, pg_ctl)`` from PATH, else from the newest ``/usr/lib/postgresql/*/bin``; None when absent."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb), Path(pg_ctl)

    def version(directory: str) -> tuple[int, ...]:
        name = Path(directory).parent.name
        return tuple(int(part) for part in name.split(".") if part.isdigit()) or (0,)

    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        initdb_path, pg_ctl_path = Path(directory) / "initdb", Path(directory) / "pg_ctl"
        if initdb_path.is_file() and pg_ctl_path.is_file():
            return initdb_path, pg_ctl_path
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresCluster:
    """A PostgreSQL server in ``root`` (data in ``root/data``, its socket in ``root``) on
    ``127.0.0.1:port``, reached as the superuser ``postgres`` without a password."""

    def __init__(self, root: Path, initdb: Path, pg_ctl: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.host = "127.0.0.1"
        self.port = 0
        self._initdb = initdb
        self._pg_ctl = pg_ctl
        self._as_user: list[str] = []
        self._names = itertools.count(1)
        self._admin: dict[str, Any] = {}  # database -> an autocommit connection of the superuser
        self._test_database: str | None = None

    # --- server -------------------------------------------------------------------

    def start(self) -> None:
        """``initdb``, configure, then start the server and wait until it accepts connections."""
        if os.geteuid() == 0:
            # initdb refuses to run as root: the cluster belongs to the postgres OS user.
            shutil.chown(self.root, _OS_USER, _OS_USER)
            self._as_user = ["runuser", "-u", _OS_USER, "--"]
        self._run([str(self._initdb), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--locale=C", "--no-sync", "--no-instructions"])
        self.port = _free_port()
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            "fsync": "on",  # a committed transaction must survive a killed server
            "synchronous_commit": "on",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("".join(f"{key} = {value}\n" for key, value in settings.items()))
        self._pg_ctl_run("start", "-w", "-t", "60", "-l", str(self.log))

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: what a crash leaves, the next start recovers from the WAL)."""
        admin, self._admin = self._admin, {}
        for conn in admin.values():
            conn.close()
        self._pg_ctl_run("stop", "-m", mode, "-w", "-t", "60")

    def resume(self) -> None:
        """Start the server again on the same port after ``stop``; what it held is still there."""
        self._pg_ctl_run("start", "-w", "-t", "60", "-l", str(self.log))

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server as ``mode`` says and start it again on the same port."""
        self.stop(mode)
        self._pg_ctl_run("start", "-w", "-t", "60", "-l", str(self.log))

    # --- databases ----------------------------------------------------------------

    def url(self, database: str = "postgres", schema: str | None = None) -> str:
        """The URL of ``database``; with ``schema``, one whose ``search_path`` is that schema alone."""
        url = f"postgresql://postgres@{self.host}:{self.port}/{database}"
        return url if schema is None else f"{url}?options=-csearch_path%3D{schema}"

    def create_database(self, prefix: str = "test") -> str:
        """A new empty database (from ``template0``); its name."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self._admin_execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending the sessions still connected to it (a pool a test left open)."""
        self._admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def create_schema(self) -> str:
        """A new empty schema in the session's test database; its name."""
        if self._test_database is None:
            self._test_database = self.create_database("flashruntime_tests")
        name = f"test_{next(self._names)}"
        self._admin_execute(f'CREATE SCHEMA "{name}"', self._test_database)
        return name

    def drop_schema(self, name: str) -> None:
        """Drop the schema ``name`` and what is in it; a session a test left inside a
        transaction (holding locks on its tables) is ended first."""
        import psycopg

        try:
            self._admin_execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE', self._test_database)
        except psycopg.errors.LockNotAvailable:
            self._admin_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid()", self._test_database)
            self._admin_execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE', self._test_database)

    @property
    def test_database(self) -> str | None:
        """The database that holds the schemas of ``create_schema``, once one was made."""
        return self._test_database

    def _admin_execute(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        conn = self._admin.get(database)
        if conn is None or conn.closed:
            # lock_timeout: a test that left a transaction open makes a DROP fail, not hang.
            conn = self._admin[database] = psycopg.connect(self.url(database), autocommit=True, connect_timeout=10,
                                                           options="-c lock_timeout=5s")
        try:
            conn.execute(statement)
        except psycopg.OperationalError:
            if not conn.closed:
                raise
            # the server was restarted under a test: reconnect once
            conn = self._admin[database] = psycopg.connect(self.url(database), autocommit=True, connect_timeout=10,
                                                           options="-c lock_timeout=5s")
            conn.execute(statement)

    # --- plumbing -----------------------------------------------------------------

    def _pg_ctl_run(self, *args: str) -> None:
        self._run([str(self._pg_ctl), "-D", str(self.data), *args])

    def _run(self, argv: list[str]) -> None:
        result = subprocess.run([*self._as_user, *argv], capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            log = self.log.read_text(encoding="utf-8", errors="replace")[-4000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}\n{log}")


def _skip_without_postgres() -> tuple[Path, Path]:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        pytest.skip(_INSTALL_DRIVER)
    binaries = find_server_binaries()
    if binaries is None:
        pytest.skip(_INSTALL_SERVER)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root, the PostgreSQL server needs runuser (util-linux) to run as the postgres user")
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(_OS_USER)
        except KeyError:
            pytest.skip("running as root, the PostgreSQL server needs a 'postgres' OS user "
                        "(Debian's postgresql package creates it)")
    return binaries


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A running PostgreSQL cluster for the whole test session."""
    initdb, pg_ctl = _skip_without_postgres()
    # Not pytest's tmp_path: its directories are private to root, and the server may run as postgres.
    root = Path(tempfile.mkdtemp(prefix="flashruntime-pg-"))
    cluster = PostgresCluster(root, initdb, pg_ctl)
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            if (cluster.data / "postmaster.pid").exists():
                cluster.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> Iterator[str]:
    """The URL of an empty database for this test (a schema of its own), dropped after it."""
    schema = postgres_cluster.create_schema()
    try:
        yield postgres_cluster.url(postgres_cluster.test_database or "postgres", schema)
    finally:
        postgres_cluster.drop_schema(schema)
