"""Per-request weight adapters (LoRA) as the runtime sees them: resolved once per run, in force around its steps.

The runtime never imports an adapter implementation: whoever builds the Engine (the VideoGenerator) hands
it one (vidloom.lora.step_adapters.LORA_ADAPTERS), so runtime code stays free of family and adapter modules.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Mapping, Protocol, Sequence

from vidloom.core.errors import InvalidRequest


DEFAULT_MAX_LORAS = 4
"""Adapters resident at once unless the deployment says otherwise (each costs its low-rank weights only); loading
one more evicts the least recently used adapter no running request holds."""


class StepAdapters(Protocol):
    """Resolves a request's adapters and applies them around the work a run executes."""

    def resolve(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> Any | None:
        """What a run applies for its request's `loras` (name, scale) pairs; None for none.
        Raises InvalidRequest naming the field when the instance cannot run them."""
        ...

    def scope(self, active: Any | None) -> ContextManager[None]:
        """A context in which `active` (from resolve) is applied; None: base weights only."""
        ...

    def release(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
        """The run that resolved `loras` has ended: its adapters are no longer held (they may be evicted)."""
        ...

    def rows_scope(self, parts: Sequence[tuple[Any | None, int]]) -> ContextManager[None]:
        """A context for one forward over several runs' stacked rows: part i is (what run i resolved, or None;
        its number of rows), in stacking order; each run's adapters apply to its rows only."""
        ...

    def registry(self, instance: Any, max_loras: int | None = None) -> Any:
        """The instance's resident adapters (load, unload, adapters, fused, max_loras), created on first use;
        InvalidRequest("lora") for a model that takes none. A parallel pool's ranks load through it."""
        ...

    def fuse(self, instance: Any, adapters: Mapping[str, tuple[str, float]]) -> None:
        """Add {name: (file, scale)} into the instance's base weights (fuse_loras)."""
        ...

    def check_card(self, card: Any) -> None:
        """InvalidRequest("lora") for a card that takes no adapters."""
        ...


def check_loaded(loras: Sequence[tuple[str, float]], loaded: Sequence[str]) -> None:
    """InvalidRequest naming `loras[i].name` for the first adapter a request names that is not among `loaded`."""
    for i, (name, _) in enumerate(loras):
        if name not in loaded:
            raise InvalidRequest(f"loras[{i}].name", f"no LoRA adapter {name!r} is loaded (loaded: "
                                 f"{list(loaded) or 'none'})")


def check_fused(loras: Sequence[tuple[str, float]], fused: Sequence[tuple[str, float]]) -> None:
    """The fused set is in the weights: a request naming exactly it (same scales) runs them; any other is refused."""
    if dict(loras) != dict(fused):
        shown = ", ".join(f"{name}:{scale:g}" for name, scale in fused)
        raise InvalidRequest("loras", f"this deployment fused {shown} into its weights at load (fuse_loras): "
                             "requests run with that set and may not name other adapters or scales")


class NoAdapters:
    """An engine built without adapters: a request that names one is refused, naming the field."""

    def resolve(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
        check_loaded(loras, [])
        return None

    def scope(self, active: Any | None) -> ContextManager[None]:
        return contextlib.nullcontext()

    def release(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
        return None

    def rows_scope(self, parts: Sequence[tuple[Any | None, int]]) -> ContextManager[None]:
        return contextlib.nullcontext()

    def registry(self, instance: Any, max_loras: int | None = None) -> Any:
        raise InvalidRequest("lora", "this engine was built without LoRA support")

    def fuse(self, instance: Any, adapters: Mapping[str, tuple[str, float]]) -> None:
        raise InvalidRequest("fuse_loras", "this engine was built without LoRA support")

    def check_card(self, card: Any) -> None:
        raise InvalidRequest("lora", "this engine was built without LoRA support")


NO_ADAPTERS = NoAdapters()
