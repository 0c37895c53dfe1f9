"""The CLI's documented surface: every flag is in the README synopsis; quiet mode keeps download bars."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from vidloom.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_readme_synopsis_lists_every_flag(command):
    synopsis = re.search(r"## CLI\n\n```\n(.*?)```", README.read_text(), flags=re.S).group(1)
    flags = {opt for action in _subparser(command)._actions for opt in action.option_strings if opt.startswith("--")}
    missing = sorted(flag for flag in flags - {"--help"} if flag not in synopsis)
    assert not missing, f"README CLI synopsis lacks {missing}"


def test_quiet_mode_hides_library_bars_but_keeps_hub_downloads():
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    import warnings

    from vidloom.cli_generate import quiet_third_party

    shown = warnings.showwarning
    try:
        quiet_third_party(verbose=False)
        assert not transformers_logging.is_progress_bar_enabled()
        assert not are_progress_bars_disabled()
    finally:
        warnings.showwarning = shown
        transformers_logging.enable_progress_bar()
        enable_progress_bars()
