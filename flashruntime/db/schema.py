"""Schema versions of the stores: what a database's recorded version asks for. Each store
keeps its version in a key/value table of its own (key ``schema_version``); the database
classes run what ``schema_statements`` decides, in their own transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flashruntime.errors import SchemaVersionError

__all__ = ["schema_statements"]


def schema_statements(
    stored: str | None,
    *,
    version: str,
    statements: Sequence[str],
    upgrades: Mapping[str, Sequence[str]],
    where: str,
    what: str,
    fix: str,
) -> Sequence[str] | None:
    """The statements that bring a store's schema from ``stored`` to ``version``: None when it
    is there already, ``statements`` (the whole schema) when none is recorded, ``upgrades[stored]``
    for an older version upgraded in place. Any other version raises ``SchemaVersionError``
    naming ``where`` (the database) and ``what`` (the store), ending with ``fix``. Pure."""
    if stored == version:
        return None
    if stored is None:
        return statements
    if stored in upgrades:
        return upgrades[stored]
    known = "".join(f", and upgrades {old!r} in place" for old in sorted(upgrades))
    raise SchemaVersionError(
        f"{where}: {what} schema version {stored!r} is not one this flashruntime reads (it reads {version!r}{known}); "
        f"{fix}"
    )
