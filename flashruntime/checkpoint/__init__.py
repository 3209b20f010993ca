"""Checkpoints you can trust: local step directories whose manifest is
written last and verified by sha256, and the coordinator's catalog of committed
manifests over a memory or SQLite store.
"""

from flashruntime.checkpoint.catalog import CheckpointCatalog, CheckpointError
from flashruntime.checkpoint.local import (
    MANIFEST_NAME,
    latest_valid_manifest,
    open_part,
    verify_manifest,
    write_manifest,
)
from flashruntime.checkpoint.sqlite_store import SqliteManifestStore
from flashruntime.checkpoint.store import InMemoryManifestStore, ManifestStore

__all__ = [
    "MANIFEST_NAME",
    "open_part",
    "write_manifest",
    "verify_manifest",
    "latest_valid_manifest",
    "CheckpointCatalog",
    "CheckpointError",
    "ManifestStore",
    "InMemoryManifestStore",
    "SqliteManifestStore",
]
