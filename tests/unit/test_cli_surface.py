"""The CLI's documented surface: every flag is in the synopsis of docs/cli.md, every command in the README and the
docs parses; quiet mode keeps download bars."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from vidloom.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "cli.md"
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_readme_synopsis_lists_every_flag(command):
    synopsis = re.search(r"# CLI\n\n```\n(.*?)```", CLI_PAGE.read_text(), flags=re.S).group(1)
    flags = {opt for action in _subparser(command)._actions for opt in action.option_strings if opt.startswith("--")}
    missing = sorted(flag for flag in flags - {"--help"} if flag not in synopsis)
    assert not missing, f"docs/cli.md synopsis lacks {missing}"


def test_quiet_mode_hides_library_bars_but_keeps_hub_downloads():
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    import warnings

    from vidloom.cli.generate import quiet_third_party

    shown = warnings.showwarning
    try:
        quiet_third_party(verbose=False)
        assert not transformers_logging.is_progress_bar_enabled()
        assert not are_progress_bars_disabled()
    finally:
        warnings.showwarning = shown
        transformers_logging.enable_progress_bar()
        enable_progress_bars()


def _short_flag_in(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_readme_synopsis_lists_every_short_flag(command):
    synopsis = re.search(r"# CLI\n\n```\n(.*?)```", CLI_PAGE.read_text(), flags=re.S).group(1)
    short = {opt for action in _subparser(command)._actions for opt in action.option_strings
             if not opt.startswith("--") and opt != "-h"}
    missing = sorted(flag for flag in short if not _short_flag_in(flag, synopsis))
    assert not missing, f"docs/cli.md synopsis lacks {missing}"


def _readme_commands() -> list[str]:
    """Every `vidloom ...` command in the bash blocks of the README and docs/, up to a comment, pipe, redirect,
    `&&`, `||` or a trailing `&`."""
    commands = []
    blocks = [b for page in DOC_PAGES for b in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)]
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                if part.split()[:1] != ["vidloom"] and not part.lstrip().startswith(("/", "./", ".venv/")):
                    continue  # not a vidloom command (a curl body may span lines: shlex cannot read those alone)
                words = shlex.split(part, comments=True)
                for stop in ("||", "|", ">", "2>", "&"):
                    words = words[:words.index(stop)] if stop in words else words
                if words and words[0].split("/")[-1] == "vidloom":
                    commands.append(shlex.join(words[1:]))
    return commands


def test_readme_commands_parse():
    """A flag the CLI does not have (the old Cosmos3 example's `-o`, before there was one) fails here."""
    commands = _readme_commands()
    assert len(commands) >= 20 and any(c.startswith("generate") for c in commands) and any(
        c.startswith("serve") for c in commands)
    parser = build_parser()
    failed = []
    for command in commands:
        words = shlex.split(command)
        elided = [i for i, word in enumerate(words) if word == "..." and not words[i - 1].startswith("-")]
        if elided:  # "generate ... --devices 4" (not "--prompt ..."): the rest must still parse
            words = [word for i, word in enumerate(words) if i not in elided]
            words += ["--prompt", "x"] if words[0] == "generate" and "--prompt" not in words else []
        try:
            parser.parse_args(words)
        except SystemExit:
            failed.append(command)
    assert not failed, f"documented commands the CLI refuses: {failed}"

