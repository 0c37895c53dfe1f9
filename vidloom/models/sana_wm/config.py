"""SanaWMTransformer3DModel config.json -> our frozen config; every key is read or refused by name."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError


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

    # Keys the released config.json carries that select behaviour we implement one way only.
    _FIXED = {
        "pos_embed_type": "wan_rope", "cam_attn_compress": 1, "use_chunk_plucker_post_attn": True,
        "learn_sigma": False, "pred_sigma": False, "mlp_acts": ["silu", "silu", None],
    }
    # Keys that change nothing in the forward (the reference documents them as unused).
    _INERT = frozenset({"init_cam_from_base", "fp32_attention", "image_size", "mixed_precision"})

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
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in cfg.items():
            if key.startswith("_") or key in cls._INERT:
                continue
            if key in cls._FIXED:
                fixed = cls._FIXED[key]
                if (list(value) if isinstance(value, (list, tuple)) else value) != fixed:
                    raise CheckpointError(f"{where}: {key}={value!r} is not supported (only {fixed!r})")
                continue
            if key not in known:
                raise CheckpointError(f"{where}: unsupported config key {key!r}")
            values[key] = tuple(value) if isinstance(value, list) else value
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
