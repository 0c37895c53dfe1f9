"""How an LTX-2 checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

import math
from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.ltx2.transformer import LTX2TransformerConfig


def token_layout(checkpoint: Path) -> TokenLayout:
    """Two streams, video and audio, each sharded on its own and padded at its end when it does not split
    (models.ltx2.shards); the prompt is cross-attention context, whole on every rank. Ulysses where sp divides both
    streams' heads (`num_heads`: their common divisor), else ring attention. --cfg-parallel spreads the step's
    guidance passes (cond, uncond, STG, isolated modalities) over the CFG ranks; both stages shard alike."""
    dit = DiffusersDir.open(checkpoint).parse_component("transformer", LTX2TransformerConfig.from_diffusers)
    heads = math.gcd(dit.num_attention_heads, dit.audio_num_attention_heads)
    return TokenLayout(num_heads=heads, streams=("video", "audio"), split="pad", cfg_passes=4)
