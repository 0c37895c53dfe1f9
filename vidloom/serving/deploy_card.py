"""Deployment cards: a YAML file equal to `vidloom serve`'s flags, checked key by key with line numbers.

The accepted keys are the fields of ServeConfig (and, under `deploy:`, of DeployConfig, with
`parallel: {sp, cfg}` for its ParallelPlan), read from the dataclasses themselves: a new config
field is a new card key with no change here. Values are checked against the field's annotation
before the dataclass runs its own checks; every error names the file, the line and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from vidloom.core.errors import VidloomError

KeyPath = tuple[str, ...]
_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")


class DeployCardError(VidloomError, ValueError):
    """A card (or a flag merged into it) that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class CardLayer:
    """Raw settings from one source (a card file, or the command line), nested like the card.

    `where(path)` says where a key came from, for error messages: "deploy.yaml:7" or "--slots".
    """

    values: dict[str, Any]
    origins: dict[KeyPath, str] = field(default_factory=dict)
    default_origin: str = "the command line"

    def where(self, path: KeyPath) -> str:
        for end in range(len(path), 0, -1):
            if path[:end] in self.origins:
                return self.origins[path[:end]]
        return self.default_origin


def load_card(path: Path) -> CardLayer:
    """Read a card file into a layer (raises DeployCardError for unreadable files and bad YAML)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeployCardError(f"deployment card {path}: cannot read it ({exc})") from None
    return parse_card(text, str(path))


def parse_card(text: str, name: str = "<card>") -> CardLayer:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return CardLayer({}, {}, name)
        origins: dict[KeyPath, str] = {}
        values = _node_values(loader, node, (), name, origins)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise DeployCardError(f"{name}{line}: not valid YAML ({exc.problem or exc})") from None
    except yaml.YAMLError as exc:
        raise DeployCardError(f"{name}: not valid YAML ({exc})") from None
    finally:
        loader.dispose()
    if not isinstance(values, dict):
        raise DeployCardError(f"{name}:1: a deployment card is a mapping of settings (key: value), "
                              f"got {type(values).__name__}")
    return CardLayer(values, origins, name)


def _node_values(loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath, name: str,
                 origins: dict[KeyPath, str]) -> Any:
    """Plain Python values from a YAML node, remembering the line of every mapping key."""
    if isinstance(node, yaml.SequenceNode):  # items by index, so errors inside them get their own line
        items = []
        for index, item in enumerate(node.value):
            origins[path + (str(index),)] = f"{name}:{item.start_mark.line + 1}"
            items.append(_node_values(loader, item, path + (str(index),), name, origins))
        return items
    if not isinstance(node, yaml.MappingNode):
        return loader.construct_object(node, deep=True)
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        where = f"{name}:{key_node.start_mark.line + 1}"
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise DeployCardError(f"{where}: keys are setting names, got {key!r}")
        if key in out:
            raise DeployCardError(f"{where}: {_dotted(path + (key,))} is set twice")
        origins[path + (key,)] = where
        out[key] = _node_values(loader, value_node, path + (key,), name, origins)
    return out


def merge(base: CardLayer, over: CardLayer) -> CardLayer:
    """`over` wins key by key (nested mappings merge); origins follow the winning value."""
    values = _deep_merge(base.values, over.values)
    origins = dict(base.origins)
    for path in _leaf_paths(over.values):
        origins[path] = over.where(path)
    return CardLayer(values, origins, base.default_origin)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _leaf_paths(values: Mapping[str, Any], prefix: KeyPath = ()) -> list[KeyPath]:
    paths: list[KeyPath] = []
    for key, value in values.items():
        paths.extend(_leaf_paths(value, prefix + (key,)) if isinstance(value, Mapping) else [prefix + (key,)])
    return paths


# -- building the dataclasses ---------------------------------------------------------------------

def build(cls: type, layer: CardLayer, *, ignore: tuple[str, ...] = ()) -> Any:
    """The dataclass `cls` from a layer's values; `ignore`: top-level sections another reader owns."""
    values = {k: v for k, v in layer.values.items() if k not in ignore}
    return _build(cls, values, (), layer.where)


def build_section(cls: type, layer: CardLayer, section: str) -> Any:
    """The dataclass `cls` from one top-level section of a layer (errors say `section.key`)."""
    return _build(cls, layer.values.get(section, {}), (section,), layer.where)


def card_keys(cls: type) -> dict[str, Any]:
    """Accepted keys of `cls` and their annotations (what a card may say)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _build(cls: type, values: Any, path: KeyPath, where: Callable[[KeyPath], str]) -> Any:
    if not isinstance(values, Mapping):
        raise DeployCardError(f"{where(path)}: {_dotted(path)}: expected a mapping of {cls.__name__} settings, "
                              f"got {_describe(values)}")
    keys = card_keys(cls)
    kwargs: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(keys)}"
            raise DeployCardError(f"{where(path + (key,))}: {_dotted(path + (key,))}: unknown key{hint}")
        kwargs[key] = _convert(raw, keys[key], path + (key,), where)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # the dataclass's own checks (DeployError is a ValueError)
        culprit = _named_in(str(exc), kwargs) or ()
        at = path + culprit
        raise DeployCardError(f"{where(at)}: {_dotted(at) or cls.__name__}: {exc}") from None


def _named_in(message: str, kwargs: Mapping[str, Any]) -> KeyPath | None:
    """The key a dataclass error names first (at one position the longest: `vae_tile_stride`, not `vae_tile`)."""
    found = [(m.start(), -len(key), key) for key in kwargs
             if (m := re.search(rf"\b{re.escape(key)}\b", message))]
    return (min(found)[2],) if found else None


def _convert(value: Any, hint: Any, path: KeyPath, where: Callable[[KeyPath], str]) -> Any:
    def bad(expected: str) -> DeployCardError:
        return DeployCardError(f"{where(path)}: {_dotted(path)}: expected {expected}, got {_describe(value)}")

    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, path, where)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad("an integer")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise bad("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise bad("a path")
        return Path(value)
    if typing.get_origin(hint) is tuple:
        return _convert_tuple(value, args, path, where, bad)
    raise TypeError(f"{_dotted(path)}: cards cannot express {hint!r} yet (teach deploy_card._convert)")


def _convert_tuple(value: Any, args: tuple, path: KeyPath, where: Callable[[KeyPath], str],
                   bad: Callable[[str], DeployCardError]) -> tuple:
    if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: a list
        if _is_pairs(args[0]) and isinstance(value, Mapping):  # (name, value) pairs, written as a mapping
            value = [[key, item] for key, item in value.items()]
        if not isinstance(value, list):
            raise bad("a list")
        return tuple(_convert(item, args[0], path + (str(i),), where) for i, item in enumerate(value))
    if all(a is int for a in args) and isinstance(value, str) and (match := _SHAPE.match(value)):
        if len(args) == 3:  # a shape bucket written like the --warmup flag: 480x832x81
            return tuple(int(g) for g in match.groups())
    if not isinstance(value, list) or len(value) != len(args):
        shape = " or 'HxWxF'" if len(args) == 3 and all(a is int for a in args) else ""
        raise bad(f"a list of {len(args)} values{shape}")
    return tuple(_convert(item, a, path, where) for item, a in zip(value, args))


def _is_pairs(hint: Any) -> bool:
    """tuple[str, str]: one (name, value) entry of a setting a card writes as a mapping (deploy.components)."""
    return typing.get_origin(hint) is tuple and typing.get_args(hint) == (str, str)


# -- printing the effective card -------------------------------------------------------------------

HIDDEN = ("api_key", "api_keys")  # never printed: a card on screen or in a log must not leak a key
_PASSWORD_IN_URL = re.compile(r"(://[^:/@]+):[^@]*@")  # a store URL's password is printed as ***


def card_values(config: Any) -> dict[str, Any]:
    """A config dataclass as card values (what `--print-config` prints and `load_card` reads back)."""
    out: dict[str, Any] = {}
    for name in card_keys(type(config)):
        if name in HIDDEN:
            continue
        out[name] = _plain(getattr(config, name))
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return card_values(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return _PASSWORD_IN_URL.sub(r"\1:***@", value)
    if isinstance(value, tuple):
        if value and all(isinstance(v, tuple) and len(v) == 2 and all(isinstance(p, str) for p in v) for v in value):
            return {name: _plain(item) for name, item in value}  # (name, value) pairs, as _convert reads them
        if len(value) == 3 and all(isinstance(v, int) for v in value):
            return "x".join(str(v) for v in value)
        return [_plain(v) for v in value]
    return value


def dump_card(config: Any, header: str = "") -> str:
    text = yaml.safe_dump(card_values(config), sort_keys=False, default_flow_style=False)
    hidden = [name for name in HIDDEN if getattr(config, name, None)]
    notes = "".join(f"# {name}: set (not printed)\n" for name in hidden)
    return header + notes + text


def _dotted(path: KeyPath) -> str:
    return ".".join(path)


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"
