"""The help format of every command (``lartpc …`` and ``python -m lartpc.analysis …``)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default after its help, except where there is none to show
    (None, False, a suppressed value) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS) \
                or isinstance(action, argparse._HelpAction) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"
