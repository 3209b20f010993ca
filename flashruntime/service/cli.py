"""Compatibility path of the ``flashruntime`` command (``flashruntime.cli``); ``python -m
flashruntime.service.cli`` runs it as before."""

import sys

from flashruntime.cli.dispatch import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
