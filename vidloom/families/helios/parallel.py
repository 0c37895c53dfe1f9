"""How a Helios checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.families.helios.config import HeliosTransformerConfig
from vidloom.loading.diffusers_dir import DiffusersDir


def token_layout(checkpoint: Path) -> TokenLayout:
    """The compressed history tokens (long, mid, short) in front of the chunk's, sharded as one stream with their RoPE
    rows, padded at its end when it does not split; the text is cross-attention context, whole on every rank. Both
    pipelines run two-branch CFG (the base's classic combine, the Mid pyramid's CFG-Zero*), each branch on its own
    rank under --cfg-parallel, combined alike on both."""
    dit = DiffusersDir.open(checkpoint).parse_component("transformer", HeliosTransformerConfig.from_diffusers)
    return TokenLayout(num_heads=dit.num_attention_heads, streams=("history", "video"), split="pad")
