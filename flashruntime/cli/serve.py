"""``flashruntime serve``: run the coordinator under uvicorn on ``create_app(settings)``.

The database: ``--database-url`` > ``FLASHML_DATABASE_URL`` (``sqlite:///path`` or
``postgresql://...``) > the SQLite file of the paths below. Paths resolve each on its own:
``--data-dir`` (both) > ``FLASHML_LEDGER_PATH`` / ``FLASHML_LOCAL_ARTIFACTS_DIR`` >
``./flashruntime-data/…``. The database is shown with its password masked. With no tokens configured the
coordinator is open, which is for development: ``serve`` warns, and refuses to listen
beyond loopback unless ``--insecure`` says so. Exit codes: 0 clean shutdown (Ctrl-C or
SIGTERM); 1 uvicorn gave up after starting (port in use, lifespan startup failure; its log
says why); 2 the ``service`` extra is missing, the settings are invalid, the database cannot
be opened (a bad URL, the PostgreSQL driver missing, a server that does not answer or
refuses the login), or an open coordinator was asked to listen beyond loopback without
``--insecure``.

``--workers N`` runs N uvicorn worker processes on the one port (the kernel spreads the
connections among them). This process checks the settings and opens the database once
(running any migration) before they start; each worker then builds its own app with
``create_app()`` from the settings this process puts in the environment. What a worker
keeps in memory is its own: the rate limit buckets, the counts of failed authentications,
the connection bound and the ``/metrics`` counters and latency histogram. The expiry
sweep runs in each of them on SQLite (the sweeps take turns on the database's write lock,
and each re-reads the leases inside its transaction) and in one of them on PostgreSQL
(the advisory lock).

Under connection pressure: the soft open-file limit is raised to the hard one at start,
each server process holds at most ``FLASHML_MAX_CONNECTIONS`` connections (fewer when its
open-file limit, less a reserve, is lower; at the bound the longest-idle connection gives
way to a new one), a connection idle for ``FLASHML_KEEP_ALIVE_S`` is closed, and accepts
that fail for want of descriptors are logged once per ``FLASHML_ACCEPT_ERROR_LOG_INTERVAL_S``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flashruntime.cli._arguments import whole_number
from flashruntime.errors import CommandError

EXIT_OK, EXIT_SERVER_FAILED, EXIT_CONFIG = 0, 1, 2

DEFAULT_DATA_DIR = Path("flashruntime-data")
LEDGER_NAME = "flashruntime.db"
ARTIFACTS_NAME = "artifacts"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's names
SERVICE_HINT = "install the service extra: pip install 'flashruntime[service]'"
# What a worker process builds its app from (``--workers``): it reads its settings from the environment.
APP_FACTORY = "flashruntime.coordinator.app:create_app"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the coordinator (jobs, leases, artifacts, checkpoints) over HTTP",
        description="Run the coordinator under uvicorn. Data goes to --data-dir, else FLASHML_LEDGER_PATH / "
                    "FLASHML_LOCAL_ARTIFACTS_DIR, else ./flashruntime-data; --database-url (or "
                    "FLASHML_DATABASE_URL) puts the database elsewhere, PostgreSQL included. Needs the service extra.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8100, help="port to bind (default 8100)")
    add_database_options(parser)
    parser.add_argument("--workers", type=whole_number("--workers", 1), default=1, metavar="N",
                        help="uvicorn worker processes sharing the port (default 1), on SQLite or PostgreSQL; "
                             "each keeps its own rate limit buckets and /metrics counters")
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS",
                        help="run backend 'ray' jobs (then the default) on this Ray cluster: local (an embedded "
                             "single-node Ray, for development), auto, ray://host:port or host:port; needs "
                             "pip install 'flashruntime[ray]'; overrides FLASHML_RAY_ADDRESS")
    parser.add_argument("--rendezvous-port", type=_port, default=None, metavar="PORT",
                        help="host the c10d rendezvous store of multi-node jobs (parameters.nodes) at PORT (on every "
                             "interface, without authentication: PyTorch's TCPStore), so that losing a node never "
                             "loses the rendezvous; needs PyTorch here; overrides FLASHML_RENDEZVOUS_PORT")
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="uvicorn log level (default info)")
    parser.add_argument("--ssl-certfile", default=None, metavar="PEM",
                        help="serve HTTPS with this certificate (chain) file; needs --ssl-keyfile")
    parser.add_argument("--ssl-keyfile", default=None, metavar="PEM", help="the certificate's private key file")
    parser.add_argument("--insecure", action="store_true",
                        help="allow an open coordinator (no tokens configured) to listen beyond loopback: "
                             "anyone who reaches it can submit jobs and run code on trusted workers")
    parser.set_defaults(handler=handle)


def add_database_options(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--database-url``, as ``serve`` and ``db`` take them."""
    parser.add_argument("--data-dir", default=None, metavar="D",
                        help=f"D/{LEDGER_NAME} (the coordinator's database: jobs, events, tasks and leases, "
                             f"nodes and cordons, checkpoint manifests) and D/{ARTIFACTS_NAME}/, overriding env")
    parser.add_argument("--database-url", default=None, metavar="URL",
                        help="the database instead of the SQLite file under the data directory: "
                             "sqlite:///absolute/path or postgresql://user:password@host:port/database (needs "
                             "pip install 'flashruntime[postgres]'; replicas may share it, given one shared "
                             "artifacts directory); overrides FLASHML_DATABASE_URL")


def coordinator_settings(data_dir: str | None, database_url: str | None, env: Mapping[str, str]) -> Any:
    """The ``RuntimeSettings`` a coordinator started with ``--data-dir`` / ``--database-url``
    (None: not given) runs on, with the rest from ``env``: the database is ``database_url``,
    else ``FLASHML_DATABASE_URL``, else the SQLite file of the data directory (``resolve_paths``,
    made absolute). ``CommandError`` (exit 2) saying what to correct when a setting is invalid
    or the service extra is missing; a URL is never shown with its password."""
    try:
        from flashruntime.coordinator.settings import RuntimeSettings
    except ImportError as exc:
        raise CommandError(f"{exc}; {SERVICE_HINT}", EXIT_CONFIG) from None
    from flashruntime.db.url import parse_database_url
    from flashruntime.errors import BadDatabaseURL

    try:
        settings = RuntimeSettings.from_env(env)
    except ValueError as exc:
        raise CommandError(f"invalid settings: {exc}", EXIT_CONFIG) from None
    ledger, artifacts = (path.expanduser().absolute() for path in resolve_paths(data_dir, env))
    settings.ledger_path, settings.artifacts_dir = str(ledger), str(artifacts)
    if database_url is not None:
        try:
            parse_database_url(database_url, source="--database-url")
        except BadDatabaseURL as exc:
            raise CommandError(str(exc), EXIT_CONFIG) from None
        settings.database_url = database_url
    return settings


def worker_environment(settings: Any) -> dict[str, str]:
    """The variables that give a worker process started by ``--workers`` (which builds its app
    with ``create_app()`` from the environment) the settings this process resolved from its
    options: the data paths, and the database URL when one is set."""
    env = {"FLASHML_LEDGER_PATH": settings.ledger_path, "FLASHML_LOCAL_ARTIFACTS_DIR": settings.artifacts_dir}
    if settings.database_url:
        env["FLASHML_DATABASE_URL"] = settings.database_url
    if settings.ray_address:
        env["FLASHML_RAY_ADDRESS"] = settings.ray_address
    if settings.rendezvous_port:
        env["FLASHML_RENDEZVOUS_PORT"] = str(settings.rendezvous_port)
    return env


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a whole number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def resolve_paths(data_dir: str | None, env: Mapping[str, str]) -> tuple[Path, Path]:
    """``(ledger_path, artifacts_dir)`` for ``serve``: ``data_dir`` sets both; otherwise
    each comes from its variable (an empty one counts as unset), else ``./flashruntime-data``.
    Pure: relative paths stay relative."""
    if data_dir is not None:
        return Path(data_dir) / LEDGER_NAME, Path(data_dir) / ARTIFACTS_NAME
    ledger = env.get("FLASHML_LEDGER_PATH") or str(DEFAULT_DATA_DIR / LEDGER_NAME)
    artifacts = env.get("FLASHML_LOCAL_ARTIFACTS_DIR") or str(DEFAULT_DATA_DIR / ARTIFACTS_NAME)
    return Path(ledger), Path(artifacts)


def url_for(host: str, port: int, *, tls: bool = False) -> str:
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the coordinator on this machine (``localhost``, 127.x, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to any interface


OPEN_MODE_WARNING = (
    "WARNING: no tokens are configured, so this coordinator is open: anyone who can reach {url} can submit "
    "jobs, read every result and have commands run on trusted workers. Configure FLASHML_SUBMITTER_TOKENS, "
    "FLASHML_NODE_TOKENS and FLASHML_OPERATOR_TOKENS for anything but development."
)


class _Terminated(Exception):
    """SIGTERM arrived: uvicorn has shut down gracefully (or never began serving)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


@contextmanager
def _sigterm_stops_cleanly() -> Iterator[None]:
    # uvicorn re-raises a captured SIGTERM after its graceful shutdown; with the default
    # handler that would kill the process, so SIGTERM becomes an exception caught below.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fail(message: str) -> int:
    print(f"flashruntime serve: {message}", file=sys.stderr)
    return EXIT_CONFIG


def handle(args: argparse.Namespace) -> int:
    from flashruntime.errors import AuthConfigError, StoreError

    env = os.environ
    try:
        settings = coordinator_settings(args.data_dir, args.database_url, env)
    except CommandError as exc:
        return _fail(str(exc))
    try:
        import uvicorn  # noqa: F401  (missing: the service extra is, and that is the message)

        from flashruntime.coordinator.app import create_app
    except ImportError as exc:
        return _fail(f"{exc}; {SERVICE_HINT}")

    if args.ray_address is not None:
        from flashruntime.errors import BadRayAddress
        from flashruntime.ray_backend.cluster import parse_ray_address

        try:
            settings.ray_address = parse_ray_address(args.ray_address, source="--ray-address")
        except BadRayAddress as exc:
            return _fail(str(exc))
    if settings.ray_address:
        from flashruntime.errors import ModuleUnavailable
        from flashruntime.ray_backend.cluster import import_ray

        try:
            import_ray()
        except ModuleUnavailable as exc:
            return _fail(str(exc))
        if settings.ray_address == "local" and args.workers > 1:
            return _fail("--ray-address local starts a Ray inside the coordinator's process, one per worker "
                         "process: with --workers, start Ray once (ray start --head) and give its address")

    if args.rendezvous_port is not None:
        if args.rendezvous_port == 0:
            return _fail("--rendezvous-port 0 must be a port of its own, 1..65535")
        settings.rendezvous_port = args.rendezvous_port
    if settings.rendezvous_port == args.port:
        return _fail(f"the rendezvous port {args.port} is the API's --port; give the store a port of its own "
                     "(--rendezvous-port / FLASHML_RENDEZVOUS_PORT)")

    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        return _fail("--ssl-certfile and --ssl-keyfile go together: give both to serve HTTPS, or neither")
    tls = args.ssl_certfile is not None
    url = url_for(args.host, args.port, tls=tls)
    try:
        from flashruntime.coordinator.auth import authenticator_from_env
        from flashruntime.coordinator.node_grants import node_grants_for

        authenticator = authenticator_from_env(env)
        node_grants_for(authenticator, join_code_set=settings.join_code is not None, env=env)
        enforcing = authenticator.enforcing
    except AuthConfigError as exc:
        return _fail(f"invalid settings: {exc}")
    if not enforcing:
        if not is_loopback(args.host) and not args.insecure:
            return _fail(
                f"refusing to serve an open coordinator on {args.host}: with no tokens configured, anyone who "
                "can reach it can submit jobs and have commands run on trusted workers. Configure tokens "
                "(FLASHML_SUBMITTER_TOKENS, FLASHML_NODE_TOKENS, FLASHML_OPERATOR_TOKENS), listen on 127.0.0.1, "
                "or pass --insecure to accept the risk"
            )
        print(OPEN_MODE_WARNING.format(url=url), file=sys.stderr, flush=True)
    elif not tls and not is_loopback(args.host):
        print(f"WARNING: serving plain HTTP on {args.host}: tokens cross the network in clear text; serve HTTPS "
              "(--ssl-certfile/--ssl-keyfile) or put a TLS reverse proxy in front", file=sys.stderr, flush=True)

    artifacts = Path(settings.artifacts_dir)
    database = settings.database
    for directory in (database.path.parent if database.path is not None else None, artifacts):
        if directory is None:
            continue
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _fail(f"cannot create directory {str(directory)!r}: {exc.strerror or exc}")

    from flashruntime.coordinator.listener import BoundedH11Protocol, connection_bound, raise_open_file_limit

    _, file_limit = raise_open_file_limit()
    BoundedH11Protocol.bound = connection_bound(settings.max_connections, file_limit)
    try:
        app = create_app(settings)
    except StoreError as exc:
        return _fail(f"cannot use the database {database}: {exc}")
    except (AuthConfigError, RuntimeError, OSError, sqlite3.Error) as exc:
        return _fail(f"invalid settings: {exc}")

    coordinator = getattr(getattr(app, "state", None), "coordinator", None)
    if settings.ray_address and args.workers == 1 and coordinator is not None:
        # Connect now, so that an unreachable cluster is a message and exit 2, not a failed startup.
        try:
            coordinator.start_backends()
        except Exception as exc:  # whatever ray.init raises: ConnectionError, RuntimeError, ...
            coordinator.close()
            return _fail(f"cannot connect to the Ray cluster at {settings.ray_address}: {exc}")

    rendezvous = None
    if settings.rendezvous_port:
        # Hosted by this process, so one store serves every worker process of --workers.
        from flashruntime.coordinator.rendezvous import RendezvousStore
        from flashruntime.errors import ConfigurationError

        rendezvous = RendezvousStore(settings.rendezvous_port)
        try:
            rendezvous.start()
        except ConfigurationError as exc:
            if coordinator is not None:
                coordinator.close()
            return _fail(str(exc))
    try:
        return _serve(args, app, settings, url, database, artifacts, file_limit)
    finally:
        if rendezvous is not None:
            rendezvous.stop()


def _serve(args: argparse.Namespace, app: Any, settings: Any, url: str, database: Any, artifacts: Path,
           file_limit: int) -> int:
    import uvicorn

    from flashruntime.coordinator.listener import BoundedH11Protocol, listen_backlog

    target: Any = app
    if args.workers > 1:
        # This app only proved that the settings and the database are usable (and ran any
        # migration once, before the workers race to); each worker builds its own from the
        # environment, which its process inherits.
        app.state.coordinator.close()
        os.environ.update(worker_environment(settings))
        target = APP_FACTORY

    print(f"FlashRuntime coordinator on {url}", flush=True)
    print(f"  database   {database.path if database.kind == 'sqlite' else database}", flush=True)
    print(f"  artifacts  {artifacts}", flush=True)
    print(f"  connections at most {BoundedH11Protocol.bound} per process (open-file limit {file_limit})", flush=True)
    if settings.trusted_proxies:
        print(f"  proxies    {settings.trusted_proxies} (their X-Forwarded-For names the client)", flush=True)
    if args.workers > 1:
        print(f"  workers    {args.workers} processes sharing the port", flush=True)
    if settings.ray_address:
        print(f"  ray        {settings.ray_address} (the default backend)", flush=True)
    if settings.rendezvous_port:
        print(f"  rendezvous port {settings.rendezvous_port} on every interface (the c10d store of multi-node "
              "jobs)", flush=True)
        print(f"WARNING: the rendezvous store (PyTorch's TCPStore) listens on port {settings.rendezvous_port} of "
              "every interface of this machine, whatever --host says, and asks no one for a token: let only the "
              "fleet's machines reach it", file=sys.stderr, flush=True)
    try:
        with _sigterm_stops_cleanly():
            uvicorn.run(target, host=args.host, port=args.port, log_level=args.log_level,
                        ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, workers=args.workers,
                        factory=args.workers > 1, http=BoundedH11Protocol, timeout_keep_alive=settings.keep_alive_s,
                        backlog=listen_backlog(file_limit),
                        # Forwarded headers only from the proxies named: uvicorn would believe any
                        # loopback client's, so a local process could pose as any address.
                        proxy_headers=bool(settings.trusted_proxies),
                        forwarded_allow_ips=settings.trusted_proxies or "")
    except (KeyboardInterrupt, _Terminated):
        return EXIT_OK
    except SystemExit as exc:
        if exc.code in (0, None):
            return EXIT_OK
        print(f"flashruntime serve: the server stopped with status {exc.code} (see uvicorn's log above)",
              file=sys.stderr)
        return EXIT_SERVER_FAILED
    return EXIT_OK
