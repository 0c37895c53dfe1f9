"""The Wan VAE's config: every AutoencoderKLWan config key read, checked or refused, and the Wan2.1 latent
statistics diffusers falls back to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vidloom.core.errors import CheckpointError
from vidloom.loading.config_keys import read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy, Refusal

DIFFUSERS_CLASS_NAME = "AutoencoderKLWan"
# Every AutoencoderKLWan.__init__ argument (diffusers 0.42): each is read or checked in from_diffusers
# (attn_scales must be empty, the scale factors must match the layers); any other key is refused.
CONFIG_KEYS = frozenset({
    "base_dim", "decoder_base_dim", "z_dim", "dim_mult", "num_res_blocks", "attn_scales", "temperal_downsample",
    "dropout", "latents_mean", "latents_std", "is_residual", "in_channels", "out_channels", "patch_size",
    "scale_factor_temporal", "scale_factor_spatial",
})
# Keys AutoencoderKLWan had only for a while (public Wan2.2 TI2V-5B vae/config.json copies carry them).
WAN_VAE_POLICY = KeyPolicy(CONFIG_KEYS, refused={
    # diffusers between #12004 (2025-07-28) and #12041 (2025-07-31), before 0.35.0: true clamped decoded
    # frames to [-1, 1]; since then diffusers always clamps, and so do we (WanVAE.decode).
    "clip_output": Refusal((True,), "false leaves decoded frames unclamped; this runtime always clamps them to "
                                    "[-1, 1], as diffusers does since 0.35.0"),
})

# The statistics Wan2.1 was trained with; diffusers uses them when a config omits them.
WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip

@dataclass(frozen=True)
class WanVAEConfig:
    """Architecture and latent statistics of a Wan2.1 VAE."""

    base_dim: int = 96
    """Channels after the encoder's first conv; every stage is a multiple of it."""
    z_dim: int = 16
    """Latent channels."""
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    """Channel multiplier of each resolution stage, encoder order."""
    num_res_blocks: int = 2
    """Residual blocks per encoder stage (the decoder uses one more)."""
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    """Per encoder downsample, whether it also halves time (diffusers: temperal_downsample)."""
    dropout: float = 0.0
    """Training-time dropout rate; kept for round-tripping, unused at inference."""
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    """Per-channel mean of raw latents, removed before the transformer sees them."""
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD
    """Per-channel std of raw latents, divided out before the transformer sees them."""
    is_residual: bool = False
    """Wan2.2: stages with parameter-free average-down / duplicate-up shortcuts; upsamples keep channels."""
    patch_size: int | None = None
    """Wan2.2: pixels folded patch x patch into channels around the encoder and decoder."""
    decoder_base_dim: int | None = None
    """Decoder width if it differs from base_dim (Wan2.2: 256 vs 160)."""
    in_channels: int = 3
    """Encoder input channels (after patching: 3 * patch^2)."""
    out_channels: int = 3
    """Decoder output channels (before unpatching: 3 * patch^2)."""

    def __post_init__(self) -> None:
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(
                f"temporal_downsample (diffusers: temperal_downsample) has {len(self.temporal_downsample)} entries; "
                f"dim_mult {list(self.dim_mult)} needs {len(self.dim_mult) - 1} (one per downsample)"
            )
        for name in ("latents_mean", "latents_std"):
            if len(getattr(self, name)) != self.z_dim:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, z_dim is {self.z_dim}")

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent pixel along height and width."""
        return 2 ** (len(self.dim_mult) - 1) * (self.patch_size or 1)

    @property
    def decoder_dim(self) -> int:
        return self.base_dim if self.decoder_base_dim is None else self.decoder_base_dim

    @property
    def temporal_factor(self) -> int:
        """Video frames per latent frame, after the first (which maps to one frame)."""
        return 2 ** sum(self.temporal_downsample)

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames of a `num_frames` video: the first frame is one, then one per `temporal_factor`."""
        return (num_frames - 1) // self.temporal_factor + 1

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int, int]:
        """[1, z_dim, T, h, w]: the latents of one video of that size."""
        factor = self.spatial_factor
        return (1, self.z_dim, self.latent_frames(num_frames), height // factor, width // factor)

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> WanVAEConfig:
        """Read a diffusers AutoencoderKLWan config.json dict (Wan2.1 or Wan2.2 layout)."""
        class_name = cfg.get("_class_name", DIFFUSERS_CLASS_NAME)
        if class_name != DIFFUSERS_CLASS_NAME:
            raise CheckpointError(f"VAE config: _class_name is {class_name!r}, expected {DIFFUSERS_CLASS_NAME!r}")
        WAN_VAE_POLICY.check(cfg, "VAE config")
        base_dim = int(cfg.get("base_dim", cls.base_dim))
        decoder_base_dim = cfg.get("decoder_base_dim")
        patch_size = cfg.get("patch_size")
        # diffusers builds attention into the encoder for these scales but cannot run it
        # (and ignores them in the decoder); no released Wan VAE sets any.
        if list(cfg.get("attn_scales") or []):
            raise CheckpointError(f"VAE config: attn_scales={cfg['attn_scales']!r} is not supported; expected []")
        try:
            config = cls(
                base_dim=base_dim,
                z_dim=int(cfg.get("z_dim", cls.z_dim)),
                dim_mult=tuple(int(m) for m in cfg.get("dim_mult", cls.dim_mult)),
                num_res_blocks=int(cfg.get("num_res_blocks", cls.num_res_blocks)),
                temporal_downsample=tuple(bool(t) for t in cfg.get("temperal_downsample", cls.temporal_downsample)),
                dropout=float(cfg.get("dropout", cls.dropout)),
                latents_mean=tuple(float(v) for v in cfg.get("latents_mean", cls.latents_mean)),
                latents_std=tuple(float(v) for v in cfg.get("latents_std", cls.latents_std)),
                is_residual=read_key(cfg, "is_residual", False, strict_bool, "VAE config"),
                patch_size=None if patch_size is None else int(patch_size),
                decoder_base_dim=None if decoder_base_dim in (None, base_dim) else int(decoder_base_dim),
                in_channels=int(cfg.get("in_channels", 3)),
                out_channels=int(cfg.get("out_channels", 3)),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"VAE config: {exc}") from exc
        # Declared factors only matter for tiling in diffusers, but a mismatch means the
        # config describes a different model than its layer lists build.
        for field_name, derived in (
            ("scale_factor_spatial", config.spatial_factor),
            ("scale_factor_temporal", config.temporal_factor),
        ):
            declared = cfg.get(field_name)
            if declared is not None and declared != derived:
                raise CheckpointError(f"VAE config: {field_name}={declared} but the layers give {derived}")
        return config

    def to_diffusers(self) -> dict[str, Any]:
        """This config as a diffusers AutoencoderKLWan config.json dict."""
        return {
            "_class_name": DIFFUSERS_CLASS_NAME,
            "base_dim": self.base_dim,
            "decoder_base_dim": self.decoder_base_dim,
            "z_dim": self.z_dim,
            "dim_mult": list(self.dim_mult),
            "num_res_blocks": self.num_res_blocks,
            "attn_scales": [],
            "temperal_downsample": list(self.temporal_downsample),
            "dropout": self.dropout,
            "latents_mean": list(self.latents_mean),
            "latents_std": list(self.latents_std),
            "is_residual": self.is_residual,
            "patch_size": self.patch_size,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "scale_factor_temporal": self.temporal_factor,
            "scale_factor_spatial": self.spatial_factor,
        }
