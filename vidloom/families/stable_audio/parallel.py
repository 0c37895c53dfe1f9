"""How a Stable Audio checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import TokenLayout
from vidloom.families.stable_audio.transformer import StableAudioDiTConfig
from vidloom.loading.diffusers_dir import DiffusersDir


def token_layout(checkpoint: Path) -> TokenLayout:
    """The global token (duration + noise level) in front of the latent's time steps, sharded as one stream, padded
    at its end when it does not split; the text is cross-attention context, whole on every rank. Classic CFG."""
    dit = DiffusersDir.open(checkpoint).parse_component("transformer", StableAudioDiTConfig.from_diffusers)
    return TokenLayout(num_heads=dit.num_heads, streams=("global", "audio"), split="pad")
