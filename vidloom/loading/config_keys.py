"""Reading a diffusers component config.json strictly: values checked key by key (which keys a file may hold at
all is each reader's KeyPolicy, loading/key_policy.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Callable, TypeVar

from vidloom.core.errors import CheckpointError

T = TypeVar("T")


def check_class_name(cfg: Mapping[str, Any], expected: tuple[str, ...], where: str) -> str:
    """The config's `_class_name` (the first expected one when absent); another class is a CheckpointError."""
    name = str(cfg.get("_class_name", expected[0]))
    if name not in expected:
        raise CheckpointError(f"{where}: _class_name is {name!r}, expected {' or '.join(map(repr, expected))}")
    return name


def read_key(cfg: Mapping[str, Any], key: str, default: T, convert: Callable[[Any], T], where: str) -> T:
    """`convert(cfg[key])` (or `default` when absent / null); a value `convert` rejects names the key."""
    value = cfg.get(key)
    if value is None:
        return default
    try:
        return convert(value)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: {key}={value!r} is not valid ({exc})") from None


def check_choice(value: Any, key: str, allowed: Iterable[Any], where: str) -> None:
    """CheckpointError naming `key` unless `value` is one of `allowed`."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise CheckpointError(f"{where}: {key}={value!r} is not supported; expected one of {list(allowed)}")


def positive_int(value: Any) -> int:
    """A JSON integer >= 1 (not a bool, not 2.5); for read_key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or int(value) < 1:
        raise ValueError("expected a positive integer")
    return int(value)


def positive_ints(value: Any) -> tuple[int, ...]:
    """A JSON list of positive integers; for read_key."""
    if not isinstance(value, (list, tuple)):
        raise ValueError("expected a list of positive integers")
    return tuple(positive_int(v) for v in value)


def strict_bool(value: Any) -> bool:
    """A JSON true / false (not 0, 1 or "yes"); for read_key."""
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value
