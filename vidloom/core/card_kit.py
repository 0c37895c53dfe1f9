"""What card builders share: the component table of a diffusers-layout folder."""

from __future__ import annotations

from vidloom.core.card import ComponentSpec

NO_WEIGHTS = ("tokenizer", "scheduler")
FULL_PRECISION = ("vae",)  # VAEs (and vocoders) are run in float32 by their authors


def component_table(precision: str, *names: str, float32: tuple[str, ...] = FULL_PRECISION,
                    no_weights: tuple[str, ...] = NO_WEIGHTS) -> dict[str, ComponentSpec]:
    """ModelCard.components for the folders `names`, in that order: the `no_weights` ones hold no torch module,
    the `float32` ones are held at float32, every other one at the card's `precision`."""
    return {name: ComponentSpec() if name in no_weights else ComponentSpec("float32" if name in float32 else precision)
            for name in names}
