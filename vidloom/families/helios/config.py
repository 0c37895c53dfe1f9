"""Helios transformer architecture (HeliosTransformerConfig) and its checkpoint names (HELIOS_TRANSFORMER_NAME_MAP).

Read from a diffusers `transformer/config.json`; every HeliosTransformer3DModel argument is read or refused.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from typing import Any

from vidloom.core.errors import CheckpointError
from vidloom.loading.config_keys import check_choice, check_class_name, read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap

DIFFUSERS_CLASS_NAME = "HeliosTransformer3DModel"
WHERE = "transformer config"
SUPPORTED_QK_NORM = "rms_norm_across_heads"
# The history convolutions' padding is fixed in the reference for a (1, 2, 2) patch, so only that patch is run.
SUPPORTED_PATCH = (1, 2, 2)
HISTORY_SCALE_MODES = ("scalar", "per_head")
# Every HeliosTransformer3DModel.__init__ argument (diffusers 0.42): each is read below; any other key is refused.
CONFIG_KEYS = frozenset({
    "patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
    "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "added_kv_proj_dim", "rope_dim",
    "rope_theta", "guidance_cross_attn", "zero_history_timestep", "has_multi_term_memory_patch",
    "is_amplify_history", "history_scale_mode",
})


@dataclass(frozen=True)
class HeliosTransformerConfig:
    """Architecture of one Helios transformer; defaults are diffusers' defaults (the 14B model)."""

    # As in WanTransformerConfig: the chunk's patch (history patches are 2x and 4x it), heads, widths, depth,
    # the affine LayerNorm before cross-attention and the norms' epsilon.
    patch_size: tuple[int, int, int] = SUPPORTED_PATCH
    num_attention_heads: int = 40
    attention_head_dim: int = 128  # equals sum(rope_dim)
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_dim: tuple[int, int, int] = (44, 42, 42)
    """Head channels rotated by the (frame, row, column) position; even each, summing to attention_head_dim."""
    rope_theta: float = 10000.0
    """RoPE base."""
    guidance_cross_attn: bool = True
    """Only the current chunk's tokens attend to the text (history tokens pass cross-attention unchanged)."""
    zero_history_timestep: bool = True
    """History tokens are modulated as at timestep 0 (else at the chunk's timestep)."""
    has_multi_term_memory_patch: bool = True
    """Whether the short/mid/long history patch embeddings exist (history needs them)."""
    is_amplify_history: bool = False
    """Self-attention scales the history tokens' keys by a learned factor in (1, 10)."""
    history_scale_mode: str = "per_head"
    """That factor per head ("per_head") or one for all heads ("scalar")."""

    def __post_init__(self) -> None:
        if self.num_attention_heads * self.attention_head_dim <= 0:
            raise ValueError("num_attention_heads and attention_head_dim must be positive")
        if sum(self.rope_dim) != self.attention_head_dim or any(d % 2 for d in self.rope_dim):
            raise ValueError(f"rope_dim {self.rope_dim} must be even and sum to attention_head_dim "
                             f"{self.attention_head_dim}")

    @property
    def inner_dim(self) -> int:
        """Width of the token stream between blocks."""
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> HeliosTransformerConfig:
        """Read a diffusers `transformer/config.json` dict; raise CheckpointError for what we cannot run."""
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), WHERE)
        KeyPolicy(CONFIG_KEYS).check(cfg, WHERE)
        check_choice(cfg.get("qk_norm", SUPPORTED_QK_NORM), "qk_norm", (SUPPORTED_QK_NORM,), WHERE)
        patch = tuple(int(p) for p in cfg.get("patch_size", SUPPORTED_PATCH))
        check_choice(patch, "patch_size", (SUPPORTED_PATCH,), WHERE)
        if cfg.get("added_kv_proj_dim") is not None:
            # The reference builds these projections but its attention never calls them.
            raise CheckpointError(f"{WHERE}: added_kv_proj_dim={cfg['added_kv_proj_dim']!r} is not supported "
                                  "(Helios' attention never uses the added key/value projections); expected null")
        mode = cfg.get("history_scale_mode", "per_head")
        check_choice(mode, "history_scale_mode", HISTORY_SCALE_MODES, WHERE)
        d = cls()
        values: dict[str, Any] = {key: int(cfg.get(key, getattr(d, key))) for key in _INTS}
        values.update({key: read_key(cfg, key, getattr(d, key), strict_bool, WHERE) for key in _FLAGS})
        try:
            return cls(
                patch_size=patch,  # type: ignore[arg-type]
                out_channels=int(cfg.get("out_channels") or values["in_channels"]),  # null/0: same as in_channels
                eps=float(cfg.get("eps", d.eps)),
                rope_dim=tuple(int(x) for x in cfg.get("rope_dim", d.rope_dim)),  # type: ignore[arg-type]
                rope_theta=float(cfg.get("rope_theta", d.rope_theta)),
                history_scale_mode=str(mode),
                **values,
            )
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{WHERE} is malformed: {err}") from err

    def to_diffusers(self) -> dict[str, Any]:
        """A `config.json` dict that diffusers' HeliosTransformer3DModel accepts and rebuilds this from."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        listed = {key: list(value) if isinstance(value, tuple) else value for key, value in fields.items()}
        return {"_class_name": DIFFUSERS_CLASS_NAME, **listed, "qk_norm": SUPPORTED_QK_NORM, "added_kv_proj_dim": None}


_INTS = ("num_attention_heads", "attention_head_dim", "in_channels", "text_dim", "freq_dim", "ffn_dim", "num_layers")
_FLAGS = ("cross_attn_norm", "guidance_cross_attn", "zero_history_timestep", "has_multi_term_memory_patch",
          "is_amplify_history")


HELIOS_TRANSFORMER_NAME_MAP = NameMap(
    (
        ("patch_embedding", "patch_embed"),
        ("patch_short", "history_embed.short"),
        ("patch_mid", "history_embed.mid"),
        ("patch_long", "history_embed.long"),
        ("condition_embedder.time_embedder.linear_1", "time_embed.up"),
        ("condition_embedder.time_embedder.linear_2", "time_embed.down"),
        ("condition_embedder.time_proj", "time_modulation"),
        ("condition_embedder.text_embedder.linear_1", "text_embed.up"),
        ("condition_embedder.text_embedder.linear_2", "text_embed.down"),
        ("blocks.{n}.scale_shift_table", "blocks.{n}.modulation"),
        ("blocks.{n}.attn1.to_q", "blocks.{n}.self_attn.q"),
        ("blocks.{n}.attn1.to_k", "blocks.{n}.self_attn.k"),
        ("blocks.{n}.attn1.to_v", "blocks.{n}.self_attn.v"),
        ("blocks.{n}.attn1.to_out.0", "blocks.{n}.self_attn.out"),
        ("blocks.{n}.attn1.norm_q", "blocks.{n}.self_attn.norm_q"),
        ("blocks.{n}.attn1.norm_k", "blocks.{n}.self_attn.norm_k"),
        ("blocks.{n}.attn1.history_key_scale", "blocks.{n}.self_attn.history_key_scale"),
        ("blocks.{n}.norm2", "blocks.{n}.cross_norm"),
        ("blocks.{n}.attn2.to_q", "blocks.{n}.cross_attn.q"),
        ("blocks.{n}.attn2.to_k", "blocks.{n}.cross_attn.k"),
        ("blocks.{n}.attn2.to_v", "blocks.{n}.cross_attn.v"),
        ("blocks.{n}.attn2.to_out.0", "blocks.{n}.cross_attn.out"),
        ("blocks.{n}.attn2.norm_q", "blocks.{n}.cross_attn.norm_q"),
        ("blocks.{n}.attn2.norm_k", "blocks.{n}.cross_attn.norm_k"),
        ("blocks.{n}.ffn.net.0.proj", "blocks.{n}.ffn.up"),
        ("blocks.{n}.ffn.net.2", "blocks.{n}.ffn.down"),
        ("norm_out.scale_shift_table", "out_modulation"),
        ("proj_out", "proj_out"),
    )
)
"""diffusers HeliosTransformer3DModel state_dict keys <-> HeliosTransformer parameter names."""
