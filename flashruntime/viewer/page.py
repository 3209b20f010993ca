"""Design tokens of flashruntime's pages: one palette for the run viewer and the
coordinator dashboard, so a state reads the same colour everywhere."""

from __future__ import annotations

__all__ = ["STATE_COLOURS", "TOKENS"]

TOKENS: dict[str, str] = {
    "bg": "#0f1419",
    "panel": "#171d24",
    "border": "#2a323c",
    "text": "#e6e8eb",
    "muted": "#8a949e",
    "accent": "#4aa3ff",
    "ok": "#3fb950",
    "warn": "#d29922",
    "bad": "#f85149",
    "info": "#a371f7",
    "font": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
    "mono": "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
}

# Job, task and attempt states → token names.
STATE_COLOURS: dict[str, str] = {
    "PENDING": "muted",
    "SUBMITTED": "muted",
    "RUNNING": "accent",
    "LEASED": "accent",
    "RECOVERING": "warn",
    "SUCCEEDED": "ok",
    "COMPLETED": "ok",
    "FAILED": "bad",
    "CANCELLED": "warn",
}
