"""Cosmos3TextConfig: the understanding pathway's sizes, read from a diffusers transformer/config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import KeyPolicy

HIDDEN_ACTS = ("silu", "relu2")  # Qwen3 backbone (gated SiLU MLP) or Nemotron backbone (squared ReLU)
# Cosmos3OmniTransformer's default mrope split of head_dim/2 frequencies over (t, h, w).
DEFAULT_ROPE_AXES = (24, 20, 20)
# Every Cosmos3OmniTransformer config.json key we read (here and in gen_config.py); any other is refused.
TEXT_KEYS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_axes_dim", "rope_scaling",
    "attention_bias", "hidden_act", "qk_norm_for_text",
})
GENERATION_KEYS = frozenset({
    "latent_channel", "latent_patch_size", "patch_latent_dim", "timestep_scale", "base_fps", "enable_fps_modulation",
    "unified_3d_mrope_temporal_modality_margin", "unified_3d_mrope_reset_spatial_ids", "use_und_k_norm_for_gen",
    "sound_gen", "sound_dim", "sound_latent_fps",
    # The action pathway's switch and sizes (gen_config.py): requests with an `action` block run it.
    "action_gen", "action_dim", "num_embodiment_domains",
})
TRANSFORMER_POLICY = KeyPolicy(TEXT_KEYS | GENERATION_KEYS, harmless={
    "attention_dropout": "a training setting: inference runs without dropout",
    "dtype": "diffusers' load-time precision hint (its class keeps it out of config.json); the runtime's precision "
             "setting decides ours",
    # NVIDIA's convert_model_to_diffusers writes these two after save_pretrained (Cosmos3-Edge); no diffusers
    # Cosmos3OmniTransformer release has them as arguments.
    "backbone_type": "the converter's name for the backbone (e.g. cosmos3_edge_nemotron_dense); hidden_act and "
                     "qk_norm_for_text, which we read, say what it computes",
    "temporal_compression_factor": "restates the VAE's frames per latent frame, which we read from vae/config.json",
})
TRANSFORMER_KEYS = TRANSFORMER_POLICY.known


def check_transformer_keys(raw: Mapping[str, Any]) -> None:
    """CheckpointError naming any key we neither read nor know to be harmless."""
    TRANSFORMER_POLICY.check(raw, "transformer/config.json")


@dataclass(frozen=True)
class Cosmos3TextConfig:
    """Sizes of the Qwen3-VL-style causal text backbone (the "understanding" pathway)."""

    vocab_size: int  # rows of embed/lm_head; padded past the tokenizer's vocabulary in released checkpoints
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int  # GQA: each kv head serves num_attention_heads / num_key_value_heads query heads
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_axes_dim: tuple[int, int, int]  # interleaved mrope: frequencies per (t, h, w) axis, summing to head_dim/2
    attention_bias: bool = False
    hidden_act: str = "silu"
    qk_norm: bool = True  # per-head RMSNorm on q and k before rotary (Qwen3)

    def __post_init__(self) -> None:
        if self.hidden_act not in HIDDEN_ACTS:
            raise CheckpointError(f"transformer/config.json: hidden_act {self.hidden_act!r} not in {HIDDEN_ACTS}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError("transformer/config.json: num_attention_heads must be a multiple of "
                                  f"num_key_value_heads, got {self.num_attention_heads} and {self.num_key_value_heads}")
        if sum(self.rope_axes_dim) != self.head_dim // 2:
            raise CheckpointError(f"transformer/config.json: rope_axes_dim {list(self.rope_axes_dim)} must sum to "
                                  f"head_dim/2 = {self.head_dim // 2}")

    @property
    def kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_transformer_config(cls, raw: Mapping[str, Any]) -> Cosmos3TextConfig:
        """From Cosmos3OmniTransformer's config.json (its defaults where a key is absent)."""
        check_transformer_keys(raw)
        axes = raw.get("rope_axes_dim")
        if axes is None:
            scaling = raw.get("rope_scaling") or {}
            axes = scaling.get("mrope_section", DEFAULT_ROPE_AXES)
        try:
            return cls(
                vocab_size=int(raw.get("vocab_size", 151936)),
                hidden_size=int(raw.get("hidden_size", 4096)),
                intermediate_size=int(raw.get("intermediate_size", 12288)),
                num_hidden_layers=int(raw.get("num_hidden_layers", 36)),
                num_attention_heads=int(raw.get("num_attention_heads", 32)),
                num_key_value_heads=int(raw.get("num_key_value_heads", 8)),
                head_dim=int(raw.get("head_dim", 128)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta", 5000000.0)),
                rope_axes_dim=tuple(int(a) for a in axes),  # type: ignore[arg-type]
                attention_bias=bool(raw.get("attention_bias", False)),
                hidden_act=str(raw.get("hidden_act", "silu")),
                qk_norm=bool(raw.get("qk_norm_for_text", True)),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"transformer/config.json: {exc}") from None

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Bytes of K and V one token holds across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * element_size
