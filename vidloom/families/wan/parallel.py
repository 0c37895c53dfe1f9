"""How a Wan checkpoint's tokens shard under a parallel plan, read from its config files (no weights)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.parallel import SequenceGeometry, TokenLayout
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.models.wan.vae import WanVAEConfig


def sequence_geometry(checkpoint: Path) -> SequenceGeometry:
    """Heads, patch size and VAE factors of the checkpoint in `checkpoint`; read in the parent process."""
    ckpt = DiffusersDir.open(checkpoint)
    dit = ckpt.parse_component("transformer", WanTransformerConfig.from_diffusers)
    vae = ckpt.parse_component("vae", WanVAEConfig.from_diffusers)
    return SequenceGeometry(
        num_heads=dit.num_attention_heads,
        patch_size=dit.patch_size,
        vae_spatial=vae.spatial_factor,
        vae_temporal=vae.temporal_factor,
    )


def token_layout(checkpoint: Path) -> TokenLayout:
    """Wan's sequence is the video patch grid alone (text and CLIP image tokens are cross-attention context,
    whole on every rank); it must split evenly. Both A14B experts shard alike."""
    grid = sequence_geometry(checkpoint)
    return TokenLayout(num_heads=grid.num_heads, streams=("video",), denoisers=("transformer", "transformer_2"),
                       split="even", grid=grid)
