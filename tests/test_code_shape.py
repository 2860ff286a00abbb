"""The commands stay thin: every function in lartpc/commands/ is under 50 lines (issue 40);
the work lives in the layers below, where it can be called as a library."""

from __future__ import annotations

import ast
from pathlib import Path

COMMANDS = Path(__file__).resolve().parents[1] / "lartpc" / "commands"
MAX_LINES = 50


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_every_command_function_is_under_50_lines():
    files = sorted(COMMANDS.glob("*.py"))
    assert len(files) > 5  # the folder was found
    long = [f"{path.name}:{line} {name} ({n} lines)" for path in files
            for name, line, n in _functions(path) if n >= MAX_LINES]
    assert not long, f"split these into named helpers: {', '.join(long)}"
