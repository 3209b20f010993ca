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
    """The states as tensors, lists and numbers only, so that ``torch.load(weights_only=True)``
    reads them back: no pickled object of any other kind is ever loaded from a checkpoint."""
    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(position), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    import torch

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        kind, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype(numpy.uint32), position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
