"""The runtime's view of LoRA (core.adapters.StepAdapters), which whoever builds an Engine hands it: requests'
adapters resolved and applied around their steps, and a model's registry, fusing and card check for a parallel
pool's ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from vidloom.lora.apply import ActiveLoRAs, lora_rows_scope, lora_scope
from vidloom.lora.fuse import fuse_adapters
from vidloom.lora.registry import (
    LoRARegistry, attach_registry, check_lora_card, release_request_loras, resolve_request_loras,
)


class LoRAStepAdapters:
    """The runtime's view of LoRA (core.adapters.StepAdapters): the engine's builder injects it."""

    def resolve(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> ActiveLoRAs | None:
        return resolve_request_loras(instance, loras)

    def scope(self, active: ActiveLoRAs | None) -> contextlib.AbstractContextManager[None]:
        return lora_scope(active)

    def release(self, instance: Any, loras: tuple[tuple[str, float], ...]) -> None:
        release_request_loras(instance, loras)

    def rows_scope(self, parts: Sequence[tuple[ActiveLoRAs | None, int]]) -> contextlib.AbstractContextManager[None]:
        return lora_rows_scope(parts)

    def registry(self, instance: Any, max_loras: int | None = None) -> LoRARegistry:
        return attach_registry(instance, max_loras)

    def fuse(self, instance: Any, adapters: Mapping[str, tuple[str, float]]) -> None:
        fuse_adapters(instance, adapters)

    def check_card(self, card: Any) -> None:
        check_lora_card(card)


LORA_ADAPTERS = LoRAStepAdapters()
"""What VideoGenerator hands its Engine so requests can name loaded LoRA adapters."""
