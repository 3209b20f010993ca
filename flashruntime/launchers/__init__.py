"""Launchers start a ``LaunchSpec`` somewhere and hand back a ``LaunchHandle``.

Launchers never retry: restarts are the SDK's decision (recovery policy).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from flashruntime.errors import LaunchError
from flashruntime.protocol.base import StrEnum

if TYPE_CHECKING:
    from flashruntime.strategies import LaunchSpec

__all__ = ["LaunchError", "LaunchHandle", "LaunchState", "Launcher"]


class LaunchState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (LaunchState.SUCCEEDED, LaunchState.FAILED, LaunchState.CANCELLED)


class LaunchHandle(ABC):
    @abstractmethod
    def poll(self) -> LaunchState:
        """Non-blocking and idempotent; a terminal result is cached."""

    @abstractmethod
    def cancel(self) -> None:
        """Idempotent, best effort."""

    def wait(self, timeout_seconds: float | None = None) -> LaunchState:
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while True:
            state = self.poll()
            if state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return state
            time.sleep(1.0)

    def logs(self, tail_lines: int = 200) -> str:
        return ""

    @property
    def execution_id(self) -> str:
        return ""


class Launcher(ABC):
    name: ClassVar[str] = ""

    def healthy(self) -> tuple[bool, str]:
        return True, "no preflight implemented"

    @abstractmethod
    def launch(self, spec: LaunchSpec, job_id: str, attempt_id: str) -> LaunchHandle: ...
