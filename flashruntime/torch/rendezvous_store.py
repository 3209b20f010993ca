"""A c10d store for torchrun's rendezvous, hosted apart from every training node.

``python -m flashruntime.torch.rendezvous_store --port P`` serves one
``torch.distributed.TCPStore`` (multi-tenant: every job's rendezvous keeps its keys under
its own ``--rdzv-id``; it listens on every interface, as TCPStore does) until it is stopped,
or until its standard input ends (``--until-stdin-closes``: its parent is gone, even killed). The coordinator runs it beside itself so that
the nodes of a multi-node job join a rendezvous that outlives any one of them: with the
store inside one node's torchrun, as torchrun does by default, losing that node ends the
rendezvous for the nodes left. Prints ``ready <port>`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from flashruntime.protocol.gang import STORE_READY_PREFIX

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashruntime.torch.rendezvous_store",
                                     description="serve a c10d TCPStore for torchrun rendezvous")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on, on every interface")
    parser.add_argument("--until-stdin-closes", action="store_true",
                        help="stop when standard input reaches its end (the parent that holds it is gone)")
    args = parser.parse_args(argv)
    try:
        from torch.distributed import TCPStore
    except ImportError as exc:
        print(f"the rendezvous store needs PyTorch on the coordinator's machine ({exc}); "
              "install it (pip install torch) or run serve without --rendezvous-port", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.until_stdin_closes:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    try:
        # wait_for_workers=False: the store has no fixed set of clients, nodes come and go.
        store = TCPStore("0.0.0.0", args.port, is_master=True, multi_tenant=True, wait_for_workers=False)
    except (RuntimeError, ValueError) as exc:
        print(f"cannot serve the rendezvous store on port {args.port}: {exc}", file=sys.stderr)
        return 1
    print(f"{STORE_READY_PREFIX}{store.port}", flush=True)
    stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
