"""The `vidloom` command: commands.py builds the parser and dispatches; one module per subcommand beside it."""

from vidloom.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
