"""The one resolver of plug strings: `"package.module:attribute"` (or `".module:attribute"` relative to a family
package) -> the object it names. Every lazy table and card field in the package resolves through `resolve`, so
the layering test reads plug points as it reads imports."""

from __future__ import annotations

import importlib
import re
from typing import Any

# "pkg.module:attr", or ".module:attr" (relative to the package given alongside it).
PLUG = re.compile(r"\.?[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class PlugError(ValueError):
    """A malformed plug string (a missing module raises ImportError, a missing attribute AttributeError)."""


def check(target: str) -> str:
    """`target` unchanged, or PlugError when it is not a "module:attribute" string."""
    if not isinstance(target, str) or not PLUG.fullmatch(target):
        raise PlugError(f"{target!r} is not a plug string (\"package.module:attribute\" or \".module:attribute\")")
    return target


def absolute(target: str, package: str | None = None) -> str:
    """`target` with a leading-dot module made absolute under `package`."""
    check(target)
    if not target.startswith("."):
        return target
    if not package:
        raise PlugError(f"{target!r} is relative and no package was given to resolve it in")
    return package + target


def resolve(target: str, package: str | None = None) -> Any:
    """The object `target` names (its module imported on first use); `package` anchors a relative target."""
    module, _, name = absolute(target, package).partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:
        raise AttributeError(f"plug {target!r}: module {module!r} has no attribute {name!r}") from None
