"""The text a command works on, given the same two ways to `generate` and `speak`: `--prompt TEXT`
(the documented form, as the HTTP field) or as the one positional argument."""

from __future__ import annotations

import argparse

from vidloom.core.errors import InvalidRequest


def add_prompt_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--prompt", default=None, help=what)
    parser.add_argument("prompt_arg", nargs="?", default=None, metavar="PROMPT",
                        help=f"{what}: the same as --prompt, which the docs use")


def take_prompt(args: argparse.Namespace) -> None:
    """Settle args.prompt from --prompt or the positional text: one of them, once."""
    given = args.prompt_arg
    if given is not None and args.prompt is not None and given != args.prompt:
        raise InvalidRequest("prompt", f"given twice: {given!r} and --prompt {args.prompt!r}; give one")
    args.prompt = args.prompt if args.prompt is not None else given
    if args.prompt is None:
        raise InvalidRequest("prompt", "missing: give the text as --prompt TEXT")
