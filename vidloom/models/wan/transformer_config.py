"""Wan transformer architecture (WanTransformerConfig) and its checkpoint names (WAN_TRANSFORMER_NAME_MAP).

Read from a diffusers `transformer/config.json`; every WanTransformer3DModel argument is read or refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from vidloom.core.errors import CheckpointError
from vidloom.loading.config_keys import read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap

DIFFUSERS_CLASS_NAME = "WanTransformer3DModel"
SUPPORTED_QK_NORM = "rms_norm_across_heads"
# Every WanTransformer3DModel.__init__ argument (diffusers 0.42): each is read below; any other key is refused.
CONFIG_KEYS = frozenset({
    "patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
    "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "image_dim", "added_kv_proj_dim",
    "rope_max_seq_len", "pos_embed_seq_len",
})



# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WanTransformerConfig:
    """Architecture of one Wan2.1 T2V transformer; defaults are diffusers' defaults (the 14B model)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    """Latent patch extent as (frames, height, width); also the transformer's downsampling."""
    num_attention_heads: int = 40
    """Attention heads per layer."""
    attention_head_dim: int = 128
    """Channels per head; must be even (RoPE rotates channel pairs)."""
    in_channels: int = 16
    """Latent channels fed in."""
    out_channels: int = 16
    """Channels predicted per latent position."""
    text_dim: int = 4096
    """Width of the text encoder's hidden states."""
    freq_dim: int = 256
    """Width of the sinusoidal timestep features."""
    ffn_dim: int = 13824
    """Hidden width of each block's feed-forward network."""
    num_layers: int = 40
    """Number of transformer blocks."""
    cross_attn_norm: bool = True
    """Whether an affine LayerNorm precedes each cross-attention."""
    qk_norm: str = SUPPORTED_QK_NORM
    """Query/key normalisation; only RMSNorm over all heads at once is implemented."""
    eps: float = 1e-6
    """Epsilon of every LayerNorm and RMSNorm."""
    rope_max_seq_len: int = 1024
    """Largest patch-grid extent along any axis that RoPE is defined for."""
    image_dim: int | None = None
    """Width of the CLIP image tokens (Wan2.1 I2V: 1280); None: no image cross-attention."""
    added_kv_proj_dim: int | None = None
    """Input width of the image key/value projections (equals inner_dim in Wan2.1 I2V); None with image_dim None."""
    pos_embed_seq_len: int | None = None
    """Image tokens per sample when a learned position table is added (first-last-frame: 2 x 257)."""

    def __post_init__(self) -> None:
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"patch_size must be three positive ints, got {self.patch_size!r}")
        if self.attention_head_dim % 2:
            raise ValueError(f"attention_head_dim must be even for RoPE, got {self.attention_head_dim}")
        if self.qk_norm != SUPPORTED_QK_NORM:
            raise ValueError(f"qk_norm must be {SUPPORTED_QK_NORM!r}, got {self.qk_norm!r}")
        if (self.image_dim is None) != (self.added_kv_proj_dim is None):
            raise ValueError("image_dim and added_kv_proj_dim must be set together (image cross-attention)")
        if self.pos_embed_seq_len is not None and self.image_dim is None:
            raise ValueError("pos_embed_seq_len needs image_dim (it positions image tokens)")
        # Normalise lists (JSON) to a tuple so configs compare and hash by value.
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))

    @property
    def takes_image(self) -> bool:
        """Whether cross-attention also reads CLIP image tokens (Wan2.1 I2V / FLF2V)."""
        return self.image_dim is not None

    @property
    def inner_dim(self) -> int:
        """Width of the token stream between blocks."""
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> WanTransformerConfig:
        """Read a diffusers `transformer/config.json` dict; raise CheckpointError for what we cannot run."""
        class_name = cfg.get("_class_name", DIFFUSERS_CLASS_NAME)
        if class_name != DIFFUSERS_CLASS_NAME:
            raise CheckpointError(
                f"transformer config _class_name={class_name!r}: expected {DIFFUSERS_CLASS_NAME!r}"
            )
        qk_norm = cfg.get("qk_norm", SUPPORTED_QK_NORM)
        if qk_norm != SUPPORTED_QK_NORM:
            raise CheckpointError(
                f"transformer config qk_norm={qk_norm!r} (only {SUPPORTED_QK_NORM!r} is implemented): "
                f"this is not a Wan checkpoint vidloom can run"
            )
        KeyPolicy(CONFIG_KEYS).check(cfg, "transformer config")
        defaults = cls()
        in_channels = int(cfg.get("in_channels", defaults.in_channels))
        try:
            return cls(
                patch_size=tuple(cfg.get("patch_size", defaults.patch_size)),  # type: ignore[arg-type]
                num_attention_heads=int(cfg.get("num_attention_heads", defaults.num_attention_heads)),
                attention_head_dim=int(cfg.get("attention_head_dim", defaults.attention_head_dim)),
                in_channels=in_channels,
                # diffusers treats a null/0 out_channels as "same as in_channels".
                out_channels=int(cfg.get("out_channels") or in_channels),
                text_dim=int(cfg.get("text_dim", defaults.text_dim)),
                freq_dim=int(cfg.get("freq_dim", defaults.freq_dim)),
                ffn_dim=int(cfg.get("ffn_dim", defaults.ffn_dim)),
                num_layers=int(cfg.get("num_layers", defaults.num_layers)),
                cross_attn_norm=read_key(cfg, "cross_attn_norm", defaults.cross_attn_norm, strict_bool,
                                         "transformer config"),
                qk_norm=qk_norm,
                eps=float(cfg.get("eps", defaults.eps)),
                rope_max_seq_len=int(cfg.get("rope_max_seq_len", defaults.rope_max_seq_len)),
                image_dim=_optional_int(cfg.get("image_dim")),
                added_kv_proj_dim=_optional_int(cfg.get("added_kv_proj_dim")),
                pos_embed_seq_len=_optional_int(cfg.get("pos_embed_seq_len")),
            )
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"transformer config is malformed: {err}") from err

    def to_diffusers(self) -> dict[str, Any]:
        """A `config.json` dict that diffusers' WanTransformer3DModel accepts and rebuilds this from."""
        return {
            "_class_name": DIFFUSERS_CLASS_NAME,
            "patch_size": list(self.patch_size),
            "num_attention_heads": self.num_attention_heads,
            "attention_head_dim": self.attention_head_dim,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "ffn_dim": self.ffn_dim,
            "num_layers": self.num_layers,
            "cross_attn_norm": self.cross_attn_norm,
            "qk_norm": self.qk_norm,
            "eps": self.eps,
            "image_dim": self.image_dim,
            "added_kv_proj_dim": self.added_kv_proj_dim,
            "rope_max_seq_len": self.rope_max_seq_len,
            "pos_embed_seq_len": self.pos_embed_seq_len,
        }


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


# ---------------------------------------------------------------------------
# Checkpoint names
# ---------------------------------------------------------------------------

WAN_TRANSFORMER_NAME_MAP = NameMap(
    (
        ("patch_embedding", "patch_embed"),
        ("condition_embedder.time_embedder.linear_1", "time_embed.up"),
        ("condition_embedder.time_embedder.linear_2", "time_embed.down"),
        ("condition_embedder.time_proj", "time_modulation"),
        ("condition_embedder.text_embedder.linear_1", "text_embed.up"),
        ("condition_embedder.text_embedder.linear_2", "text_embed.down"),
        ("condition_embedder.image_embedder.norm1", "image_embed.norm_in"),
        ("condition_embedder.image_embedder.ff.net.0.proj", "image_embed.mlp.up"),
        ("condition_embedder.image_embedder.ff.net.2", "image_embed.mlp.down"),
        ("condition_embedder.image_embedder.norm2", "image_embed.norm_out"),
        ("condition_embedder.image_embedder.pos_embed", "image_embed.pos_embed"),
        ("blocks.{n}.scale_shift_table", "blocks.{n}.modulation"),
        ("blocks.{n}.attn1.to_q", "blocks.{n}.self_attn.q"),
        ("blocks.{n}.attn1.to_k", "blocks.{n}.self_attn.k"),
        ("blocks.{n}.attn1.to_v", "blocks.{n}.self_attn.v"),
        ("blocks.{n}.attn1.to_out.0", "blocks.{n}.self_attn.out"),
        ("blocks.{n}.attn1.norm_q", "blocks.{n}.self_attn.norm_q"),
        ("blocks.{n}.attn1.norm_k", "blocks.{n}.self_attn.norm_k"),
        ("blocks.{n}.norm2", "blocks.{n}.cross_norm"),
        ("blocks.{n}.attn2.to_q", "blocks.{n}.cross_attn.q"),
        ("blocks.{n}.attn2.to_k", "blocks.{n}.cross_attn.k"),
        ("blocks.{n}.attn2.to_v", "blocks.{n}.cross_attn.v"),
        ("blocks.{n}.attn2.to_out.0", "blocks.{n}.cross_attn.out"),
        ("blocks.{n}.attn2.norm_q", "blocks.{n}.cross_attn.norm_q"),
        ("blocks.{n}.attn2.norm_k", "blocks.{n}.cross_attn.norm_k"),
        ("blocks.{n}.attn2.add_k_proj", "blocks.{n}.cross_attn.image_k"),
        ("blocks.{n}.attn2.add_v_proj", "blocks.{n}.cross_attn.image_v"),
        ("blocks.{n}.attn2.norm_added_k", "blocks.{n}.cross_attn.image_norm_k"),
        ("blocks.{n}.ffn.net.0.proj", "blocks.{n}.ffn.up"),
        ("blocks.{n}.ffn.net.2", "blocks.{n}.ffn.down"),
        ("scale_shift_table", "out_modulation"),
        ("proj_out", "proj_out"),
    )
)
"""diffusers WanTransformer3DModel state_dict keys <-> WanTransformer parameter names."""
