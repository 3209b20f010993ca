"""What went wrong: ``FailureSignals`` observed around a failure and the
deterministic classifier that maps them to a ``FailureClass``.

Pure: no I/O, no clock. The first matching rule wins; same signals ⇒ same class.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashruntime.protocol.v1alpha1 import FailureClass

__all__ = ["CORRELATED_THRESHOLD", "POLICY_VERSION", "FailureSignals", "classify"]

POLICY_VERSION = "0.1.0"
CORRELATED_THRESHOLD = 3

COMM_MARKERS = ("nccl", "rccl", "gloo", "rendezvous", "allreduce", "all_reduce", "process group")
STORAGE_MARKERS = ("s3", "oss", "minio", "object store", "storage timeout", "slowdown")


@dataclass(frozen=True)
class FailureSignals:
    """Everything known about one failure; every field optional."""

    exit_code: int | None = None
    exit_deterministic: bool = False  # the same error would recur on retry
    heartbeat_lost: bool = False
    node_unreachable: bool = False
    xid_event: bool = False  # NVIDIA XID / ECC / NVML health failure
    driver_fault: bool = False
    hash_mismatch: bool = False
    validation_failed: bool = False
    preemption_notice: bool = False
    storage_errors: int = 0
    control_plane_unreachable: bool = False
    concurrent_failures: int = 1  # failures in the correlation window, including this one
    message: str = ""  # free text, scanned case-insensitively

    def has_comm_marker(self) -> bool:
        text = (self.message or "").lower()
        return any(marker in text for marker in COMM_MARKERS)

    def has_storage_marker(self) -> bool:
        text = (self.message or "").lower()
        return any(marker in text for marker in STORAGE_MARKERS)


def classify(signals: FailureSignals) -> FailureClass:
    """The failure class of ``signals``: the first of the ten rules that matches."""
    if signals.concurrent_failures >= CORRELATED_THRESHOLD:
        return FailureClass.CORRELATED_INCIDENT
    if signals.control_plane_unreachable:
        return FailureClass.CONTROL_PLANE_FAILURE
    if signals.preemption_notice:
        return FailureClass.PREEMPTION
    if signals.xid_event or signals.driver_fault:
        return FailureClass.ACCELERATOR_FAILURE
    if signals.heartbeat_lost or signals.node_unreachable:
        return FailureClass.NODE_LOSS
    if signals.has_comm_marker():
        return FailureClass.COMMUNICATION_ERROR
    if signals.storage_errors > 0 or signals.has_storage_marker():
        return FailureClass.STORAGE_TIMEOUT
    if signals.hash_mismatch or signals.validation_failed:
        return FailureClass.ARTIFACT_CORRUPTION
    if signals.exit_code is not None and signals.exit_code != 0:
        return FailureClass.APPLICATION_ERROR if signals.exit_deterministic else FailureClass.WORKER_CRASH
    return FailureClass.UNKNOWN
