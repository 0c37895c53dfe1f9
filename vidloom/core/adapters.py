"""Per-request weight adapters (LoRA) as the runtime sees them: resolved once per run, in force around its steps.

The runtime never imports an adapter implementation: whoever builds the Engine (the VideoGenerator) hands
it one (vidloom.lora.LORA_ADAPTERS), so runtime code stays free of family and adapter modules.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Protocol, Sequence

from vidloom.core.errors import InvalidRequest


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


class NoAdapters:
    """An engine built without adapters: a request that names one is refused, naming the field."""

    def resolve(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
        if loras:
            raise InvalidRequest("loras[0].name", f"no LoRA adapter {loras[0][0]!r} is loaded (loaded: none)")
        return None

    def scope(self, active: Any | None) -> ContextManager[None]:
        return contextlib.nullcontext()

    def release(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
        return None

    def rows_scope(self, parts: Sequence[tuple[Any | None, int]]) -> ContextManager[None]:
        return contextlib.nullcontext()


NO_ADAPTERS = NoAdapters()
