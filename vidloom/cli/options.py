"""`vidloom generate`'s option flags, derived from the families' option blocks (core.options).

Each block is one --help group titled with what it is for and which families declare it; each option is a
flag typed by its kind. A flag given for a model whose card lacks the block is refused with the request
(InvalidRequest naming the option). Array and JSON values may be files: --c2w poses.npy, --intrinsics K.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vidloom import registry
from vidloom.core.errors import InvalidRequest
from vidloom.core.options import Option

ARRAY_FILES = (".npy", ".json")
_TYPES = {"float": float, "int": int}


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument group per option block the registered families declare."""
    for block, families in registry.option_blocks().values():
        options = [option for option in block.options if option.cli]
        if not options:
            continue
        group = parser.add_argument_group(f"{block.name} options ({', '.join(families)})", block.summary)
        for option in options:
            if option.kind == "bool":
                group.add_argument(option.cli_flag, dest=option.name, action="store_true", help=option.help)
            else:
                group.add_argument(option.cli_flag, dest=option.name, type=_TYPES.get(option.kind), default=None,
                                   metavar=option.metavar, help=option.help)


def option_flags() -> dict[str, str]:
    """Option name -> its CLI flag, for errors that name what the user typed."""
    return {option.name: option.cli_flag for block, _ in registry.option_blocks().values()
            for option in block.options if option.cli}


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The option flags the user gave, as request options (files read; absent flags left out)."""
    values: dict[str, Any] = {}
    for block, _ in registry.option_blocks().values():
        for option in block.options:
            value = getattr(args, option.name, None) if option.cli else None
            if value is None or value is False:
                continue
            values[option.name] = _parsed(option, value) if option.kind in ("array", "json") else value
    return values


def _parsed(option: Option, text: str) -> Any:
    """An array (numbers "a,b,c" or a file) or a JSON value (text or a .json file); InvalidRequest naming it."""
    if Path(text).suffix.lower() in ARRAY_FILES:
        return _read_file(option.name, text)
    try:
        if option.kind == "json":
            return json.loads(text)
        return [float(v) for v in text.split(",")]
    except ValueError:
        shown = "JSON text or a .json file" if option.kind == "json" else "numbers 'a,b,c' or a .npy/.json file"
        raise InvalidRequest(option.name, f"expected {shown}, got {text[:40]!r}") from None


def _read_file(field: str, path: str) -> Any:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InvalidRequest(field, f"no such file: {path}")
    try:
        if file.suffix.lower() == ".npy":
            import numpy as np

            return np.load(file, allow_pickle=False)
        return json.loads(file.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise InvalidRequest(field, f"cannot read {path}: {exc}") from None
