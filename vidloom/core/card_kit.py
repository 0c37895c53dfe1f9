"""What card builders share: the component table of a diffusers-layout folder, the fields a family's cards
all say alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import ComponentSpec, LoopSpec, ModelCard, RecipeSpec

NO_WEIGHTS = ("tokenizer", "scheduler")
FULL_PRECISION = ("vae",)  # VAEs (and vocoders) are run in float32 by their authors
# Why a family refuses a feature it has nothing to apply to, in the words every family uses.
REFUSALS = MappingProxyType({
    "kv_pool_tokens": "no chat (ar_decode) loop to hold a paged KV pool",
    "kv_session_ttl_s": "no causal rollout whose KV could be kept",
    "offload_idle_expert": "one expert: there is no idle expert",
    "two_stage": "one stage; multi-stage families: ltx2",
    # No list of the families that do: `vidloom models --capabilities` shows them, read from their declarations.
    "devices": "no denoiser token layout to shard (Family.token_layout): sequence parallelism splits a diffusion "
               "transformer's tokens",
    "cfg_parallel": "no denoiser token layout (Family.token_layout): CFG parallelism runs a diffusion "
                    "transformer's guidance branches on separate ranks",
    "text_encoder_rank": "no multi-device plan (Family.token_layout) whose ranks could share one text encoder",
    "components": "component file overrides are read by the Wan, Flux2 and LTX-2 loaders only",
})


def component_table(precision: str, *names: str, float32: tuple[str, ...] = FULL_PRECISION,
                    no_weights: tuple[str, ...] = NO_WEIGHTS) -> dict[str, ComponentSpec]:
    """ModelCard.components for the folders `names`, in that order: the `no_weights` ones hold no torch module,
    the `float32` ones are held at float32, every other one at the card's `precision`."""
    return {name: ComponentSpec() if name in no_weights else ComponentSpec("float32" if name in float32 else precision)
            for name in names}


def refusals(*common: str, **own: str) -> dict[str, str]:
    """Capabilities.why_not: each of `common` refused for its REFUSALS reason, each of `own` for the family's.
    Refusing "devices" (no multi-device plan at all) refuses "cfg_parallel" and "text_encoder_rank" too, for the same
    kind of reason."""
    why = {**{name: REFUSALS[name] for name in common}, **own}
    if "devices" in why:
        why.setdefault("cfg_parallel", own.get("devices", REFUSALS["cfg_parallel"]))
        why.setdefault("text_encoder_rank", own.get("devices", REFUSALS["text_encoder_rank"]))
    return why


@dataclass(frozen=True)
class FamilyCards:
    """What every card of one family says alike: the family, its program, memory estimator and capabilities."""

    family: str
    program: str
    memory_estimator: str | None
    capabilities: Capabilities

    def card(self, model_id: str, source: str, loops: Mapping[str, LoopSpec], *, method: str = "pretrained",
             recipe: RecipeSpec | None = None, **fields: Any) -> ModelCard:
        """The card of checkpoint `model_id` at `source`; unless `recipe` is given, its recipe runs the first of
        `loops` by `method`. `fields` are its other ModelCard fields (a family or capabilities of its own too)."""
        shared = {"family": self.family, "program": self.program, "memory_estimator": self.memory_estimator,
                  "capabilities": self.capabilities}
        return ModelCard(model_id=model_id, source=source, loops=loops,
                         recipe=recipe or RecipeSpec(method=method, loop=next(iter(loops))), **{**shared, **fields})
