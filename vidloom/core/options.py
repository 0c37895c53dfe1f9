"""Option blocks: what a request may carry beyond the general fields, declared once for every surface.

A block (a camera, an audio length, a reasoning switch) is a few typed options that the cards which read it
declare (`ModelCard.request_blocks`). The Python keyword arguments of `Generator.generate`, the CLI flags of
`vidloom generate` and the HTTP fields of the served model's request body are all derived from these
declarations, so a family adds its options in its own folder and nothing else. A request holds the values
given under `GenerationRequest.options`; the card's block resolver, if any, checks them and replaces them with
their typed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from vidloom.core.errors import InvalidRequest

KINDS = ("float", "int", "bool", "str", "array", "json")
"""How an option's value is written on each surface:
float / int / str: a number or text everywhere; bool: a switch (a CLI flag without value, true/false in HTTP);
array: numbers (CLI: "a,b,c" or a .npy / .json file; HTTP: a JSON array, or its text in a form);
json: a JSON value (CLI: JSON text or a .json file; HTTP: JSON, or its text in a form)."""


@dataclass(frozen=True)
class Option:
    """One option of a block. `flag`: its CLI flag ("" is --name-with-dashes); `cli` / `http`: whether that
    surface offers it (a value only Python can give, such as a VideoSession, is neither); `metavar`: how
    --help writes its value."""

    name: str
    kind: str
    help: str
    flag: str = ""
    cli: bool = True
    http: bool = True
    metavar: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name!r}: kind {self.kind!r} not in {KINDS}")

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def default(self) -> Any:
        """The value that means "not given": False for a switch, else None."""
        return False if self.kind == "bool" else None

    def check_type(self, value: Any) -> None:
        """InvalidRequest naming the option when a Python value is of the wrong kind (numbers and switches;
        the block's resolver checks the structured kinds)."""
        if self.kind == "bool" and not isinstance(value, bool):
            raise InvalidRequest(self.name, f"must be true or false, got {_shown(value)}")
        if self.kind in ("float", "int"):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or (self.kind == "int" and not float(value).is_integer()):
                raise InvalidRequest(self.name, f"must be a{'n integer' if self.kind == 'int' else ' number'}, "
                                                f"got {_shown(value)}")
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidRequest(self.name, f"must be a finite number, got {value!r}")
        if self.kind == "str" and not isinstance(value, str):
            raise InvalidRequest(self.name, f"must be text, got {type(value).__name__}")


@dataclass(frozen=True)
class OptionBlock:
    """A named group of options that cards declare together. `summary` heads the block in --help and the API
    schema; `refusal` says why a model that does not declare it refuses it (after "<model> does not take
    <option>: ")."""

    name: str
    options: tuple[Option, ...]
    summary: str
    refusal: str

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"option block {self.name!r} declares no option")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.options)


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, (int, float, str, bool)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def options_of(blocks: Iterable[OptionBlock]) -> dict[str, Option]:
    """Every option of `blocks` by name; ValueError when two blocks claim one name."""
    found: dict[str, tuple[Option, str]] = {}
    for block in blocks:
        for option in block.options:
            if option.name in found and found[option.name][1] != block.name:
                raise ValueError(f"option {option.name!r} is declared by blocks {found[option.name][1]!r} and "
                                 f"{block.name!r}")
            found[option.name] = (option, block.name)
    return {name: option for name, (option, _) in found.items()}


def unique_blocks(blocks: Iterable[OptionBlock]) -> tuple[OptionBlock, ...]:
    """`blocks` once each, in first-seen order; ValueError when two different blocks share a name."""
    seen: dict[str, OptionBlock] = {}
    for block in blocks:
        if block.name in seen and seen[block.name] != block:
            raise ValueError(f"two different option blocks are named {block.name!r}")
        seen.setdefault(block.name, block)
    options_of(seen.values())  # one name, one option
    return tuple(seen.values())
