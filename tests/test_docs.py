"""The documentation's cross-references hold: every relative link of the Markdown files
points at a committed file, and every named section (``README, "Layout"``, ``docs/gpu.md,
"Install"``) quoted in code or docs is a heading of that file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: [text](target) and ![alt](target), the target up to a space or the closing bracket
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: README, BENCHMARKS.md or docs/NAME.md, a comma, and the title in double quotes
SECTION = re.compile(r'\b(README(?:\.md)?|BENCHMARKS\.md|docs/[\w.-]+\.md), "([^"]+)"')


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / p for p in out]


def _headings(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # not a code block's comments
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)]


def test_relative_links_point_at_committed_files():
    docs = _tracked("*.md")
    assert ROOT / "README.md" in docs and ROOT / "docs" / "fidelity.md" in docs
    broken = []
    for doc in docs:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_named_sections_exist():
    refs = []
    for f in _tracked("*.py", "*.sh", "*.md", "*.toml", "Makefile"):
        text = f.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", text)  # lines (and comments) joined
        refs += [(f, name, title) for name, title in SECTION.findall(text)]
    assert len(refs) >= 8, refs  # the references this test was written for are found
    missing = []
    for f, name, title in refs:
        doc = ROOT / (name if name.endswith(".md") else name + ".md")
        if not doc.exists() or not any(h.startswith(title) for h in _headings(doc)):
            missing.append(f'{f.relative_to(ROOT)}: {name}, "{title}"')
    assert not missing, "sections named but not headings there:\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", ["README.md", "docs/gpu.md", "docs/fidelity.md"])
def test_no_section_runs_on_without_a_heading(doc):
    """A reader can find their way: no stretch of more than 80 lines (code and tables
    included) without a heading, as README's 450 heading-less lines were."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    starts = [i for i, ln in enumerate(lines) if re.match(r"#{1,6} ", ln)] + [len(lines)]
    longest = max(b - a for a, b in zip(starts, starts[1:], strict=False))
    assert longest <= 80, f"{doc}: {longest} lines under one heading"


def _fenced_commands(doc: Path) -> list[str]:
    """The ``lartpc`` command lines of ``doc``'s fenced code blocks, a launcher's
    (``torchrun ... lartpc train ...``) included, continuation lines joined and
    trailing comments dropped, leaving out sketches that show a choice or an elision
    (``[--opt]``, ``a | b``, ``...``)."""
    text = doc.read_text(encoding="utf-8")
    found = []
    for block in re.findall(r"^```[\w-]*\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            m = re.search(r"(?:^|\s)(?:[\w./-]*/)?lartpc (.*)$", line)
            if not m or line.lstrip().startswith("#"):
                continue
            command = re.sub(r"\s+#.*$", "", m.group(1)).strip()
            if not re.search(r"\.\.\.|…|\[|\s\|\s", command):
                found.append(command)
    return found


def _inline_commands(doc: Path) -> list[str]:
    """The ``lartpc`` commands written in running text (`` `lartpc simulate ...` ``)
    with two options or more: whole commands a reader copies, not names of one (
    `` `lartpc sweep` ``), leaving out sketches as :func:`_fenced_commands` does."""
    text = doc.read_text(encoding="utf-8").replace("\n", " ")
    found = []
    for m in re.finditer(r"`(?:[\w./-]*/)?lartpc ([^`]+)`", text):
        command = m.group(1).strip()
        if len(re.findall(r"(?:^|\s)--\w", command)) >= 2 \
                and not re.search(r"\.\.\.|…|\[|\s\|\s|<", command):
            found.append(command)
    return found


def test_commands_in_running_text_parse(capsys):
    """docs/ and README write whole commands in running text too: each must be one the
    command line takes (a ``simulate`` without its required ``--out`` was not)."""
    import shlex

    from lartpc.cli import build_parser

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = [(d.name, c) for d in docs for c in _inline_commands(d)]
    assert len(commands) >= 10, commands
    refused = []
    for name, command in commands:
        argv = shlex.split(command)
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit:
            refused.append(f"{name}: lartpc {command}\n    {capsys.readouterr().err.strip()}")
    assert not refused, "commands the CLI refuses:\n" + "\n".join(refused)


def test_torchrun_runs_lartpc_as_a_module():
    """torchrun runs its first argument as a Python file: ``torchrun ... lartpc`` works
    only where a folder ``lartpc`` is in the working directory; ``-m lartpc`` (or
    ``--no-python``) everywhere."""
    wrong, seen = [], 0
    for doc in [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            m = re.search(r"torchrun\s(.*?)\blartpc\b", line)
            if m:
                seen += 1
                if not re.search(r"(?:^|\s)-m\s*$", m.group(1)) and "--no-python" not in line:
                    wrong.append(f"{doc.name}: {line.strip()}")
    assert seen >= 1 and not wrong, "\n".join(wrong)


@pytest.mark.parametrize("doc, at_least", [("README.md", 25), ("BENCHMARKS.md", 15)])
def test_documented_commands_parse(doc, at_least, capsys):
    """Every whole ``lartpc`` command a reader can copy from README's or BENCHMARKS'
    code blocks (docs/ shows commands in running text) is one the
    command line takes as written (options, choices, value types), and a ``train``
    command's ``--config`` with its ``--set`` overrides is a valid configuration: an
    option renamed or removed without the docs would fail here."""
    import shlex

    from lartpc.cli import build_parser
    from lartpc.config import load_config

    commands = _fenced_commands(ROOT / doc)
    assert len(commands) >= at_least, commands  # the blocks this was written for are found
    refused = []
    for command in commands:
        argv = shlex.split(command)
        try:
            args = build_parser(argv).parse_args(argv)
        except SystemExit:
            refused.append(f"lartpc {command}\n    {capsys.readouterr().err.strip()}")
            continue
        if args.command == "train":
            load_config(args.config, args.overrides)  # raises with the key it refuses
    assert not refused, f"{doc}: commands the CLI refuses:\n" + "\n".join(refused)
