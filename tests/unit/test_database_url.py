"""Database URLs: the two forms the coordinator opens, refusals that say how to write one,
and a password that is never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.database_url import mask_password, parse_database_url, sqlite_url
from flashruntime.errors import BadDatabaseURL


@pytest.mark.parametrize(("url", "kind", "path"), [
    ("sqlite:///srv/fr/flashruntime.db", "sqlite", Path("/srv/fr/flashruntime.db")),
    ("SQLite:///srv/with%20space.db", "sqlite", Path("/srv/with space.db")),
    ("postgresql://fr:pw@db.example:5433/flashruntime", "postgresql", None),
    ("postgres://fr@db.example/flashruntime?sslmode=require", "postgresql", None),
    ("postgresql:///flashruntime?host=/run/postgresql", "postgresql", None),
])
def test_the_two_forms(url: str, kind: str, path: Path | None) -> None:
    parsed = parse_database_url(url)
    assert (parsed.kind, parsed.path) == (kind, path)
    if kind == "postgresql":
        assert parsed.url.startswith("postgresql://") and parsed.url.split("://", 1)[1] == url.split("://", 1)[1]


@pytest.mark.parametrize(("url", "message"), [
    ("mysql://fr:s3cret@db/fr", (r"has the scheme 'mysql://', which is not a database this coordinator opens; "
                                 r"write it as sqlite:///absolute/path/flashruntime.db or postgresql://")),
    ("/srv/fr/flashruntime.db", r"is not a URL \('/srv/fr/flashruntime.db'\); write it as sqlite:///"),
    ("sqlite://relative.db", r"does not name an absolute file path; write it as sqlite:///absolute/path"),
    ("sqlite:///", r"does not name an absolute file path"),
    ("postgresql://fr:s3cret@db:port/fr", r"'postgresql://fr:\*\*\*@db:port/fr' has a port that is not a number"),
])
def test_other_urls_are_refused_saying_how_to_write_one(url: str, message: str) -> None:
    with pytest.raises(BadDatabaseURL, match=message) as refused:
        parse_database_url(url, source="--database-url")
    assert str(refused.value).startswith("--database-url ") and "s3cret" not in str(refused.value)
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://fr:s3cret@db:5432/fr", "postgresql://fr:***@db:5432/fr"),
    ("postgresql://fr:s%40cret@db/fr?password=s3cret&sslmode=require",
     "postgresql://fr:***@db/fr?password=***&sslmode=require"),
    ("postgresql://fr@db/fr", "postgresql://fr@db/fr"),
    ("sqlite:///srv/fr.db", "sqlite:///srv/fr.db"),
])
def test_the_password_is_masked_wherever_it_is_written(url: str, shown: str) -> None:
    assert mask_password(url) == shown
    parsed = parse_database_url(url)
    assert str(parsed) == shown and shown in repr(parsed) and parsed.masked == shown


def test_a_path_is_a_sqlite_url() -> None:
    assert sqlite_url("/srv/fr.db").url == "sqlite:///srv/fr.db"
    assert sqlite_url(":memory:").path == Path(":memory:")


def test_the_setting_names_the_database_and_never_echoes_a_password() -> None:
    assert RuntimeSettings.from_env({}).database == sqlite_url("/data/flashruntime.db")
    assert RuntimeSettings.from_env({"FLASHML_LEDGER_PATH": "/x/l.db", "FLASHML_DATABASE_URL": " "}).database.path \
        == Path("/x/l.db")
    settings = RuntimeSettings.from_env({"FLASHML_DATABASE_URL": "sqlite:///srv/elsewhere/fr.db",
                                         "FLASHML_LEDGER_PATH": "/x/l.db"})
    assert settings.database.path == Path("/srv/elsewhere/fr.db") and settings.leases_path == Path(
        "/srv/elsewhere/leases.db")
    assert RuntimeSettings.from_env({"FLASHML_DATABASE_URL": "postgres://fr:pw@db/fr"}).database.kind == "postgresql"
    with pytest.raises(ValueError, match=r"FLASHML_DATABASE_URL must be sqlite:///absolute/path/flashruntime.db or "
                                         r"postgresql://user:password@host:port/database, got 'mysql://fr:\*\*\*@db/fr'"
                       ) as refused:
        RuntimeSettings.from_env({"FLASHML_DATABASE_URL": "mysql://fr:s3cret@db/fr"})
    assert "s3cret" not in str(refused.value)
