"""The ``flashruntime`` command: one module per subcommand, ``main`` in ``dispatch.py``.

argparse only, so the CLI works with the core install; a subcommand imports what it
needs inside its handler. ``python -m flashruntime.cli`` runs it too.
"""

from flashruntime.cli.dispatch import main

__all__ = ["main"]
