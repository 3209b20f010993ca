"""Compatibility import paths of the coordinator, the worker and the CLI.

The code lives in ``flashruntime.coordinator``, ``flashruntime.agent`` and
``flashruntime.cli``; each module here re-exports the public names that code written
for earlier releases imports (``flashruntime.service.app``, ``.auth``, ``.modea``,
``.ledger``, ``.settings``, ``.checkpoints``, ``.worker``, ``.cli``, ``.dashboard``), the
same objects.
Only ``.app`` needs the ``service`` extra.
"""
