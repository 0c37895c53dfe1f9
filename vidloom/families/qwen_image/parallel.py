"""How a Qwen-Image checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.families.qwen_image.transformer import QwenImageTransformerConfig
from vidloom.loading.diffusers_dir import DiffusersDir


def token_layout(checkpoint: Path) -> TokenLayout:
    """Text tokens (each prompt's own length, so the two CFG branches differ) joined in front of the target
    image's tokens, then the edit reference's; the joined stream is sharded, padded at its end when it does not
    split. True CFG runs only with a negative prompt, so --cfg-parallel needs one."""
    dit = DiffusersDir.open(checkpoint).parse_component("transformer", QwenImageTransformerConfig.from_diffusers)
    return TokenLayout(num_heads=dit.num_heads, streams=("text", "image", "reference"), split="pad",
                       cfg_needs=("guidance_scale", "negative_prompt"))
