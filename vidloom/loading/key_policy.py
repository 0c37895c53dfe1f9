"""What a reader does with each key of a config file: reads it, accepts it as harmless, or refuses its value.

A config class's keys change across releases (diffusers and transformers add, rename and drop __init__
arguments), and official converters write keys of their own, so the files people download carry keys that
today's class signature no longer has. A reader's KeyPolicy classifies every key the class has had since its
family's first public checkpoint, with a reason for each one it does not read:

- read: the reader uses it;
- harmless: accepted and ignored, with the reason it cannot change what we compute (an fp16 hint, a training
  setting, a restatement of another key); a load records each one it met (`recording_accepted_keys`);
- refused: accepted only at values meaning the behaviour we implement; another value names key, value and why.

Any other key is still an error: a key that changes behaviour must never be silently ignored.
docs/reference/config-keys.md lists every table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vidloom.core.errors import CheckpointError

# Written by diffusers' save_pretrained next to the architecture keys; they say nothing about the weights.
DIFFUSERS_META_KEYS = frozenset({"_class_name", "_diffusers_version", "_name_or_path", "_use_default_values"})
DOCS = "docs/reference/config-keys.md"


@dataclass(frozen=True)
class Refusal:
    """A key whose `accepts` values (JSON values; None is `null`) mean what we run; any other value is refused."""

    accepts: tuple[Any, ...]
    why: str


@dataclass(frozen=True)
class AcceptedKey:
    """A harmless key one load met: the file (or config) it came from, its value and why it is ignored."""

    where: str
    key: str
    value: Any
    reason: str

    def __str__(self) -> str:
        """`key=value in where: reason` (the key first: a summary lists the names before the first "=")."""
        return f"{self.key}={self.value!r} in {self.where}: {self.reason}"


@dataclass(frozen=True)
class KeyPolicy:
    """The keys one config class may hold, each read, harmless (key -> reason) or refused (key -> Refusal)."""

    read: frozenset[str]
    harmless: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, Refusal] = field(default_factory=dict)
    # Bookkeeping the file's writer adds to every config (diffusers' _class_name..., transformers' model_type and
    # PreTrainedConfig defaults): accepted without a record, since every file of that writer has them.
    meta: frozenset[str] = DIFFUSERS_META_KEYS
    # Harmless keys today's class itself writes into every file (a scheduler's settings for a path the loader
    # refuses): listed with their reasons, but not recorded, so a load's notes name only what sets its files
    # apart from a fresh save (old keys, converter extras).
    quiet: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "read", frozenset(self.read))
        object.__setattr__(self, "quiet", frozenset(self.quiet))
        assert self.quiet <= set(self.harmless), f"quiet keys must be harmless: {sorted(self.quiet)}"
        object.__setattr__(self, "harmless", MappingProxyType(dict(self.harmless)))
        object.__setattr__(self, "refused", MappingProxyType(dict(self.refused)))
        overlap = (self.read & set(self.harmless)) | (self.read & set(self.refused)) | (
            set(self.harmless) & set(self.refused))
        assert not overlap, f"a key has two classes: {sorted(overlap)}"

    @property
    def known(self) -> frozenset[str]:
        """Every key this policy classifies (the reference-class comparison in the tests reads it)."""
        return self.read | frozenset(self.harmless) | frozenset(self.refused)

    def accepts(self, key: str, value: Any) -> bool:
        """Whether refused key `key` may hold `value` (JSON equality, true kept apart from 1)."""
        return any(_same(value, ok) for ok in self.refused[key].accepts)

    def check(self, cfg: Mapping[str, Any], where: str) -> tuple[str, ...]:
        """The harmless keys `cfg` holds (recorded for the running load); CheckpointError on an unknown key or
        a refused value, naming the key, and for a refusal its value and why."""
        unknown = sorted(set(cfg) - self.known - self.meta)
        if unknown:
            raise CheckpointError(f"{where}: unsupported config key(s) {', '.join(unknown)}; this runtime reads "
                                  f"{', '.join(sorted(self.read))} (every key it knows: {DOCS})")
        for key, refusal in self.refused.items():
            if key in cfg and not self.accepts(key, cfg[key]):
                shown = " or ".join("null" if ok is None else repr(ok) for ok in refusal.accepts)
                raise CheckpointError(f"{where}: {key}={cfg[key]!r} is not supported: {refusal.why} "
                                      f"(this runtime runs {key}={shown})")
        present = tuple(key for key in self.harmless if key in cfg)
        record, path = _RECORD.get(), _FILE.get()
        for key in present if record is not None else ():
            if key in self.quiet:
                continue
            met = AcceptedKey(path or where, key, cfg[key], self.harmless[key])
            if met not in record:  # a card builder and the loader may both read one file
                record.append(met)
        return present


def _same(value: Any, accepted: Any) -> bool:
    """JSON equality that keeps true apart from 1 (Python's True == 1) and takes a tuple for a JSON array (an
    in-memory diffusers config holds tuples where its config.json has lists)."""
    if isinstance(value, bool) or isinstance(accepted, bool):
        return value is accepted
    if isinstance(value, (list, tuple)) and isinstance(accepted, (list, tuple)):
        return len(value) == len(accepted) and all(_same(v, a) for v, a in zip(value, accepted))
    return bool(value == accepted)


# The harmless keys met by the load running in this context. Readers are pure functions of one config dict,
# called from card builders and loaders alike; the load (registry.load_instance) opens a record around them
# and puts what they met on its ModelInstance, instead of every config dataclass carrying a field for it.
_RECORD: ContextVar[list[AcceptedKey] | None] = ContextVar("vidloom_accepted_keys", default=None)
# The file a caller is parsing (DiffusersDir.parse_component), so a record names it rather than the reader's label.
_FILE: ContextVar[str | None] = ContextVar("vidloom_config_file", default=None)


@contextmanager
def reading_file(path: object) -> Iterator[None]:
    """Inside the block, accepted keys are recorded as coming from `path`."""
    token = _FILE.set(str(path))
    try:
        yield
    finally:
        _FILE.reset(token)


@contextmanager
def recording_accepted_keys() -> Iterator[list[AcceptedKey]]:
    """Collect, in order and once each, the harmless keys every KeyPolicy.check inside the block accepts."""
    record: list[AcceptedKey] = []
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)
