"""What a preemption notice is, read from the environment: which signals to the driving
process mean "you are being preempted" (``FLASHML_PREEMPT_SIGNAL``, default SIGTERM) and how
long the platform lets the ranks save before it kills them (``FLASHML_PREEMPT_GRACE_S``,
default 25 s). The driver and the ranks read the same two variables; pure functions only.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_GRACE_S", "GRACE_ENV", "SIGNAL_ENV", "PreemptSettings", "preempt_settings", "signal_name"]

SIGNAL_ENV = "FLASHML_PREEMPT_SIGNAL"
GRACE_ENV = "FLASHML_PREEMPT_GRACE_S"
DEFAULT_GRACE_S = 25.0  # inside the 30 s most platforms give between SIGTERM and SIGKILL
_DEFAULT_SIGNALS = "SIGTERM"
_OFF = ("none", "off")


@dataclass(frozen=True)
class PreemptSettings:
    """``signals``: the signal numbers that are a preemption notice (empty: none is, and a
    SIGTERM cancels the run as Ctrl-C does). ``grace_s``: the seconds the ranks get to save."""

    signals: tuple[int, ...]
    grace_s: float


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _signal(word: str) -> int:
    text = word.strip().upper()
    if text.isdigit():
        number = int(text)
        if number in {s.value for s in signal.Signals}:
            return number
    else:
        name = text if text.startswith("SIG") else f"SIG{text}"
        found = getattr(signal.Signals, name, None) if name.isidentifier() else None
        if found is not None:
            return int(found)
    raise ValueError(f"{SIGNAL_ENV}: {word.strip()!r} is not a signal of this platform; name one or several, "
                     "comma-separated (e.g. SIGTERM or SIGTERM,SIGUSR1), or 'none'")


def preempt_settings(env: Mapping[str, str]) -> PreemptSettings:
    """The settings ``env`` names; raises ``ValueError`` (with the variable, the value and
    what it may be) for a value that names no signal or no grace."""
    raw_signals = (env.get(SIGNAL_ENV) or "").strip() or _DEFAULT_SIGNALS
    if raw_signals.lower() in _OFF:
        signals: tuple[int, ...] = ()
    else:
        uncatchable = {int(getattr(signal, n)) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}
        numbers = [_signal(word) for word in raw_signals.split(",") if word.strip()]
        refused = [n for n in numbers if n in uncatchable]
        if refused:
            raise ValueError(f"{SIGNAL_ENV}={raw_signals!r}: {signal_name(refused[0])} cannot be caught, so it "
                             "cannot be a notice; name a signal the platform sends before it kills (e.g. SIGTERM)")
        signals = tuple(dict.fromkeys(numbers))
    raw_grace = (env.get(GRACE_ENV) or "").strip()
    grace = DEFAULT_GRACE_S
    if raw_grace:
        try:
            grace = float(raw_grace)
        except ValueError:
            grace = math.nan
        if not (math.isfinite(grace) and grace >= 0):
            raise ValueError(f"{GRACE_ENV}={raw_grace!r} is not a number of seconds >= 0; set it below the time "
                             "the platform allows between its notice and its kill, e.g. 25")
    return PreemptSettings(signals, grace)
