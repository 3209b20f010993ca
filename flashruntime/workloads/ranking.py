"""Which way a sweep's metric ranks its trials: one rule for ``flash.submit``, the
``submit`` command, ``Run.best_trial`` and the run page.

A mode given outright wins, then ``OutputSpec.maximize`` when it was set, then the
metric's name: a name that reads as a cost (a loss, an error, a time) is minimised,
any other (accuracy, score, reward, ...) maximised. Pure.
"""

from __future__ import annotations

import re

__all__ = ["MINIMISED_WORDS", "MODES", "default_mode", "mode_reason", "resolve_mode"]

MODES = ("min", "max")

# A metric whose name holds one of these words (split at non-letters and camel case) is a cost.
MINIMISED_WORDS = frozenset({
    "loss", "error", "err", "errors", "mse", "mae", "rmse", "nll", "perplexity", "ppl", "wer", "cer",
    "regret", "distance", "time", "runtime", "latency", "seconds", "duration", "inertia", "divergence",
})

_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


def _words(metric: str) -> list[str]:
    return [word.lower() for word in _WORDS.findall(metric)]


def default_mode(metric: str | None) -> str:
    """``"min"`` for a metric named like a cost (``loss``, ``eval_loss``, ``val/error``,
    ``trainRuntime``), ``"max"`` otherwise (and with no metric)."""
    if metric is None:
        return "max"
    return "min" if any(word in MINIMISED_WORDS for word in _words(metric)) else "max"


def resolve_mode(metric: str | None, mode: str | None = None, maximize: bool | None = None) -> str:
    """The mode in force: ``mode`` when given, else ``maximize`` when set (True = "max"),
    else ``default_mode(metric)``. ``ValueError`` for a mode other than "min" or "max"."""
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        return mode
    if maximize is not None:
        return "max" if maximize else "min"
    return default_mode(metric)


def mode_reason(metric: str | None, mode: str | None = None, maximize: bool | None = None) -> str:
    """Why ``resolve_mode`` chose what it chose, in a few words for the sweep's first event."""
    chosen = resolve_mode(metric, mode, maximize)
    if mode is not None:
        return f"{chosen} (as asked)"
    if maximize is not None:
        return f"{chosen} (OutputSpec.maximize={maximize})"
    if chosen == "min":
        return f"min ({metric!r} reads as a cost; pass mode='max' / --mode max if higher is better)"
    return f"max ({metric!r} is not named like a cost; pass mode='min' / --mode min if lower is better)"
