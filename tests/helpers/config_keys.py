"""Config-key coverage: every parameter a reference class registers is read by our loader or refused by name.

diffusers writes a component's `__init__` parameters (via register_to_config) into its config.json and
a pipeline's into model_index.json, so a key a newer diffusers adds shows up here first. A family's test
passes the reference class, the keys its reader declares it reads, and a function that loads a config
with one extra key set; a key neither read nor refused naming it is listed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

# Never config keys: Python's own and the loader's injected arguments diffusers keeps out of config.json.
NOT_KEYS = frozenset({"self", "args", "kwargs"})


def reference_keys(cls: type) -> frozenset[str]:
    """The names `cls.__init__` registers (its parameters, less self / *args / **kwargs)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return frozenset(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)) - NOT_KEYS


def unhandled_keys(cls: type, read: Iterable[str], load_with: Callable[[str], object],
                   errors: tuple[type[BaseException], ...] = (ValueError,)) -> list[str]:
    """Keys of `cls` that are not in `read` and that `load_with(key)` accepts (or refuses without naming them)."""
    missing = []
    for key in sorted(reference_keys(cls) - set(read)):
        try:
            load_with(key)
        except errors as exc:
            if key in str(exc):
                continue
        missing.append(key)
    return missing


def stale_keys(cls: type, read: Iterable[str]) -> list[str]:
    """Keys our reader declares that `cls` does not have (a typo, or a key the reference dropped)."""
    return sorted(set(read) - reference_keys(cls))
