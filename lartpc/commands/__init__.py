"""One module per ``lartpc`` subcommand: ``add_arguments(parser)`` and ``run(args)``."""
