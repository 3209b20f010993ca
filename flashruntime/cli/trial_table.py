"""A sweep's trials as aligned columns, best first, as ``submit`` (here or on the fleet) and
``runs`` print them."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["trial_table_text"]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return value if isinstance(value, str) else json.dumps(value)


def trial_table_text(rows: list[dict[str, Any]], metric: str | None) -> str:
    """The sweep's trials as aligned columns, best first (``*`` marks the best)."""
    keys: list[str] = []
    for row in rows:
        for key in row["params"] if isinstance(row["params"], dict) else {}:
            if key not in keys:
                keys.append(key)
    headers = ["", "trial", *keys, "state", metric or "metric", "duration", "attempts"]
    table = [
        ["*" if row["best"] else "", row["trial_id"], *(_cell(row["params"].get(key)) for key in keys),
         row["state"], _cell(row["metric"]),
         "-" if row["duration_s"] is None else f"{row['duration_s']:.1f}s", str(row["attempts"])]
        for row in rows
    ]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in [headers, *table]]
    return "\n".join(lines)
