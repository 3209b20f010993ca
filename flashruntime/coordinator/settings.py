"""``RuntimeSettings``: the coordinator's configuration, standard library only.

Each field's default is read from its environment variable when an instance is built,
so ``RuntimeSettings()`` reflects the environment of that moment and tests can set the
environment first. ``from_env`` is the same plus the two node-selector strings parsed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_RATE_LIMIT", "RuntimeSettings", "parse_selector"]

DEFAULT_RATE_LIMIT = 100.0  # requests per second per credential when tokens are configured


def _env(name: str, default: str, env: Mapping[str, str] | None = None) -> str:
    return (os.environ if env is None else env).get(name, default)


def _optional_env(name: str, env: Mapping[str, str] | None = None) -> str | None:
    value = (os.environ if env is None else env).get(name)
    return value if value else None


def parse_selector(text: str | None, *, name: str = "selector") -> dict[str, str]:
    """``"k=v,k=v"`` → ``{k: v}``; blanks and a trailing comma are tolerated. A pair
    without ``=`` or with an empty key raises ``ValueError`` naming ``name``."""
    selector: dict[str, str] = {}
    for raw in (text or "").split(","):
        pair = raw.strip()
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{name}: {pair!r} is not a key=value pair (expected 'k=v,k=v')")
        selector[key.strip()] = value.strip()
    return selector


def _max_artifact_mb(env: Mapping[str, str] | None = None) -> int:
    raw = _env("FLASHML_MAX_ARTIFACT_MB", "256", env)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"FLASHML_MAX_ARTIFACT_MB must be a whole number of MiB, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"FLASHML_MAX_ARTIFACT_MB must be > 0, got {value}")
    return value


def _max_json_kb(env: Mapping[str, str] | None = None) -> int:
    raw = _env("FLASHML_MAX_JSON_KB", "1024", env)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"FLASHML_MAX_JSON_KB must be a whole number of KiB, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"FLASHML_MAX_JSON_KB must be > 0, got {value}")
    return value


def _rate_limit(env: Mapping[str, str] | None = None) -> float | None:
    raw = _env("FLASHML_RATE_LIMIT", "", env).strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"FLASHML_RATE_LIMIT must be a number of requests per second (0: off), got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"FLASHML_RATE_LIMIT must be finite and >= 0 (0: off), got {raw!r}")
    return value


def _sweep_interval_s(env: Mapping[str, str] | None = None) -> float:
    raw = _env("FLASHML_SWEEP_INTERVAL_S", "2.0", env)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"FLASHML_SWEEP_INTERVAL_S must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"FLASHML_SWEEP_INTERVAL_S must be finite and > 0, got {raw!r}")
    return value


@dataclass
class RuntimeSettings:
    """What ``create_app`` wires; every default comes from the environment."""

    profile: str = field(default_factory=lambda: _env("FLASHML_PROFILE", "local"))
    namespace: str = field(default_factory=lambda: _env("FLASHML_NAMESPACE", "flashml"))
    ledger_path: str = field(default_factory=lambda: _env("FLASHML_LEDGER_PATH", "/data/flashruntime.db"))
    enable_kuberay: bool = field(default_factory=lambda: _env("FLASHML_ENABLE_KUBERAY", "1") == "1")
    artifacts_dir: str = field(default_factory=lambda: _env("FLASHML_LOCAL_ARTIFACTS_DIR", "/data/artifacts"))
    join_code: str | None = field(default_factory=lambda: _optional_env("FLASHML_JOIN_CODE"))
    max_artifact_mb: int = field(default_factory=_max_artifact_mb)
    standard_node_selector: dict[str, str] = field(default_factory=dict)
    sandbox_node_selector: dict[str, str] = field(default_factory=dict)
    sandbox_runtime_class: str | None = field(default_factory=lambda: _optional_env("FLASHML_RUNTIME_CLASS"))
    # How often the sweeper expires silent leases: a killed worker's lease is released within
    # lease_seconds + this. FLASHML_SWEEP_INTERVAL_S sets it.
    sweep_interval_s: float = field(default_factory=_sweep_interval_s)
    # Largest request body the JSON routes read, in KiB (artifact uploads have their own
    # limit, max_artifact_mb): a bigger one is refused with 413 before it is read whole.
    max_json_kb: int = field(default_factory=_max_json_kb)
    # Requests per second each credential may make (bursts of twice that), else 429.
    # None: DEFAULT_RATE_LIMIT when tokens are configured, off in open mode; 0: off.
    rate_limit_per_s: float | None = field(default_factory=_rate_limit)
    # GET /metrics without a token even when tokens are configured (a scraper on a trusted network).
    metrics_public: bool = field(default_factory=lambda: _env("FLASHML_METRICS_PUBLIC", "0") == "1")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeSettings:
        """An instance from ``env`` (default: the process environment), both node selectors
        parsed. A malformed value raises ``ValueError`` naming its variable."""
        return cls(
            profile=_env("FLASHML_PROFILE", "local", env),
            namespace=_env("FLASHML_NAMESPACE", "flashml", env),
            ledger_path=_env("FLASHML_LEDGER_PATH", "/data/flashruntime.db", env),
            enable_kuberay=_env("FLASHML_ENABLE_KUBERAY", "1", env) == "1",
            artifacts_dir=_env("FLASHML_LOCAL_ARTIFACTS_DIR", "/data/artifacts", env),
            join_code=_optional_env("FLASHML_JOIN_CODE", env),
            max_artifact_mb=_max_artifact_mb(env),
            standard_node_selector=parse_selector(
                _env("FLASHML_STANDARD_NODE_SELECTOR", "", env), name="FLASHML_STANDARD_NODE_SELECTOR"
            ),
            sandbox_node_selector=parse_selector(
                _env("FLASHML_SANDBOX_NODE_SELECTOR", "", env), name="FLASHML_SANDBOX_NODE_SELECTOR"
            ),
            sandbox_runtime_class=_optional_env("FLASHML_RUNTIME_CLASS", env),
            sweep_interval_s=_sweep_interval_s(env),
            max_json_kb=_max_json_kb(env),
            rate_limit_per_s=_rate_limit(env),
            metrics_public=_env("FLASHML_METRICS_PUBLIC", "0", env) == "1",
        )

    def rate_limit_for(self, enforcing: bool) -> float:
        """Requests per second per credential in force (0: no limit)."""
        if self.rate_limit_per_s is None:
            return DEFAULT_RATE_LIMIT if enforcing else 0.0
        return self.rate_limit_per_s

    @property
    def data_dir(self) -> Path:
        """The directory of the ledger; ``leases.db`` and ``checkpoints.db`` sit beside it."""
        return Path(self.ledger_path).expanduser().parent

    @property
    def leases_path(self) -> Path:
        return self.data_dir / "leases.db"

    @property
    def checkpoints_path(self) -> Path:
        return self.data_dir / "checkpoints.db"
