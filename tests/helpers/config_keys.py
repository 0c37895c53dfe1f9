"""Compare a reference class's config keys (its __init__ parameters) with the keys a loader of ours knows.

diffusers saves exactly the __init__ arguments of a ConfigMixin class (register_to_config) into its config.json,
and a pipeline's __init__ arguments (components and settings) into model_index.json. A key the reference gains
in a new release must be classified by us (read, or refused when set), so these checks fail on any key that is
in the reference but in none of our sets, and on any key of ours the reference no longer has.
"""

from __future__ import annotations

import inspect
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from vidloom.loading.key_policy import KeyPolicy

# An argument no diffusers class has: a loader that refuses unknown keys must name it.
FUTURE_KEY = "zz_key_from_a_future_release"


def reference_keys(cls: type) -> frozenset[str]:
    """The named __init__ parameters of `cls` (what register_to_config / model_index.json can hold)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return frozenset(p.name for p in params
                     if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def assert_keys_classified(cls: type, known: Iterable[str], extra_ok: Iterable[str] = ()) -> None:
    """Every reference key is one we know; every key we know is a reference key (or listed in `extra_ok`)."""
    ours, theirs = frozenset(known), reference_keys(cls)
    unclassified = sorted(theirs - ours)
    assert not unclassified, (f"{cls.__name__} has config key(s) {unclassified} that our loader neither reads nor "
                              f"refuses: decide for each (read it, or refuse values we do not implement)")
    stale = sorted(ours - theirs - frozenset(extra_ok))
    assert not stale, f"our loader lists key(s) {stale} that {cls.__name__} no longer has"


def assert_policy_classified(cls: type, policy: KeyPolicy, extra_read: Iterable[str] = ()) -> None:
    """Today's reference keys are all classified by `policy`; each key it reads is a reference key (or in
    `extra_read`), while harmless and refused keys may be historical (the class had them once) or written by a
    converter: those carry their reason, which must say something."""
    assert_keys_classified(cls, policy.known, extra_ok=(*policy.harmless, *policy.refused, *extra_read))
    for key, reason in policy.harmless.items():
        assert len(reason) > 20, f"harmless key {key!r} of {cls.__name__}: the reason must say why ({reason!r})"
    for key, refusal in policy.refused.items():
        assert refusal.accepts and len(refusal.why) > 20, f"refused key {key!r} of {cls.__name__}: say why"


def assert_refuses_unknown(read: Callable[[dict[str, Any]], Any], base: dict[str, Any] | None = None,
                           errors: tuple[type[BaseException], ...] = (Exception,)) -> None:
    """`read` of `base` plus an unknown key fails naming that key: the known set is the loader's real gate."""
    with pytest.raises(errors, match=FUTURE_KEY):
        read({**(base or {}), FUTURE_KEY: 1})


def unhandled_keys(cls: type, read: Iterable[str], load_with: Callable[[str], object],
                   errors: tuple[type[BaseException], ...] = (ValueError,)) -> list[str]:
    """Keys of `cls` outside `read` that `load_with(key)` (a load with that key set) accepts, or refuses without
    naming them: the behavioural form of assert_keys_classified, for readers with per-key refusals."""
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


def merge_keys(path: Path, **keys: Any) -> None:
    """Merge `keys` into the JSON config at `path` (a checkpoint file a test then loads)."""
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}))


def copy_with_keys(src: Path, folder: Path, file: str = "model_index.json", **keys: Any) -> Path:
    """`folder`: a copy of the checkpoint folder `src` with `keys` merged into its `file`."""
    shutil.copytree(src, folder)
    merge_keys(folder / file, **keys)
    return folder


def assert_refused_at_load(src: Path, folder: Path, file: str = "model_index.json", *, match: str, **keys: Any) -> None:
    """A copy of checkpoint `src` with `keys` merged into its `file` (at `folder`) fails to load: a CheckpointError
    matching `match`."""
    from vidloom.core.errors import CheckpointError
    from vidloom.generator import VideoGenerator

    copy_with_keys(src, folder, file, **keys)
    with pytest.raises(CheckpointError, match=match):
        VideoGenerator.from_pretrained(folder, device="cpu")
