"""The rendezvous store of multi-node jobs, run by the coordinator as a child process.

The nodes of a multi-node job (``parameters.nodes``) run torchrun with its c10d rendezvous
pointed at this store, so the rendezvous lives as long as the coordinator, not as long as
one of the nodes. The child is ``flashruntime.torch.rendezvous_store`` (PyTorch on this
machine is needed for it, and only then); when it dies it is started again, on the same
port, for the rendezvous rounds that follow.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

from flashruntime.errors import ConfigurationError
from flashruntime.protocol.gang import STORE_READY_PREFIX

__all__ = ["RendezvousStore"]

log = logging.getLogger("flashruntime.service")

START_TIMEOUT_S = 60.0  # importing torch on a cold, loaded machine
RESTART_BACKOFF_S = 1.0


class RendezvousStore:
    """``start()`` serves the store on ``port`` (``ConfigurationError`` when it cannot); a
    watcher restarts it when it dies; ``stop()`` ends it. The child holds a pipe of this
    process as its standard input and stops when it ends, so a coordinator killed outright
    leaves no store behind to hold the port. What the store writes to its standard error
    (torch's warnings, one per bad request) is read as it comes and logged, so a full pipe
    never stops it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._process: subprocess.Popen[str] | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        self._process = self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="flashruntime-rendezvous-store", daemon=True)
        self._watcher.start()
        log.info("serving the rendezvous store of multi-node jobs on port %d", self.port)

    def stop(self) -> None:
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()  # the child's cue; terminate in case it does not take it
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._watcher is not None:
            self._watcher.join(timeout=10)

    def _spawn(self) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "flashruntime.torch.rendezvous_store", "--port", str(self.port),
             "--until-stdin-closes"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        # The child prints one line once it serves, or exits with its reason.
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        line = first[0] if first else ""
        if not line.startswith(STORE_READY_PREFIX):
            if process.poll() is None:
                process.kill()
            rest = process.communicate()[0] if not reader.is_alive() else ""
            why = (line + rest).strip() or f"no answer within {START_TIMEOUT_S:g} s"
            raise ConfigurationError(f"the rendezvous store on port {self.port} did not start: {why}")
        threading.Thread(target=self._drain, args=(process,), name="flashruntime-rendezvous-log", daemon=True).start()
        return process

    @staticmethod
    def _drain(process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.debug("rendezvous store: %s", line.rstrip())

    def _watch(self) -> None:
        while not self._stopping.is_set():
            process = self._process
            if process is None or process.poll() is None:
                self._stopping.wait(RESTART_BACKOFF_S)
                continue
            if self._stopping.is_set():
                return
            log.error("the rendezvous store on port %d exited with %s; starting it again", self.port,
                      process.returncode)
            try:
                self._process = self._spawn()
            except ConfigurationError as exc:
                log.error("%s", exc)
                time.sleep(RESTART_BACKOFF_S)
