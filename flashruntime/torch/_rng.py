"""The random generators' states of one process, for a checkpoint to carry: Python's
``random``, NumPy's global generator (when NumPy is in use), torch's CPU generator and every
CUDA device's. Restored at a resume, they make dropout, augmentation and sampling continue as
if the run had never stopped.
"""

from __future__ import annotations

import random
import sys
from typing import Any

__all__ = ["capture", "restore"]


def capture() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    import torch

    if "python" in state:
        random.setstate(state["python"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
