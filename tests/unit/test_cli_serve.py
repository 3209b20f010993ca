"""``flashruntime serve`` without a network: path resolution (``--data-dir`` >
FLASHML_LEDGER_PATH / FLASHML_LOCAL_ARTIFACTS_DIR > ./flashruntime-data), exit 2 for invalid
settings, a missing service extra or an open coordinator beyond loopback, and the handler
wiring a fake ``create_app`` into a recorded ``uvicorn.run``. The real server over HTTP is
an integration test."""

from __future__ import annotations

import argparse
import inspect
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from flashruntime.cli import serve
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.errors import AuthConfigError, StoreError

ENV_NAMES = ("FLASHML_LEDGER_PATH", "FLASHML_LOCAL_ARTIFACTS_DIR", "FLASHML_MAX_ARTIFACT_MB", "FLASHML_SWEEP_INTERVAL_S",
             "FLASHML_PROFILE", "FLASHML_METRICS_PUBLIC", "FLASHML_RATE_LIMIT", "FLASHML_REQUIRE_NODE_AUTH",
             "FLASHML_NODE_TOKENS", "FLASHML_OPERATOR_TOKENS", "FLASHML_SUBMITTER_TOKENS", "FLASHML_ARGV_SUBMITTERS",
             "FLASHML_DATABASE_URL", "FLASHML_RAY_ADDRESS", "FLASHML_NODE_POOLS", "FLASHML_UNSANDBOXED_NODES",
             "FLASHML_JOIN_CODE_POOLS", "FLASHML_JOIN_CODE_UNSANDBOXED")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flashruntime")
    serve.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # the ./flashruntime-data default lands in the test's directory


class FakeApp:
    """``create_app`` and ``uvicorn.run`` stand-ins that record what they were given."""

    def __init__(self) -> None:
        self.settings: list[RuntimeSettings] = []
        self.runs: list[dict[str, Any]] = []
        self.app = object()
        self.error: Exception | None = None
        self.on_run: Any = None

    def create_app(self, settings: RuntimeSettings | None = None) -> object:
        if self.error is not None:
            raise self.error
        assert settings is not None
        self.settings.append(settings)
        return self.app

    def run(self, app: object, **kwargs: Any) -> None:
        self.runs.append({"app": app, **kwargs})
        if self.on_run is not None:
            self.on_run()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApp:
    uvicorn = pytest.importorskip("uvicorn")
    fake = FakeApp()
    real_run = uvicorn.run

    def run(app: object, **kwargs: Any) -> None:
        inspect.signature(real_run).bind(app, **kwargs)  # the call the real uvicorn.run accepts
        fake.run(app, **kwargs)

    monkeypatch.setattr(uvicorn, "run", run)
    app_module = types.ModuleType("flashruntime.coordinator.app")
    app_module.create_app = fake.create_app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashruntime.coordinator.app", app_module)
    return fake


# --- resolve_paths --------------------------------------------------------------

D = "/srv/fr"
LEDGER_ENV, ARTIFACTS_ENV = "/env/ledger/l.db", "/env/blobs"
DEFAULT_LEDGER, DEFAULT_ARTIFACTS = Path("flashruntime-data/flashruntime.db"), Path("flashruntime-data/artifacts")


@pytest.mark.parametrize(("data_dir", "env", "expected"), [
    (D, {"FLASHML_LEDGER_PATH": LEDGER_ENV, "FLASHML_LOCAL_ARTIFACTS_DIR": ARTIFACTS_ENV},
     (Path(D, "flashruntime.db"), Path(D, "artifacts"))),
    (D, {"FLASHML_LEDGER_PATH": LEDGER_ENV}, (Path(D, "flashruntime.db"), Path(D, "artifacts"))),
    (D, {"FLASHML_LOCAL_ARTIFACTS_DIR": ARTIFACTS_ENV}, (Path(D, "flashruntime.db"), Path(D, "artifacts"))),
    (D, {}, (Path(D, "flashruntime.db"), Path(D, "artifacts"))),
    (None, {"FLASHML_LEDGER_PATH": LEDGER_ENV, "FLASHML_LOCAL_ARTIFACTS_DIR": ARTIFACTS_ENV},
     (Path(LEDGER_ENV), Path(ARTIFACTS_ENV))),
    (None, {"FLASHML_LEDGER_PATH": LEDGER_ENV}, (Path(LEDGER_ENV), DEFAULT_ARTIFACTS)),
    (None, {"FLASHML_LOCAL_ARTIFACTS_DIR": ARTIFACTS_ENV}, (DEFAULT_LEDGER, Path(ARTIFACTS_ENV))),
    (None, {}, (DEFAULT_LEDGER, DEFAULT_ARTIFACTS)),
    (None, {"FLASHML_LEDGER_PATH": "", "FLASHML_LOCAL_ARTIFACTS_DIR": ""}, (DEFAULT_LEDGER, DEFAULT_ARTIFACTS)),
    ("rel", {}, (Path("rel/flashruntime.db"), Path("rel/artifacts"))),
], ids=["dir-beats-both-env", "dir-beats-ledger-env", "dir-beats-artifacts-env", "dir-alone", "both-env",
        "ledger-env-only", "artifacts-env-only", "defaults", "empty-env-is-unset", "relative-dir-stays-relative"])
def test_resolve_paths_precedence(data_dir: str | None, env: dict[str, str], expected: tuple[Path, Path]) -> None:
    assert serve.resolve_paths(data_dir, env) == expected


# --- the handler ----------------------------------------------------------------


@pytest.mark.service
def test_serve_wires_create_app_into_uvicorn_with_resolved_settings(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_PROFILE", "dev")
    monkeypatch.setenv("FLASHML_LEDGER_PATH", str(tmp_path / "ignored" / "l.db"))  # --data-dir wins
    data = tmp_path / "data"
    args = _args("--host", "0.0.0.0", "--port", "9123", "--data-dir", str(data), "--log-level", "warning",
                 "--insecure")
    assert serve.handle(args) == 0
    [settings] = fake.settings
    assert settings.ledger_path == str(data / "flashruntime.db")
    assert settings.artifacts_dir == str(data / "artifacts")
    assert settings.profile == "dev"  # everything else still comes from the environment
    assert data.is_dir() and (data / "artifacts").is_dir()
    assert not (tmp_path / "ignored").exists()
    from flashruntime.coordinator.listener import BoundedH11Protocol, listen_backlog, open_file_limit

    assert fake.runs == [{"app": fake.app, "host": "0.0.0.0", "port": 9123, "log_level": "warning",
                          "ssl_certfile": None, "ssl_keyfile": None, "workers": 1, "factory": False,
                          "http": BoundedH11Protocol, "timeout_keep_alive": 5.0,
                          "backlog": listen_backlog(open_file_limit()), "proxy_headers": False,
                          "forwarded_allow_ips": ""}]
    out = capsys.readouterr()
    assert "http://0.0.0.0:9123" in out.out and str(data) in out.out
    assert "WARNING: no tokens are configured, so this coordinator is open" in out.err


@pytest.mark.service
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "box.example.com"])
def test_an_open_coordinator_beyond_loopback_refuses_to_start_without_insecure(
    fake: FakeApp, tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    assert serve.handle(_args("--host", host, "--data-dir", str(tmp_path / "d"))) == 2
    err = capsys.readouterr().err
    assert f"refusing to serve an open coordinator on {host}" in err and "--insecure" in err
    assert fake.settings == [] and fake.runs == []


@pytest.mark.service
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_an_open_coordinator_on_loopback_starts_with_a_warning(
    fake: FakeApp, tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    assert serve.handle(_args("--host", host, "--data-dir", str(tmp_path / "d"))) == 0
    assert fake.runs[0]["host"] == host
    assert "WARNING: no tokens are configured" in capsys.readouterr().err


@pytest.mark.service
def test_with_tokens_plain_http_beyond_loopback_starts_with_a_clear_text_warning(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_SUBMITTER_TOKENS", "alice:tok-a")
    assert serve.handle(_args("--host", "0.0.0.0", "--data-dir", str(tmp_path / "d"))) == 0
    err = capsys.readouterr().err
    assert "tokens cross the network in clear text" in err and "no tokens are configured" not in err


@pytest.mark.service
def test_tls_needs_both_files_and_passes_them_to_uvicorn(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve.handle(_args("--ssl-certfile", "c.pem", "--data-dir", str(tmp_path / "d"))) == 2
    assert "--ssl-certfile and --ssl-keyfile go together" in capsys.readouterr().err
    monkeypatch.setenv("FLASHML_OPERATOR_TOKENS", "root:tok-r")
    args = _args("--host", "0.0.0.0", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem", "--data-dir",
                 str(tmp_path / "d"))
    assert serve.handle(args) == 0
    assert (fake.runs[0]["ssl_certfile"], fake.runs[0]["ssl_keyfile"]) == ("c.pem", "k.pem")
    out = capsys.readouterr()
    assert "https://0.0.0.0:8100" in out.out and "WARNING" not in out.err


@pytest.mark.service
def test_a_bad_token_configuration_exits_2_before_anything_starts(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_ARGV_SUBMITTERS", "alice")  # a grant, but no tokens at all
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 2
    assert "FLASHML_ARGV_SUBMITTERS grants code execution but no tokens are configured" in capsys.readouterr().err
    assert fake.runs == []


def test_a_bad_node_grant_exits_2_before_anything_starts(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_NODE_TOKENS", "box-1:tok-box")
    monkeypatch.setenv("FLASHML_NODE_POOLS", "box-2:ml")  # a node without a token
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 2
    assert "FLASHML_NODE_POOLS entry 1 (node 'box-2') names a node with no token" in capsys.readouterr().err
    assert fake.runs == []


@pytest.mark.service
def test_serve_defaults_and_env_paths_each_resolve_on_their_own(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_LEDGER_PATH", str(tmp_path / "ledger-here" / "x.db"))
    assert serve.handle(_args()) == 0
    [settings] = fake.settings
    assert settings.ledger_path == str(tmp_path / "ledger-here" / "x.db")
    assert settings.artifacts_dir == str(tmp_path / "flashruntime-data" / "artifacts")  # absolute, from the cwd
    assert settings.leases_path == tmp_path / "ledger-here" / "leases.db"
    assert (tmp_path / "ledger-here").is_dir() and (tmp_path / "flashruntime-data" / "artifacts").is_dir()
    assert fake.runs[0]["host"] == "127.0.0.1" and fake.runs[0]["port"] == 8100 and fake.runs[0]["log_level"] == "info"
    assert "http://127.0.0.1:8100" in capsys.readouterr().out


@pytest.mark.service
@pytest.mark.parametrize(("name", "value", "message"), [
    ("FLASHML_MAX_ARTIFACT_MB", "lots", "FLASHML_MAX_ARTIFACT_MB must be a whole number of MiB > 0, got 'lots'"),
    ("FLASHML_SWEEP_INTERVAL_S", "soon", "FLASHML_SWEEP_INTERVAL_S must be a number of seconds, finite and > 0, "
                                         "got 'soon'"),
    ("FLASHML_SWEEP_INTERVAL_S", "0", "FLASHML_SWEEP_INTERVAL_S must be a number of seconds, finite and > 0, got '0'"),
    ("FLASHML_SWEEP_INTERVAL_S", "nan", "FLASHML_SWEEP_INTERVAL_S must be a number of seconds, finite and > 0, "
                                        "got 'nan'"),
])
def test_invalid_settings_exit_2_before_anything_starts(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    name: str, value: str, message: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 2
    assert message in capsys.readouterr().err
    assert fake.settings == [] and fake.runs == []
    assert not (tmp_path / "d").exists()


@pytest.mark.service
@pytest.mark.parametrize("error", [
    AuthConfigError("FLASHML_NODE_TOKENS: 'abc' is not token=node_id"),
    RuntimeError("FLASHML_REQUIRE_NODE_AUTH=1 but no node tokens are configured"),
])
def test_create_app_refusing_the_settings_exits_2(
    fake: FakeApp, tmp_path: Path, capsys: pytest.CaptureFixture[str], error: Exception
) -> None:
    fake.error = error
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 2
    out = capsys.readouterr()
    assert f"flashruntime serve: invalid settings: {error}" in out.err
    assert "http://" not in out.out  # nothing announced as serving
    assert fake.runs == []


@pytest.mark.parametrize("missing", ["uvicorn", "fastapi"])
def test_missing_service_extra_exits_2_with_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    # Refuse the module as an install without the extra would (sys.modules[name] = None makes
    # `import name` raise ImportError); without fastapi, importing the app module fails.
    monkeypatch.setitem(sys.modules, missing, None)
    if missing == "fastapi":
        monkeypatch.setitem(sys.modules, "flashruntime.coordinator.app", None)
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 2
    assert "install the service extra: pip install 'flashruntime[service]'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


@pytest.mark.service
def test_data_dir_that_cannot_be_created_exits_2(fake: FakeApp, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("in the way")
    assert serve.handle(_args("--data-dir", str(tmp_path / "file" / "d"))) == 2
    assert f"cannot create directory {str(tmp_path / 'file' / 'd')!r}" in capsys.readouterr().err
    assert fake.runs == []


# --- the database URL -----------------------------------------------------------

PG_URL = "postgresql://fr:s3cret@db.example:5433/flashruntime"
PG_SHOWN = "postgresql://fr:***@db.example:5433/flashruntime"


@pytest.mark.service
def test_database_url_wins_over_the_environment_and_is_shown_without_its_password(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_DATABASE_URL", "sqlite:///ignored/fr.db")
    assert serve.handle(_args("--database-url", PG_URL, "--data-dir", str(tmp_path / "d"))) == 0
    [settings] = fake.settings
    assert settings.database_url == PG_URL and settings.database.kind == "postgresql"
    assert settings.artifacts_dir == str(tmp_path / "d" / "artifacts")  # --data-dir still places the artifacts
    out = capsys.readouterr()
    assert f"database   {PG_SHOWN}" in out.out and "s3cret" not in out.out + out.err
    assert not (tmp_path / "d" / "flashruntime.db").exists()


@pytest.mark.service
def test_the_environment_url_is_used_and_a_sqlite_url_gets_its_directory(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "elsewhere" / "fr.db"
    monkeypatch.setenv("FLASHML_DATABASE_URL", f"sqlite://{path}")
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 0  # a URL is not overridden by --data-dir
    [settings] = fake.settings
    assert settings.database.path == path and path.parent.is_dir()
    assert f"database   {path}" in capsys.readouterr().out


@pytest.mark.service
@pytest.mark.parametrize(("url", "message"), [
    ("mysql://fr:s3cret@db/fr", ("--database-url has the scheme 'mysql://', which is not a database this "
                                 "coordinator opens; write it as sqlite:///")),
    ("sqlite://fr.db", "--database-url 'sqlite://fr.db' does not name an absolute file path"),
])
def test_a_bad_database_url_exits_2_saying_how_to_write_one(
    fake: FakeApp, tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, message: str
) -> None:
    assert serve.handle(_args("--database-url", url, "--data-dir", str(tmp_path / "d"))) == 2
    err = capsys.readouterr().err
    assert f"flashruntime serve: {message}" in err and "s3cret" not in err and "Traceback" not in err
    assert fake.settings == [] and fake.runs == []


@pytest.mark.service
def test_a_bad_database_url_in_the_environment_exits_2_without_its_password(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHML_DATABASE_URL", "mongodb://fr:s3cret@db/fr")
    assert serve.handle(_args("--data-dir", str(tmp_path / "d"))) == 2
    err = capsys.readouterr().err
    assert "invalid settings: FLASHML_DATABASE_URL must be sqlite:///absolute/path/flashruntime.db or " \
           "postgresql://user:password@host:port/database, got 'mongodb://fr:***@db/fr'" in err
    assert "s3cret" not in err and fake.runs == []


@pytest.mark.service
def test_a_database_that_cannot_be_opened_exits_2_naming_it_without_its_password(
    fake: FakeApp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.error = StoreError("PostgreSQL database 'flashruntime' at db.example:5433: the server cannot be reached")
    assert serve.handle(_args("--database-url", PG_URL, "--data-dir", str(tmp_path / "d"))) == 2
    out = capsys.readouterr()
    assert (f"flashruntime serve: cannot use the database {PG_SHOWN}: PostgreSQL database 'flashruntime' at "
            "db.example:5433: the server cannot be reached") in out.err
    assert "s3cret" not in out.out + out.err and "http://" not in out.out and fake.runs == []


# --- shutdown -------------------------------------------------------------------


@pytest.mark.service
def test_ctrl_c_is_a_clean_shutdown(fake: FakeApp, tmp_path: Path) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt  # what uvicorn re-raises after its graceful shutdown on SIGINT

    fake.on_run = interrupt
    assert serve.handle(_args("--data-dir", str(tmp_path))) == 0


@pytest.mark.service
def test_sigterm_is_a_clean_shutdown_and_the_handler_is_restored(fake: FakeApp, tmp_path: Path) -> None:
    # A recording handler stands in for the default one, which would kill pytest.
    leaked: list[int] = []
    outer = signal.signal(signal.SIGTERM, lambda signum, frame: leaked.append(signum))
    try:
        fake.on_run = lambda: signal.raise_signal(signal.SIGTERM)  # uvicorn re-raises it after shutting down
        assert serve.handle(_args("--data-dir", str(tmp_path))) == 0
        assert leaked == []  # serve handled it, not the process-wide handler
        assert signal.getsignal(signal.SIGTERM) is not serve._raise_terminated  # restored
    finally:
        signal.signal(signal.SIGTERM, outer)


@pytest.mark.service
def test_uvicorn_giving_up_exits_1(fake: FakeApp, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def port_in_use() -> None:
        raise SystemExit(1)  # uvicorn's answer to a bind error

    fake.on_run = port_in_use
    assert serve.handle(_args("--data-dir", str(tmp_path))) == 1
    assert "the server stopped with status 1" in capsys.readouterr().err


# --- options --------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--port", "http"], ["--log-level", "loud"],
                                  ["--workers", "0"], ["--workers", "two"]])
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _args(*argv)
    assert exit_info.value.code == 2
    if argv[0] == "--workers":
        assert "--workers must be" in capsys.readouterr().err


# --- worker processes -----------------------------------------------------------


@pytest.mark.service
def test_workers_get_the_app_factory_and_the_resolved_settings_through_the_environment(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app built here only checks the settings and the database, and is closed; each worker
    process builds its own from ``create_app()`` and the environment it inherits."""
    for name in ("FLASHML_LEDGER_PATH", "FLASHML_LOCAL_ARTIFACTS_DIR", "FLASHML_DATABASE_URL"):
        monkeypatch.setenv(name, "")  # restored after the test: the handler sets them for its workers
    closed: list[bool] = []
    fake.app = types.SimpleNamespace(state=types.SimpleNamespace(
        coordinator=types.SimpleNamespace(close=lambda: closed.append(True))))
    data = tmp_path / "data"
    assert serve.handle(_args("--workers", "3", "--data-dir", str(data), "--database-url", PG_URL)) == 0
    assert closed == [True]
    [run] = fake.runs
    assert (run["app"], run["workers"], run["factory"]) == ("flashruntime.coordinator.app:create_app", 3, True)
    assert os.environ["FLASHML_DATABASE_URL"] == PG_URL
    assert os.environ["FLASHML_LOCAL_ARTIFACTS_DIR"] == str(data / "artifacts")
    assert RuntimeSettings.from_env().database.url == PG_URL  # what a worker reads back
    out = capsys.readouterr().out
    assert "workers    3 processes sharing the port" in out and "s3cret" not in out


def test_worker_environment_names_the_database_only_when_a_url_is_set() -> None:
    settings = RuntimeSettings(ledger_path="/d/flashruntime.db", artifacts_dir="/d/artifacts")
    assert serve.worker_environment(settings) == {"FLASHML_LEDGER_PATH": "/d/flashruntime.db",
                                                  "FLASHML_LOCAL_ARTIFACTS_DIR": "/d/artifacts"}
    settings.database_url = PG_URL
    assert serve.worker_environment(settings)["FLASHML_DATABASE_URL"] == PG_URL


@pytest.mark.service
def test_a_ray_address_reaches_the_settings_and_the_workers_and_is_shown(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    monkeypatch.setenv("FLASHML_RAY_ADDRESS", "auto")
    assert serve.handle(_args("--ray-address", "ray://head:10001", "--data-dir", str(tmp_path / "d"))) == 0
    [settings] = fake.settings
    assert settings.ray_address == "ray://head:10001"
    assert "ray        ray://head:10001 (the default backend)" in capsys.readouterr().out
    assert serve.worker_environment(settings)["FLASHML_RAY_ADDRESS"] == "ray://head:10001"


@pytest.mark.service
@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--ray-address", "nowhere"], {}, "--ray-address must be local, auto, ray://host:port or host:port"),
    ([], {"FLASHML_RAY_ADDRESS": "nowhere"}, "invalid settings: FLASHML_RAY_ADDRESS must be local, auto"),
    (["--ray-address", "local", "--workers", "2"], {}, "--ray-address local starts a Ray inside the coordinator"),
])
def test_a_ray_setting_that_cannot_work_exits_2_before_anything_starts(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], env: dict[str, str], message: str,
) -> None:
    pytest.importorskip("ray")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert serve.handle(_args(*argv, "--data-dir", str(tmp_path / "d"))) == 2
    assert message in capsys.readouterr().err
    assert fake.settings == [] and fake.runs == []


@pytest.mark.service
def test_an_unreachable_ray_cluster_exits_2_at_once_saying_what_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("fastapi")
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert serve.handle(_args("--ray-address", f"ray://127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"))) == 2
    err = capsys.readouterr().err
    assert f"cannot connect to the Ray cluster at ray://127.0.0.1:{port}: nothing answers at 127.0.0.1:{port}" in err


@pytest.mark.service
def test_a_ray_address_without_the_ray_extra_exits_2_naming_it(
    fake: FakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as without the extra
    assert serve.handle(_args("--ray-address", "auto", "--data-dir", str(tmp_path / "d"))) == 2
    assert "install the ray extra: pip install 'flashruntime[ray]'" in capsys.readouterr().err
    assert fake.settings == [] and fake.runs == []


def test_url_for_brackets_ipv6() -> None:
    assert serve.url_for("127.0.0.1", 8100) == "http://127.0.0.1:8100"
    assert serve.url_for("::1", 8100) == "http://[::1]:8100"


def test_data_dir_help_names_every_file_kept_there(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _args("--help")
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    settings = RuntimeSettings(ledger_path="D/flashruntime.db", artifacts_dir="D/artifacts")
    for path in (settings.ledger_path, settings.artifacts_dir):
        assert str(path) in help_text
