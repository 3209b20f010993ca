"""The coordinator: a FastAPI service that expands jobs into leased tasks for a fleet.

``app.create_app`` wires it (the only module that needs the ``service`` extra, with
the routes and the guard in front of them); ``core.Coordinator`` holds its state and
operations without HTTP; ``access`` and ``auth`` decide who may call what; ``ledger``,
``artifacts`` and ``nodes`` keep what it knows. Importing this package loads nothing.
"""
