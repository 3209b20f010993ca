"""How a goodput ledger reads as text, for jobs and local runs alike: one aligned line per
recovery, then the goodput line, each ``  <label padded to a width><text>``."""

from __future__ import annotations

__all__ = ["line", "seconds"]


def seconds(value: float | None) -> str:
    """``value`` as ``"1.25 s"``, or ``"-"`` when it is unknown."""
    return "-" if value is None else f"{value:.2f} s"


def line(label: str, text: str, label_width: int) -> str:
    """One report line: ``label`` padded to ``label_width``, then ``text``, indented two spaces."""
    return f"  {label.ljust(label_width)}{text}"
