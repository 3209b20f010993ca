"""Compatibility path of ``flashruntime.coordinator.ledger``."""

from flashruntime.coordinator.ledger import Ledger

__all__ = ["Ledger"]
