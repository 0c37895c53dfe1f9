"""SanaWMTransformer3DModel config.json -> our frozen config; every key is read or refused by name."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import KeyPolicy, Refusal


@dataclass(frozen=True)
class SanaWMConfig:
    """Architecture of the SANA-WM stage-1 DiT (defaults: the public 1600M bidirectional release)."""

    in_channels: int = 128
    num_layers: int = 20
    hidden_size: int = 2240
    num_attention_heads: int = 20  # cross-attention heads
    patch_size: tuple[int, int, int] = (1, 1, 1)
    softmax_every_n: int = 4  # every n-th block uses softmax attention instead of the GDN recurrence
    linear_head_dim: int = 112  # self-attention head width (GDN and softmax blocks alike)
    ffn_type: str = "GLUMBConvTemp"
    t_kernel_size: int = 3
    conv_kernel_size: int = 4  # temporal short convolution of the GDN blocks; 0 disables it
    k_conv_only: bool = True
    use_pe: bool = True
    qk_norm: bool = True
    cross_norm: bool = True
    y_norm: bool = True
    chunk_plucker_channels: int = 48
    chunk_plucker_post_attn_blocks: int = 20  # blocks [0, n) add the plucker embedding after attention; <0: all
    caption_channels: int = 2304
    mlp_ratio: float = 3.0

    @property
    def head_dim(self) -> int:
        return self.linear_head_dim

    @property
    def self_attn_heads(self) -> int:
        return self.hidden_size // self.linear_head_dim

    def is_softmax_block(self, index: int) -> bool:
        return self.softmax_every_n > 0 and (index + 1) % self.softmax_every_n == 0

    def has_plucker_proj(self, index: int) -> bool:
        n = self.chunk_plucker_post_attn_blocks
        return n < 0 or index < n

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any], where: str = "transformer/config.json") -> SanaWMConfig:
        """Read a SanaWMTransformer3DModel config.json (TRANSFORMER_POLICY); CheckpointError for what we cannot run."""
        TRANSFORMER_POLICY.check(cfg, where)
        values = {f.name: tuple(cfg[f.name]) if isinstance(cfg[f.name], list) else cfg[f.name]
                  for f in fields(cls) if f.name in cfg}
        config = cls(**values)
        config.validate(where)
        return config

    def validate(self, where: str) -> None:
        if self.ffn_type not in ("GLUMBConvTemp", "mlp"):
            raise CheckpointError(f"{where}: ffn_type={self.ffn_type!r} is not supported (GLUMBConvTemp or mlp)")
        if self.patch_size[0] != 1:
            raise CheckpointError(f"{where}: patch_size={self.patch_size} must be (1, p, p)")
        if self.hidden_size % self.linear_head_dim or self.linear_head_dim % 8:
            raise CheckpointError(f"{where}: linear_head_dim={self.linear_head_dim} must divide hidden_size="
                                  f"{self.hidden_size} and be a multiple of 8 (the camera branch rotates 4-vectors "
                                  "in half of each head)")
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(f"{where}: num_attention_heads={self.num_attention_heads} must divide hidden_size")


_CONSTANT = "as every released SANA-WM model sets it; the only layout we implement"
# SanaWMTransformer3DModel's __init__ keys (diffusers 0.42.1, where SANA-WM first appears; NVIDIA's converter saves
# the class's defaults). The stage-1 DiT is built one way for six of them; four the reference itself never reads.
TRANSFORMER_POLICY = KeyPolicy(frozenset(f.name for f in fields(SanaWMConfig)), harmless={
    "init_cam_from_base": "the reference ignores it: the camera branch always comes from the checkpoint",
    "fp32_attention": "the reference ignores it: attention runs its fixed precision path either way",
    "image_size": "a nominal training size; the request's height and width set the grid",
    "mixed_precision": "the training precision; the load's dtype decides ours",
}, refused={
    "pos_embed_type": Refusal(("wan_rope",), f"positions are Wan-style 3-D RoPE ({_CONSTANT})"),
    "cam_attn_compress": Refusal((1,), f"camera attention is uncompressed ({_CONSTANT})"),
    "use_chunk_plucker_post_attn": Refusal((True,), f"the Plucker camera embedding is added after attention "
                                                    f"({_CONSTANT})"),
    "learn_sigma": Refusal((False,), "a learned-variance output doubles the output channels; the flow model has none"),
    "pred_sigma": Refusal((False,), "a predicted-variance output doubles the output channels; the flow model has none"),
    "mlp_acts": Refusal((["silu", "silu", None],), f"the GLUMBConv feed-forward activations ({_CONSTANT})"),
})
