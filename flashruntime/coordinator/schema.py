"""The schema of the coordinator's database: what each of its four stores has recorded as
its schema version, read without changing anything, against what this release reads
(``read_schema``), and the upgrade the coordinator runs when it starts (``upgrade_schema``).

A store's version is ``current``, ``absent`` (no tables yet), ``needs upgrade`` (one this
release migrates in place), ``newer`` (written by a later flashruntime) or ``unknown``
(neither). On SQLite, a ``leases.db`` or ``checkpoints.db`` beside the database that has
not been imported yet also needs the upgrade. ``classify`` is the pure rule.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.db.sqlite import has_table
from flashruntime.db.url import DatabaseURL
from flashruntime.errors import SchemaVersionError

__all__ = ["ABSENT", "CURRENT", "NEEDS_UPGRADE", "NEWER", "UNKNOWN", "OldStoreFile", "SchemaReport",
           "StoreVersion", "Upgrade", "classify", "read_schema", "upgrade_schema"]

CURRENT, ABSENT, NEEDS_UPGRADE, NEWER, UNKNOWN = "current", "absent", "needs upgrade", "newer", "unknown"
# What an older store file beside the SQLite database is waiting for.
WAITS, SET_ASIDE, IGNORED = "waits to be imported", "imported before, to be set aside", "ignored"

def classify(stored: str | None, reads: str, upgrades_from: tuple[str, ...] = ()) -> str:
    """What a store's recorded version ``stored`` means to a release that reads ``reads`` and
    migrates each of ``upgrades_from`` in place. A version is ``NEWER`` only when both are
    whole numbers and it is the larger; any other unfamiliar one is ``UNKNOWN``."""
    if stored is None:
        return ABSENT
    if stored == reads:
        return CURRENT
    if stored in upgrades_from:
        return NEEDS_UPGRADE
    if stored.isdigit() and reads.isdigit() and int(stored) > int(reads):
        return NEWER
    return UNKNOWN


@dataclass(frozen=True)
class StoreVersion:
    """One store's recorded schema version (None: no tables) and what this release reads."""

    store: str
    stored: str | None
    reads: str
    upgrades_from: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        return classify(self.stored, self.reads, self.upgrades_from)

    def problem(self, where: str) -> str | None:
        """Why this release cannot use the store (a newer or unknown version), or None."""
        if self.status == NEWER:
            return (f"the {self.store} schema version {self.stored} in {where} is newer than the {self.reads} this "
                    "flashruntime reads: it was written by a later flashruntime; install that one (pip install -U "
                    "flashruntime) or restore a backup made before it")
        if self.status == UNKNOWN:
            upgrades = "".join(f", and upgrades {old!r} in place" for old in self.upgrades_from)
            return (f"the {self.store} schema version {self.stored!r} in {where} is not one this flashruntime reads "
                    f"(it reads {self.reads!r}{upgrades}); use the flashruntime version that wrote it")
        return None


@dataclass(frozen=True)
class OldStoreFile:
    """A ``leases.db`` / ``checkpoints.db`` of an older layout beside the SQLite database.
    ``status``: ``WAITS`` (the next start imports it), ``SET_ASIDE`` (imported before; the
    next start renames it ``<name>.imported``) or ``IGNORED`` (imported before and a file of
    that name is already set aside: it is never read, move it away). ``version``: its own
    store's schema version; ``problem``: why it cannot be imported, or None."""

    name: str
    path: Path
    status: str
    version: StoreVersion
    problem: str | None = None


@dataclass(frozen=True)
class SchemaReport:
    """What ``read_schema`` found in ``database``: one ``StoreVersion`` per store (ledger,
    leases, checkpoints, nodes) and the older store files beside a SQLite database."""

    database: DatabaseURL
    stores: tuple[StoreVersion, ...]
    files: tuple[OldStoreFile, ...] = ()

    @property
    def empty(self) -> bool:
        """No store has tables and no older file waits: the first start creates everything."""
        return all(store.status == ABSENT for store in self.stores) and not self.pending_files

    @property
    def pending_files(self) -> tuple[OldStoreFile, ...]:
        return tuple(file for file in self.files if file.status != IGNORED)

    @property
    def problems(self) -> list[str]:
        """Why this release cannot use the database: a store or an older file with a newer
        or unknown version. Empty when it can."""
        where = _where(self.database)
        found = [problem for store in self.stores if (problem := store.problem(where)) is not None]
        return found + [file.problem for file in self.files if file.problem is not None]

    @property
    def needs_upgrade(self) -> bool:
        """Whether the next start would change the database (``empty`` aside)."""
        if self.empty:
            return False
        return any(store.status in (NEEDS_UPGRADE, ABSENT) for store in self.stores) or bool(self.pending_files)

    @property
    def status(self) -> str:
        """``"unusable"``, ``"empty"``, ``NEEDS_UPGRADE`` or ``CURRENT``."""
        if self.problems:
            return "unusable"
        if self.empty:
            return "empty"
        return NEEDS_UPGRADE if self.needs_upgrade else CURRENT


@dataclass(frozen=True)
class Upgrade:
    """What ``upgrade_schema`` did: the database ``before`` and ``after``, and the rows
    copied from each older store file it imported (0: one imported before, set aside now)."""

    before: SchemaReport
    after: SchemaReport
    imported: dict[str, int] = field(default_factory=dict)


# --- reading -------------------------------------------------------------------------


def read_schema(settings: RuntimeSettings) -> SchemaReport:
    """Each store's recorded schema version in ``settings.database``, read without changing
    anything: a SQLite file through a read-only connection (a file that does not exist is
    an empty database, and is not created), PostgreSQL in a read-only transaction. A
    database that cannot be read raises ``StoreError`` (PostgreSQL: naming the server,
    never the password), ``sqlite3.Error`` (the file is not a database) or ``OSError`` (the
    path names a directory)."""
    database = settings.database
    if database.kind == "postgresql":
        return _read_postgres(database)
    return _read_sqlite(database, {"leases.db": settings.leases_path, "checkpoints.db": settings.checkpoints_path})


def _sqlite_readers() -> tuple[tuple[str, str, tuple[str, ...], Callable[[Any], str | None]], ...]:
    from flashruntime.checkpoint import sqlite_store as checkpoints
    from flashruntime.coordinator import ledger_tables as ledger
    from flashruntime.coordinator import sqlite_node_store as nodes
    from flashruntime.leases import sqlite_store as leases

    return (("ledger", str(ledger.SQLITE_SCHEMA_VERSION), ledger.SQLITE_UPGRADES_FROM, ledger.stored_schema_version),
            ("leases", leases.SCHEMA_VERSION, leases.UPGRADES_FROM, leases.stored_schema_version),
            ("checkpoints", checkpoints.SCHEMA_VERSION, (), checkpoints.stored_schema_version),
            ("nodes", nodes.SCHEMA_VERSION, (), nodes.stored_schema_version))


def _postgres_readers() -> tuple[tuple[str, str, tuple[str, ...], Callable[[Any], str | None]], ...]:
    from flashruntime.checkpoint import postgres_store as checkpoints
    from flashruntime.coordinator import ledger_tables as ledger
    from flashruntime.coordinator import postgres_node_store as nodes
    from flashruntime.leases import postgres_store as leases

    return (("ledger", ledger.POSTGRES_SCHEMA_VERSION, (), ledger.stored_schema_version),
            ("leases", leases.SCHEMA_VERSION, (), leases.stored_schema_version),
            ("checkpoints", checkpoints.SCHEMA_VERSION, (), checkpoints.stored_schema_version),
            ("nodes", nodes.SCHEMA_VERSION, (), nodes.stored_schema_version))


def _read_only(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` that cannot write. Without a ``-wal`` file beside it, no
    connection has the database open in WAL mode and nothing waits in a log, so it is read
    as it lies (``immutable``: SQLite creates no ``-wal`` or ``-shm`` file for it either);
    with one, as any reader reads it (``mode=ro``, through the shared memory)."""
    flags = "mode=ro" if path.with_name(path.name + "-wal").exists() else "immutable=1"
    return sqlite3.connect(f"file:{quote(str(path.absolute()))}?{flags}", uri=True, isolation_level=None)


def _versions(readers: Any, source: Any) -> tuple[StoreVersion, ...]:
    return tuple(StoreVersion(name, read(source), reads, upgrades) for name, reads, upgrades, read in readers)


def _read_sqlite(database: DatabaseURL, files: Mapping[str, Path]) -> SchemaReport:
    assert database.path is not None  # a SQLite URL always names its file
    readers = _sqlite_readers()
    path = database.path
    imported: set[str] = set()
    if path.exists() and not path.is_file():
        raise IsADirectoryError(errno.EISDIR, "not a SQLite file (a directory?)", str(path))
    if path.is_file():
        with closing(_read_only(path)) as conn:
            stores = _versions(readers, conn)
            if has_table(conn, "store_imports"):
                imported = {str(row[0]) for row in conn.execute("SELECT file FROM store_imports")}
    else:
        stores = tuple(StoreVersion(name, None, reads, upgrades) for name, reads, upgrades, _ in readers)
    old: list[OldStoreFile] = []
    for name, file in files.items():
        if not file.is_file() or (path.is_file() and file.resolve() == path.resolve()):
            continue
        store = "leases" if name == "leases.db" else "checkpoints"
        reader = next(reader for reader in readers if reader[0] == store)
        with closing(_read_only(file)) as conn:
            (version,) = _versions((reader,), conn)
        if name not in imported:
            status = WAITS
        elif file.with_name(file.name + ".imported").exists():
            status = IGNORED
        else:
            status = SET_ASIDE
        problem = version.problem(str(file)) if status == WAITS else None
        old.append(OldStoreFile(name, file, status, version, problem))
    return SchemaReport(database, stores, tuple(old))


def _read_postgres(database: DatabaseURL) -> SchemaReport:
    from flashruntime.coordinator.state import DATABASE_URL_SOURCE
    from flashruntime.db.postgres import PostgresDatabase

    db = PostgresDatabase(database.url, min_size=0, max_size=1, source=DATABASE_URL_SOURCE)
    try:
        with db.transaction():
            db.execute("SET TRANSACTION READ ONLY")  # a reader that cannot write by mistake
            return SchemaReport(database, _versions(_postgres_readers(), db))
    finally:
        db.close()


# --- upgrading -----------------------------------------------------------------------


def upgrade_schema(settings: RuntimeSettings) -> Upgrade:
    """Run the migrations the coordinator runs when it starts: open the state (creating or
    migrating every store's tables in one transaction, then importing each older store
    file in one of its own) and close it. A database holding a store this release cannot
    read raises ``SchemaVersionError`` (naming the store and both versions) before anything
    changes; one that cannot be opened, ``StoreError``."""
    from flashruntime.coordinator.state import open_state

    before = read_schema(settings)
    if before.problems:
        raise SchemaVersionError("; ".join(before.problems))
    state = open_state(settings)
    try:
        imported = dict(state.imported)
    finally:
        state.close()
    return Upgrade(before, read_schema(settings), imported)


def _where(database: DatabaseURL) -> str:
    return str(database.path) if database.kind == "sqlite" else str(database)
