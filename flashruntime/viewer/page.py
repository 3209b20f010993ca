"""The live run page and the design tokens of flashruntime's pages: one palette
for the run viewer and the coordinator dashboard, so a state reads the same colour everywhere.

``render()`` returns one self-contained HTML document; it must work with the network cut,
so it loads nothing (no fonts, scripts, stylesheets or images) from anywhere."""

from __future__ import annotations

import functools
import json
from importlib import resources

__all__ = ["SERIES_COLOURS", "STATE_COLOURS", "TOKENS", "render"]

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

# Curves of a sweep's trials, in trial order; the first is the single command's curve colour.
SERIES_COLOURS: tuple[str, ...] = (TOKENS["accent"], TOKENS["warn"], TOKENS["ok"], TOKENS["info"], TOKENS["bad"],
                                   "#39c5cf", "#db6d28", "#db61a2")

# Log-event types the feed highlights: a recovery decision, a rank that holds the others back, a run
# that continues on another number of ranks or waits for the ranks it needs.
_HIGHLIGHT_EVENTS = ("FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED", "STRAGGLER_DETECTED", "WORLD_SIZE_CHANGED",
                     "WORLD_SIZE_WAITING")


def _tint(hex_colour: str, alpha: float) -> str:
    """``#rrggbb`` → ``rgba(r,g,b,alpha)``: a translucent background from a palette colour
    without relying on CSS color-mix(), which older browsers lack."""
    value = hex_colour.lstrip("#")
    r, g, b = (int(value[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# The page (page.html beside this module) is written out by hand rather than as a
# str.format template: CSS braces, JS template literals and percentages would all need
# escaping. Its __PLACEHOLDERS__ are replaced in render().
_TEMPLATE_NAME = "page.html"


@functools.lru_cache(maxsize=1)
def _template() -> str:
    return resources.files(__package__).joinpath(_TEMPLATE_NAME).read_text(encoding="utf-8")


def render() -> str:
    """The live run page: one self-contained HTML document (inline CSS and JS, no external
    assets) that polls ``/api/state`` every 2 s while the tab is visible."""
    css_vars = "".join(f"--{name}:{value};" for name, value in TOKENS.items())
    series_css = "".join(
        f".ln-ser-{k}{{stroke:{colour}}} .dot-ser-{k}{{fill:{colour}}} .sw-ser-{k}{{background:{colour}}}"
        for k, colour in enumerate(SERIES_COLOURS))
    state_css = "".join(f".st-{state}{{color:var(--{token})}}" for state, token in STATE_COLOURS.items())
    return (_template()
            .replace("__CSS_VARS__", css_vars)
            .replace("__STATE_CSS__", state_css)
            .replace("__SERIES_CSS__", series_css)
            .replace("__SERIES_COUNT__", str(len(SERIES_COLOURS)))
            .replace("__WARN_BG__", _tint(TOKENS["warn"], 0.12))
            .replace("__OK_BG__", _tint(TOKENS["ok"], 0.10))
            .replace("__HIGHLIGHT_JSON__", json.dumps(list(_HIGHLIGHT_EVENTS))))
