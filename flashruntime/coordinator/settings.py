"""``RuntimeSettings``: the coordinator's configuration, one typed model read from the
environment (``pydantic-settings``, in the ``service`` extra).

Every field is read from its ``FLASHML_*`` variable when an instance is built, so
``RuntimeSettings()`` reflects the environment of that moment; keyword arguments win
over the environment. ``from_env(env)`` reads a given mapping instead. A value that does
not parse raises ``ValueError`` naming the variable, what it must be, and what it was.
Token variables are read by ``flashruntime.coordinator.auth``, not here: they are
secrets, and parsing them is that module's job.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from flashruntime.db.url import FORMS, DatabaseURL, mask_password, parse_database_url, sqlite_url
from flashruntime.ray_backend.cluster import ADDRESS_FORMS, parse_ray_address

__all__ = ["DEFAULT_RATE_LIMIT", "RuntimeSettings"]

DEFAULT_RATE_LIMIT = 100.0  # requests per second per credential when tokens are configured

# The mapping ``from_env`` reads instead of the process environment, while it builds an instance.
_GIVEN_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("flashruntime_settings_env", default=None)


def _setting(default: Any, env: str, expected: str, description: str, **constraints: Any) -> Any:
    """A field read from ``env``, or set by its own name; ``expected`` goes into the error
    message of a value that does not parse, ``description`` into the reference docs."""
    return Field(default, validation_alias=AliasChoices(env), description=description,
                 json_schema_extra={"env": env, "expected": expected}, **constraints)


class RuntimeSettings(BaseSettings):
    """What ``create_app`` wires. Paths default to the container convention (``/data``);
    ``flashruntime serve`` resolves its own (``--data-dir``)."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", populate_by_name=True,
                                      validate_default=False)

    profile: str = _setting("local", "FLASHML_PROFILE", "a name", "a label for this deployment, shown by /healthz")
    ledger_path: str = _setting(
        "/data/flashruntime.db", "FLASHML_LEDGER_PATH", "a file path",
        "the coordinator's database: jobs, events, tasks and leases, nodes and cordons, checkpoint "
        "manifests (leases.db / checkpoints.db of an older layout beside it are imported once)")
    database_url: str | None = _setting(
        None, "FLASHML_DATABASE_URL", FORMS,
        "the coordinator's database as a URL: sqlite:///absolute/path (a SQLite file) or "
        "postgresql://user:password@host:port/database (also postgres://; needs the postgres extra; several "
        "coordinator replicas may share it); unset: the SQLite file at FLASHML_LEDGER_PATH")
    artifacts_dir: str = _setting("/data/artifacts", "FLASHML_LOCAL_ARTIFACTS_DIR", "a directory path",
                                  "where artifacts are stored (a shared file system path for several replicas)")
    join_code: str | None = _setting(None, "FLASHML_JOIN_CODE", "a string",
                                     "a code a node must send to register (X-FlashML-Join-Code); unset: none")
    max_artifact_mb: int = _setting(256, "FLASHML_MAX_ARTIFACT_MB", "a whole number of MiB > 0",
                                    "the largest artifact upload, in MiB (413 above)", gt=0)
    sweep_interval_s: float = _setting(
        2.0, "FLASHML_SWEEP_INTERVAL_S", "a number of seconds, finite and > 0",
        "how often silent leases are expired: a lost worker's task is requeued within its lease_seconds plus this",
        gt=0, allow_inf_nan=False)
    rendezvous_port: int | None = _setting(
        None, "FLASHML_RENDEZVOUS_PORT", "a TCP port 1..65535",
        "the port of the c10d rendezvous store 'flashruntime serve' hosts for multi-node jobs (parameters.nodes), "
        "which every node's torchrun joins, so that losing a node never loses the rendezvous; PyTorch's TCPStore "
        "listens on every interface without authentication; needs PyTorch on the coordinator's machine; unset: "
        "multi-node jobs are refused (422)", ge=1, le=65535)
    tensorboard_dir: str | None = _setting(
        None, "FLASHML_TENSORBOARD_DIR", "a directory path",
        "where every committed task's metrics are written as TensorBoard event files, one directory per task under "
        "one per job (<name>-<job id>/<task>/), from the files its worker uploaded; needs the tensorboard extra; "
        "unset: none")
    mlflow_uri: str | None = _setting(
        None, "FLASHML_MLFLOW_URI", "an MLflow tracking URI",
        "the MLflow tracking store every committed task is logged to, from the files its worker uploaded: one run "
        "per task (params, metric history, final figures, output files) under one parent run per job "
        "(<name>-<job id>), e.g. http://mlflow:5000 or sqlite:////srv/mlflow.db; needs the mlflow extra; unset: none")
    mlflow_experiment: str = _setting(
        "flashruntime", "FLASHML_MLFLOW_EXPERIMENT", "an MLflow experiment name",
        "the MLflow experiment the runs of FLASHML_MLFLOW_URI go into (made when missing)", min_length=1)
    hang_cordon_after: int = _setting(
        3, "FLASHML_HANG_CORDON_AFTER", "a whole number >= 0",
        "a node whose attempts hang this many times within FLASHML_HANG_CORDON_WINDOW_S (as its worker's hang watch "
        "reports them) is cordoned for that long; 0: never", ge=0)
    hang_cordon_window_s: float = _setting(
        3600.0, "FLASHML_HANG_CORDON_WINDOW_S", "a number of seconds, finite and > 0",
        "the window in which a node's hung attempts are counted, and how long the cordon they cause lasts",
        gt=0, allow_inf_nan=False)
    max_json_kb: int = _setting(1024, "FLASHML_MAX_JSON_KB", "a whole number of KiB > 0",
                                "the largest JSON request body, in KiB (413 above, before it is read)", gt=0)
    max_tasks_per_job: int = _setting(
        10_000, "FLASHML_MAX_TASKS_PER_JOB", "a whole number > 0",
        "the most tasks one job may expand into (trials, task_params, a grid's product, shards): 422 above, counted "
        "from the spec before any task is built", gt=0)
    max_job_mb: int = _setting(
        64, "FLASHML_MAX_JOB_MB", "a whole number of MiB > 0",
        "the most bytes one job's task payloads may come to together, in MiB: 413 above, refused while the job is "
        "expanded, before anything is stored", gt=0)
    max_jobs_in_flight: int = _setting(
        100, "FLASHML_MAX_JOBS_IN_FLIGHT", "a whole number > 0",
        "the most unfinished jobs one submitter may have (open mode: all callers together): 429 with Retry-After "
        "above", gt=0)
    max_pending_tasks: int = _setting(
        100_000, "FLASHML_MAX_PENDING_TASKS", "a whole number > 0",
        "the most queued (not yet claimed) tasks one submitter's jobs may have, this job's included (open mode: all "
        "callers together): 429 with Retry-After above", gt=0)
    rate_limit_per_s: float | None = _setting(
        None, "FLASHML_RATE_LIMIT", "a number of requests per second, finite and >= 0 (0: off)",
        f"requests per second each credential may make, in bursts of twice that (429 beyond); unset: "
        f"{DEFAULT_RATE_LIMIT:g} when tokens are configured, off in open mode; 0: off",
        ge=0, allow_inf_nan=False)
    metrics_public: bool = _setting(False, "FLASHML_METRICS_PUBLIC", "1 or 0",
                                    "1: GET /metrics without a token even when tokens are configured")
    require_node_auth: bool = _setting(False, "FLASHML_REQUIRE_NODE_AUTH", "1 or 0",
                                       "1: refuse to start without tokens (fail closed)")
    ray_address: str | None = _setting(
        None, "FLASHML_RAY_ADDRESS", ADDRESS_FORMS,
        "a Ray cluster to run backend 'ray' jobs on (then the default backend): local (an embedded "
        "single-node Ray, for development), auto (the cluster of this machine), ray://host:port (through the "
        "Ray Client) or host:port; needs the ray extra; unset: jobs for Ray are refused (503)")
    min_free_bytes: int = _setting(
        64 * 1024 * 1024, "FLASHML_MIN_FREE_BYTES", "a whole number of bytes >= 0 (0: no floor)",
        "the free space the data directory and the artifacts directory must each keep: below it /readyz answers "
        "503 and artifact uploads are refused with 503 and Retry-After until space frees", ge=0)
    max_connections: int = _setting(
        10_000, "FLASHML_MAX_CONNECTIONS", "a whole number > 0",
        "the most client connections one server process holds open (further capped by its open-file limit, less "
        "a reserve for its own files); at the bound a new connection displaces the longest-idle one", gt=0)
    keep_alive_s: float = _setting(
        5.0, "FLASHML_KEEP_ALIVE_S", "a number of seconds, finite and > 0",
        "how long a connection may sit idle (before its first request or between requests) before it is closed",
        gt=0, allow_inf_nan=False)
    accept_error_log_interval_s: float = _setting(
        60.0, "FLASHML_ACCEPT_ERROR_LOG_INTERVAL_S", "a number of seconds, finite and > 0",
        "connections refused for want of file descriptors are logged at most once per this interval, with a count "
        "of those not logged", gt=0, allow_inf_nan=False)
    auth_failure_limit: int = _setting(
        20, "FLASHML_AUTH_FAILURE_LIMIT", "a whole number >= 0 (0: off)",
        "failed authentications one client address may make per FLASHML_AUTH_FAILURE_WINDOW_S; beyond it every "
        "request of that address that needs a token is answered 429 with Retry-After until the window ends", ge=0)
    auth_failure_window_s: float = _setting(
        60.0, "FLASHML_AUTH_FAILURE_WINDOW_S", "a number of seconds, finite and > 0",
        "the window over which failed authentications are counted per client address", gt=0, allow_inf_nan=False)
    trusted_proxies: str = _setting(
        "", "FLASHML_TRUSTED_PROXIES", "comma-separated IP addresses or networks, e.g. 10.0.0.5,10.1.0.0/16",
        "the reverse proxies in front of the coordinator: from them alone X-Forwarded-For and X-Forwarded-Proto "
        "are believed, so a client address (the failed-authentication limit's key, the access log) is the one they "
        "forward; unset: no proxy, every address is the connection's own and forwarded headers are ignored")

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            networks = []
            for entry in (entry.strip() for entry in value.split(",")):
                if not entry:
                    continue
                try:
                    # Canonical form: the server takes a network with host bits set (10.1.0.5/16)
                    # for a literal name that no address ever equals.
                    networks.append(str(ipaddress.ip_network(entry, strict=False)))
                except ValueError:
                    raise ValueError(f"{entry!r} is not an IP address or network (e.g. 10.0.0.5 or "
                                     "10.1.0.0/16)") from None
            return ",".join(networks)
        return value

    @field_validator("join_code", "mlflow_uri", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("database_url", mode="before")
    @classmethod
    def _database_url(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return None
            parse_database_url(value)  # the form only: opening it is the stores' job
        return value

    @field_validator("ray_address", mode="before")
    @classmethod
    def _ray_address(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return None
            return parse_ray_address(value)
        return value

    @field_validator("rate_limit_per_s", mode="before")
    @classmethod
    def _blank_rate_is_default(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("metrics_public", "require_node_auth", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip() not in ("0", "1", ""):
                raise ValueError("not 1 or 0")
            return value.strip() == "1"
        return value

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ValueError(_explain(exc)) from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeSettings:
        """An instance from ``env`` (default: the process environment). A malformed value
        raises ``ValueError`` naming its variable."""
        token = _GIVEN_ENV.set(env)
        try:
            return cls()
        finally:
            _GIVEN_ENV.reset(token)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = _GIVEN_ENV.get()
        return (init_settings, env_settings if given is None else _Mapping(settings_cls, given))

    def rate_limit_for(self, enforcing: bool) -> float:
        """Requests per second per credential in force (0: no limit)."""
        if self.rate_limit_per_s is None:
            return DEFAULT_RATE_LIMIT if enforcing else 0.0
        return self.rate_limit_per_s

    @property
    def database(self) -> DatabaseURL:
        """The database the coordinator opens: ``database_url`` when set, else the SQLite file
        at ``ledger_path``."""
        if self.database_url:
            return parse_database_url(self.database_url, source="FLASHML_DATABASE_URL")
        return sqlite_url(self.ledger_path)

    @property
    def data_dir(self) -> Path:
        """The directory of the SQLite database (of ``ledger_path`` when the database is
        PostgreSQL); an older layout's ``leases.db`` and ``checkpoints.db`` sat beside it,
        and are imported from there on the first start."""
        database = self.database
        if database.path is not None and self.database_url:
            return database.path.parent
        return Path(self.ledger_path).expanduser().parent

    @property
    def leases_path(self) -> Path:
        return self.data_dir / "leases.db"

    @property
    def checkpoints_path(self) -> Path:
        return self.data_dir / "checkpoints.db"


class _Mapping(PydanticBaseSettingsSource):
    """The variables of a given mapping, as the environment source reads the process's."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = variables().get(field_name, "")
        return self._env.get(variable), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {name: self._env[variable] for name, variable in variables().items() if variable in self._env}


def variables() -> dict[str, str]:
    """``{field name: environment variable}`` of every setting."""
    return {name: field.json_schema_extra["env"]  # type: ignore[index]
            for name, field in RuntimeSettings.model_fields.items()}


def _explain(exc: ValidationError) -> str:
    fields = RuntimeSettings.model_fields
    problems = []
    for error in exc.errors():
        name = next((str(part) for part in error.get("loc", ()) if str(part) in fields
                     or str(part) in variables().values()), None)
        field_name = next((n for n, v in variables().items() if v == name), name)
        field = fields.get(field_name or "")
        extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
        variable, expected = extra.get("env", name), extra.get("expected", "valid")
        given = error.get("input")
        if field_name == "database_url" and isinstance(given, str):
            given = mask_password(given)  # a URL may carry a password: never echo it
        problems.append(f"{variable} must be {expected}, got {given!r}")
    return "; ".join(problems) or str(exc)
