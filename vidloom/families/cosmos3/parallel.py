"""How a Cosmos3 Omni checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
from vidloom.loading.diffusers_dir import DiffusersDir


def token_layout(checkpoint: Path) -> TokenLayout:
    """The generated stream (vision, then sound, then action tokens) sharded as one, with its rotary rows, padded at
    its end when it does not split; the prompt's prefix K/V whole on every rank (generation.py says why). Ulysses
    where sp divides the query heads (grouped K/V repeated when sp does not divide theirs), else ring attention.
    The two CFG branches (each with its own prefix) run one per rank under --cfg-parallel."""
    raw = DiffusersDir.open(checkpoint).component_config("transformer")
    config = Cosmos3GenConfig.from_transformer_config(raw)
    return TokenLayout(num_heads=config.text.num_attention_heads, streams=("video", "sound", "action"),
                       denoisers=("generator",), split="pad")
