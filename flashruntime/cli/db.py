"""``flashruntime db check`` and ``flashruntime db upgrade``: the coordinator's database
before and after an upgrade of flashruntime.

``check`` reads each store's recorded schema version without changing anything and says
what this release would do with it; ``upgrade`` runs the migrations ``serve`` runs at
start, and says what changed. The database is chosen as ``serve`` chooses it
(``--database-url`` > ``FLASHML_DATABASE_URL`` > the SQLite file of ``--data-dir`` >
``FLASHML_LEDGER_PATH`` > ``./flashruntime-data``) and shown with its password masked.

Exit codes of ``check``: 0 every store is current, or the database is empty (the first
start creates it); 1 an upgrade is needed; 2 the database cannot be read, holds a store
newer than this release (or of a version it does not know), or the settings are invalid.
``upgrade``: 0 done (or nothing to do); 2 it failed, and says why.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from typing import Any

from flashruntime.cli.serve import EXIT_CONFIG, add_database_options, coordinator_settings
from flashruntime.errors import CommandError

EXIT_CURRENT, EXIT_NEEDS_UPGRADE, EXIT_UNUSABLE = 0, 1, EXIT_CONFIG
_EMPTY = "empty: serve or db upgrade creates the tables"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "db", help="check or upgrade the coordinator's database (schema versions) around an upgrade of flashruntime",
        description="The coordinator's database, chosen as serve chooses it: check what an upgrade of flashruntime "
                    "would change, or run that upgrade while the coordinator is stopped.")
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check", help="read each store's schema version, changing nothing",
        description="Read each store's schema version (and, on SQLite, whether an older leases.db or "
                    "checkpoints.db waits to be imported) without changing anything. Exit 0: current (or empty); "
                    "1: db upgrade (or the next serve) would upgrade it; 2: unreadable, newer than this "
                    "flashruntime, or invalid settings.")
    upgrade = actions.add_parser(
        "upgrade", help="run the migrations serve runs at start, then stop",
        description="Run the migrations serve runs at start (every store's in one transaction, then each older "
                    "file's import in one of its own) and say what changed. Stop the coordinator first and back "
                    "the database up. Exit 0: done or nothing to do; 2: failed (the step that failed changed "
                    "nothing).")
    for action, handler in ((check, handle_check), (upgrade, handle_upgrade)):
        add_database_options(action)
        action.add_argument("--json", action="store_true", help="print the result as one JSON object")
        action.set_defaults(handler=handler)


# --- check ---------------------------------------------------------------------------


def handle_check(args: argparse.Namespace) -> int:
    try:
        report = _read(args)
    except CommandError as exc:
        return _fail("check", exc)
    if args.json:
        print(json.dumps(_report_json(report), indent=2))
    else:
        _print_report(report)
    for problem in report.problems:
        print(f"flashruntime db check: {problem}", file=sys.stderr)
    if report.problems:
        return EXIT_UNUSABLE
    return EXIT_NEEDS_UPGRADE if report.needs_upgrade else EXIT_CURRENT


def _read(args: argparse.Namespace) -> Any:
    from flashruntime.coordinator.schema import read_schema
    from flashruntime.errors import StoreError

    settings = coordinator_settings(args.data_dir, args.database_url, os.environ)
    database = settings.database
    try:
        return read_schema(settings)
    except StoreError as exc:
        raise CommandError(f"cannot use the database {database}: {exc}", EXIT_UNUSABLE) from None
    except (sqlite3.Error, OSError) as exc:
        raise CommandError(f"cannot read the database {database}: {exc}", EXIT_UNUSABLE) from None


def _store_text(store: Any, empty: bool) -> str:
    from flashruntime.coordinator import schema

    status = store.status
    if status == schema.ABSENT:
        return "no tables yet" if empty else "no tables yet: db upgrade creates them"
    if status == schema.NEEDS_UPGRADE:
        return f"needs upgrade to {store.reads}"
    if status == schema.NEWER:
        return f"newer than the {store.reads} this flashruntime reads"
    if status == schema.UNKNOWN:
        return f"not a version this flashruntime reads (it reads {store.reads})"
    return status


def _file_text(file: Any) -> str:
    from flashruntime.coordinator import schema

    if file.status == schema.WAITS:
        return "waits to be imported: db upgrade copies it into the database" if file.problem is None \
            else "cannot be imported: " + _store_text(file.version, empty=False)
    if file.status == schema.SET_ASIDE:
        return f"imported before: db upgrade renames it {file.name}.imported"
    return f"imported before and not read (a {file.name}.imported is kept already): move it away"


def _rows(rows: list[tuple[str, str, str]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(2)]
    return [f"{name:<{widths[0]}}  {version:<{widths[1]}}  {text}" for name, version, text in rows]


def _print_report(report: Any) -> None:
    print(f"database  {_shown(report.database)}")
    empty = report.empty
    rows = [(store.store, store.stored or "-", _store_text(store, empty)) for store in report.stores]
    rows += [(file.name, file.version.stored or "-", _file_text(file)) for file in report.files]
    for line in _rows(rows):
        print(line)
    if report.problems:
        print("unusable by this flashruntime: see the messages below")
    elif empty:
        print(_EMPTY)
    elif report.needs_upgrade:
        print("needs upgrade: stop the coordinator, back the database up, then run flashruntime db upgrade "
              "(serve would run it at start)")
    else:
        print("current")


def _report_json(report: Any) -> dict[str, Any]:
    return {
        "database": str(report.database),
        "kind": report.database.kind,
        "status": report.status,
        "stores": [{"store": store.store, "version": store.stored, "reads": store.reads, "status": store.status}
                   for store in report.stores],
        "files": [{"file": file.name, "path": str(file.path), "version": file.version.stored, "status": file.status}
                  for file in report.files],
        "problems": report.problems,
    }


# --- upgrade -------------------------------------------------------------------------


def handle_upgrade(args: argparse.Namespace) -> int:
    from flashruntime.coordinator.schema import upgrade_schema
    from flashruntime.errors import SchemaVersionError, StoreError

    try:
        settings = coordinator_settings(args.data_dir, args.database_url, os.environ)
    except CommandError as exc:
        return _fail("upgrade", exc)
    database = settings.database
    try:
        done = upgrade_schema(settings)
    except SchemaVersionError as exc:
        return _fail("upgrade", CommandError(f"nothing changed: {exc}", EXIT_UNUSABLE))
    except StoreError as exc:
        return _fail("upgrade", CommandError(f"cannot use the database {database}: {exc}", EXIT_UNUSABLE))
    except (RuntimeError, sqlite3.Error, OSError) as exc:
        return _fail("upgrade", CommandError(
            f"the upgrade of {database} failed: {exc}. Every store's migration runs in one transaction and each "
            "file's import in one of its own, so the step that failed changed nothing: flashruntime db check "
            "shows where the database stands", EXIT_UNUSABLE))
    changes = _changes(done)
    if args.json:
        print(json.dumps({"database": str(done.after.database), "kind": done.after.database.kind,
                          "status": done.after.status, "stores": changes, "imported": done.imported}, indent=2))
        return EXIT_CURRENT
    print(f"database  {_shown(done.after.database)}")
    rows = [(change["store"], f"{change['before'] or '-'} -> {change['after'] or '-'}", change["change"])
            for change in changes]
    rows += [(name, "", f"imported {rows_copied} rows; the file is kept as {name}.imported" if rows_copied
              else f"imported before; the file is kept as {name}.imported") for name, rows_copied in done.imported.items()]
    for line in _rows(rows):
        print(line)
    changed = any(change["change"] != "unchanged" for change in changes) or bool(done.imported)
    print("upgraded: the database is current" if changed else "nothing to do: the database was current")
    return EXIT_CURRENT


def _changes(done: Any) -> list[dict[str, Any]]:
    changes = []
    for before, after in zip(done.before.stores, done.after.stores):
        if before.stored == after.stored:
            change = "unchanged"
        elif before.stored is None:
            change = "created"
        else:
            change = "upgraded"
        changes.append({"store": after.store, "before": before.stored, "after": after.stored, "change": change})
    return changes


# --- shared --------------------------------------------------------------------------


def _shown(database: Any) -> str:
    """The SQLite file's path, or the URL with its password masked."""
    return str(database.path) if database.kind == "sqlite" else str(database)


def _fail(action: str, error: CommandError) -> int:
    print(f"flashruntime db {action}: {error}", file=sys.stderr)
    return error.code
