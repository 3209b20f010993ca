"""``flashruntime view RUN_DIR``: serve the live run page of a run directory until stopped.

For a run started with ``--no-watch`` (or from another process, or already finished):
the same page ``flash.submit(watch=True)`` opens, on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "view", help="serve the live run page of a run directory",
        description="Serve the live run page of a run on 127.0.0.1 and open it in a browser: its attempts, "
                    "events, metric curves and output, updated as the run goes on. The page stops with Ctrl-C.")
    parser.add_argument("run_dir", metavar="RUN",
                        help="a run directory holding run.json, or a run's name under the runs root "
                             "(`flashruntime runs` lists them)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--no-open", action="store_true", help="print the URL without opening a browser")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from flashruntime.cli.runs import resolve_run
    from flashruntime.viewer.server import RunViewerServer

    run_dir = resolve_run(args.run_dir)
    if run_dir is None:
        print(f"flashruntime view: {args.run_dir} is no run directory (it holds no run.json) and no run of that "
              "name is under the runs root; `flashruntime runs` lists the runs (`--root DIR`: those under DIR)",
              file=sys.stderr)
        return 2
    try:
        server = RunViewerServer(run_dir, port=args.port)
        url = server.start()
    except (ValueError, OSError) as exc:
        print(f"flashruntime view: cannot serve on 127.0.0.1 port {args.port}: {exc}; "
              "pass another --port, or 0 for any free one", file=sys.stderr)
        return 2
    print(f"viewer: {url} (Ctrl-C to stop)", flush=True)
    if not args.no_open:
        _open_browser(url)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
    return 0


def _open_browser(url: str) -> None:
    try:
        import webbrowser

        webbrowser.open(url)
    except Exception as exc:  # noqa: BLE001 (a convenience: the URL is printed either way)
        print(f"viewer: could not open a browser ({type(exc).__name__}: {exc})", file=sys.stderr)
