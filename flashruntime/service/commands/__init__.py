"""One module per ``flashruntime`` subcommand, each with ``register(subparsers)``.

``register`` adds the subparser and sets ``handler``; the handler imports what it
needs, so building the parser stays cheap.
"""

# Order = order in ``flashruntime --help``.
COMMAND_MODULES: tuple[str, ...] = (
    "flashruntime.service.commands.submit",
    "flashruntime.service.commands.runs",
    "flashruntime.service.commands.view",
    "flashruntime.service.commands.demo",
    "flashruntime.service.commands.plan",
    "flashruntime.service.commands.jobs",
    "flashruntime.service.commands.serve",
    "flashruntime.service.commands.worker",
)
