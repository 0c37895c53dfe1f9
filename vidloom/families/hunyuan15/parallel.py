"""How a HunyuanVideo-1.5 checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.families.hunyuan15.transformer import Hunyuan15TransformerConfig
from vidloom.loading.diffusers_dir import DiffusersDir


def token_layout(checkpoint: Path) -> TokenLayout:
    """The video tokens, then the condition tokens (image, glyph, text: each prompt's valid ones, so the two CFG
    branches differ in length) as one joint stream; sharded, padded at its end when it does not split. CFG runs
    as the saved guider decides (guidance_scale > 1 on some step), each branch on its own rank under
    --cfg-parallel."""
    dit = DiffusersDir.open(checkpoint).parse_component("transformer", Hunyuan15TransformerConfig.from_diffusers)
    return TokenLayout(num_heads=dit.num_heads, streams=("video", "image", "glyph", "text"), split="pad")
