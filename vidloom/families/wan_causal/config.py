"""Architecture of the AnyFlow-FAR causal Wan transformer, and its diffusers checkpoint names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import KeyPolicy, Refusal
from vidloom.loading.name_map import NameMap
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig

DIFFUSERS_CLASS_NAME = "AnyFlowFARTransformer3DModel"
DELTA_TIME_TYPES = ("r", "t-r")
# Every argument of diffusers' AnyFlowFARTransformer3DModel.__init__: unchanged since its first release (diffusers
# 2026-05, "Add AnyFlow ... Pipelines"); convert_anyflow_to_diffusers.py loads the Wan base config into this class,
# so what it saves is exactly these keys.
_WAN_KEYS = frozenset({
    "patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
    "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "eps", "rope_max_seq_len",
})
_FAR_KEYS = frozenset({"compressed_patch_size", "full_chunk_limit", "gate_value", "deltatime_type", "chunk_partition"})
TRANSFORMER_POLICY = KeyPolicy(_WAN_KEYS | _FAR_KEYS, refused={
    "image_dim": Refusal((None,), "CLIP image conditioning is not implemented for FAR (its I2V conditions on "
                                  "context frames instead)"),
})
CONFIG_KEYS = TRANSFORMER_POLICY.known

@dataclass(frozen=True)
class FarTransformerConfig:
    """A Wan2.1 backbone plus what FAR adds; defaults are the released AnyFlow-FAR checkpoints'."""

    wan: WanTransformerConfig
    """The backbone (blocks, widths, full-resolution patch size, RoPE range)."""
    compressed_patch_size: tuple[int, int, int] = (1, 4, 4)
    """Patch extent of far-context (compressed) frames; a multiple of `wan.patch_size` per axis."""
    full_chunk_limit: int = 3
    """Chunks kept at full resolution, the one being generated included; older chunks are compressed."""
    gate_value: float = 0.25
    """Mix of the source-timestep and delta-timestep embeddings: (1 - g) * emb(t) + g * emb(delta)."""
    deltatime_type: str = "r"
    """What the delta embedding sees: the target timestep r ("r") or the interval t - r ("t-r")."""
    chunk_partition: tuple[int, ...] = (1, 3, 3, 3, 3, 3, 3, 2)
    """Default latent frames per chunk (AnyFlow-FAR: 81 frames = 21 latent frames)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compressed_patch_size", tuple(int(p) for p in self.compressed_patch_size))
        object.__setattr__(self, "chunk_partition", tuple(int(c) for c in self.chunk_partition))
        if len(self.compressed_patch_size) != 3:
            raise ValueError(f"compressed_patch_size must be three ints, got {self.compressed_patch_size!r}")
        for full, comp in zip(self.wan.patch_size, self.compressed_patch_size):
            if comp < full or comp % full:
                raise ValueError(
                    f"compressed_patch_size {self.compressed_patch_size} must be a multiple of "
                    f"patch_size {self.wan.patch_size} on every axis"
                )
        if self.wan.patch_size[0] != 1 or self.compressed_patch_size[0] != 1:
            # Chunks are cut on latent frames; a temporal patch would straddle chunk edges.
            raise ValueError("FAR needs a temporal patch size of 1 for both patch sizes")
        if self.full_chunk_limit < 1:
            raise ValueError(f"full_chunk_limit must be >= 1, got {self.full_chunk_limit}")
        if self.deltatime_type not in DELTA_TIME_TYPES:
            raise ValueError(f"deltatime_type must be one of {DELTA_TIME_TYPES}, got {self.deltatime_type!r}")
        if not self.chunk_partition or min(self.chunk_partition) < 1:
            raise ValueError(f"chunk_partition must be positive ints, got {self.chunk_partition!r}")

    @property
    def spatial_downscale(self) -> tuple[int, int]:
        """How many full-resolution patches one compressed patch spans along (height, width)."""
        return (
            self.compressed_patch_size[1] // self.wan.patch_size[1],
            self.compressed_patch_size[2] // self.wan.patch_size[2],
        )

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any], where: str = "transformer config") -> FarTransformerConfig:
        """Read an AnyFlowFARTransformer3DModel `config.json`; CheckpointError for what we cannot run."""
        class_name = cfg.get("_class_name", DIFFUSERS_CLASS_NAME)
        if class_name != DIFFUSERS_CLASS_NAME:
            raise CheckpointError(f"transformer config _class_name={class_name!r}: expected {DIFFUSERS_CLASS_NAME!r}")
        TRANSFORMER_POLICY.check(cfg, where)
        wan_cfg = {k: v for k, v in cfg.items() if k in _WAN_KEYS}
        defaults = cls(wan=WanTransformerConfig())
        try:
            wan = WanTransformerConfig.from_diffusers(wan_cfg)
            return cls(
                wan=wan,
                compressed_patch_size=tuple(cfg.get("compressed_patch_size", defaults.compressed_patch_size)),  # type: ignore[arg-type]
                full_chunk_limit=int(cfg.get("full_chunk_limit", defaults.full_chunk_limit)),
                gate_value=float(cfg.get("gate_value", defaults.gate_value)),
                deltatime_type=str(cfg.get("deltatime_type", defaults.deltatime_type)),
                chunk_partition=tuple(cfg.get("chunk_partition", defaults.chunk_partition)),  # type: ignore[arg-type]
            )
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"transformer config is malformed: {err}") from err


FAR_TRANSFORMER_NAME_MAP = NameMap(
    (
        ("far_patch_embedding", "far_patch_embed"),
        ("condition_embedder.delta_embedder.linear_1", "delta_embed.up"),
        ("condition_embedder.delta_embedder.linear_2", "delta_embed.down"),
        *WAN_TRANSFORMER_NAME_MAP.rules,
    )
)
"""diffusers AnyFlowFARTransformer3DModel keys <-> FarTransformer names: Wan's table plus the FAR-only parts."""
