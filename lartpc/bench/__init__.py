"""``lartpc bench KIND``: one module per thing measured, each printing one JSON object.

Every module provides ``add_arguments(parser)`` and ``run(args) -> int``; see
:mod:`lartpc.commands.bench` for the kinds.
"""
