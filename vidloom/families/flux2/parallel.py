"""How a Flux2 checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.families.flux2.cards import DISTILLED_CAPABILITIES, is_distilled
from vidloom.families.flux2.transformer import Flux2TransformerConfig
from vidloom.loading.diffusers_dir import DiffusersDir

NO_CFG_PARALLEL = DISTILLED_CAPABILITIES.why("cfg_parallel")
"""Why a step-distilled checkpoint refuses --cfg-parallel: its card's reason."""


def token_layout(checkpoint: Path) -> TokenLayout:
    """Text tokens (padded to 512) joined in front of the target image's tokens, then every reference image's;
    the joined stream is sharded, padded at its end when it does not split."""
    ckpt = DiffusersDir.open(checkpoint)
    dit = ckpt.parse_component("transformer", Flux2TransformerConfig.from_diffusers)
    return TokenLayout(num_heads=dit.num_heads, streams=("text", "image", "reference"), split="pad",
                       cfg_parallel=NO_CFG_PARALLEL if is_distilled(ckpt.root) else None)
