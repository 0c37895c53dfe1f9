"""The Wan causal video VAE (Wan2.1, and Wan2.2's 48-channel residual one), numerically equivalent
to diffusers' AutoencoderKLWan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.core.errors import CheckpointError
from vidloom.layers.memory_format import channels_last, use_channels_last
from vidloom.loading.config_keys import read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy, Refusal
from vidloom.loading.name_map import NameMap
from vidloom.models.wan.vae_tiling import SpatialTiling, decode_tiled
from vidloom.models.wan.vae_residual import ResidualDownStage, ResidualUpStage, patchify, unpatchify
from vidloom.models.wan.vae_blocks import (
    CausalCache,
    CausalConv3d,
    Downsample,
    MidBlock,
    RMSNorm,
    ResidualBlock,
    Upsample,
)

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


@dataclass(frozen=True)
class LatentDistribution:
    """Diagonal Gaussian over latents, as the encoder predicts it."""

    mean: Tensor
    """[B, z, T, h, w]."""
    logvar: Tensor
    """[B, z, T, h, w], clamped to [-30, 20] so exp() stays finite."""

    @classmethod
    def from_moments(cls, moments: Tensor) -> LatentDistribution:
        """Split the encoder's [B, 2z, ...] output into mean and (clamped) log-variance."""
        mean, logvar = moments.chunk(2, dim=1)
        return cls(mean=mean, logvar=logvar.clamp(-30.0, 20.0))

    @property
    def std(self) -> Tensor:
        """Standard deviation, exp(logvar / 2)."""
        return torch.exp(0.5 * self.logvar)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """mean + std * noise; the same generator state gives diffusers' sample."""
        # A CPU generator draws on the CPU whatever the latents' device, as diffusers does,
        # so a seed means the same noise everywhere.
        device = generator.device if generator is not None else self.mean.device
        noise = torch.randn(self.mean.shape, generator=generator, device=device, dtype=self.mean.dtype)
        return self.mean + self.std * noise.to(self.mean.device)


class Encoder(nn.Module):
    """Video [B, 3, F, H, W] -> latent moments [B, 2z, T, h, w], one time chunk per call."""

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        dims = [config.base_dim * m for m in (1, *config.dim_mult)]
        self.conv_in = CausalConv3d(config.in_channels, dims[0], 3, padding=1)
        # Flat, like diffusers' down_blocks, so checkpoint indices carry over one to one.
        layers: list[nn.Module] = []
        for stage, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            down = stage < len(config.temporal_downsample)
            temporal = down and config.temporal_downsample[stage]
            if config.is_residual:  # Wan2.2: one module per stage, with its shortcut
                layers.append(ResidualDownStage(in_dim, out_dim, config.num_res_blocks, down, temporal))
                continue
            for _ in range(config.num_res_blocks):
                layers.append(ResidualBlock(in_dim, out_dim))
                in_dim = out_dim
            if down:
                layers.append(Downsample(out_dim, temporal=temporal))
        self.layers = nn.ModuleList(layers)
        self.mid = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1], spatial_dims=3)
        self.conv_out = CausalConv3d(dims[-1], config.z_dim * 2, 3, padding=1)

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        x = cache.stream(self.conv_in, x)
        for layer in self.layers:
            x = layer(x, cache)
        x = self.mid(x, cache)
        return cache.stream(self.conv_out, F.silu(self.norm_out(x)))


class DecoderStage(nn.Module):
    """Residual blocks at one resolution, then an optional upsample."""

    def __init__(self, in_dim: int, out_dim: int, depth: int, upsample: Upsample | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(in_dim if i == 0 else out_dim, out_dim) for i in range(depth))
        self.up = upsample

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        for block in self.blocks:
            x = block(x, cache)
        return x if self.up is None else self.up(x, cache)


class Decoder(nn.Module):
    """Latents [B, z, T, h, w] -> video [B, 3, F, H, W], one latent frame per call."""

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        mult = config.dim_mult
        dims = [config.decoder_dim * m for m in (mult[-1], *reversed(mult))]
        temporal_upsample = tuple(reversed(config.temporal_downsample))
        self.conv_in = CausalConv3d(config.z_dim, dims[0], 3, padding=1)
        self.mid = MidBlock(dims[0])
        stages: list[nn.Module] = []
        in_dim = dims[0]
        for stage, out_dim in enumerate(dims[1:]):
            up = stage != len(mult) - 1
            temporal = up and temporal_upsample[stage]
            if config.is_residual:  # Wan2.2: channel-keeping upsamples and a duplicating shortcut
                stages.append(ResidualUpStage(in_dim, out_dim, config.num_res_blocks + 1, up, temporal))
                in_dim = out_dim
                continue
            upsample = Upsample(out_dim, temporal=temporal) if up else None
            stages.append(DecoderStage(in_dim, out_dim, config.num_res_blocks + 1, upsample))
            # Wan2.1's upsample convs halve the channels on their way out.
            in_dim = out_dim // 2
        self.stages = nn.ModuleList(stages)
        self.norm_out = RMSNorm(dims[-1], spatial_dims=3)
        self.conv_out = CausalConv3d(dims[-1], config.out_channels, 3, padding=1)

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        x = cache.stream(self.conv_in, x)
        x = self.mid(x, cache)
        for stage in self.stages:
            x = stage(x, cache)
        return cache.stream(self.conv_out, F.silu(self.norm_out(x)))


class WanVAE(nn.Module):
    """Wan2.1 VAE encoder and decoder.

    The module holds weights only: each encode/decode call keeps its causal state in a
    CausalCache of its own, so one instance can serve concurrent calls.
    """

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quant_conv = CausalConv3d(config.z_dim * 2, config.z_dim * 2, 1)
        self.post_quant_conv = CausalConv3d(config.z_dim, config.z_dim, 1)
        self.decoder = Decoder(config)
        use_channels_last(self)

    @torch.no_grad()
    def encode(self, video: Tensor) -> LatentDistribution:
        """Video [B, 3, 1 + k*temporal_factor, H, W] in [-1, 1] -> latent distribution with 1 + k frames."""
        step = self.config.temporal_factor
        if video.ndim != 5 or video.shape[1] * (self.config.patch_size or 1) ** 2 != self.config.in_channels:
            raise ValueError(f"video must be [B, 3, F, H, W]; got shape {tuple(video.shape)}")
        frames = video.shape[2]
        if frames < 1 or (frames - 1) % step:
            raise ValueError(f"video has {frames} frames; the Wan VAE needs 1 + {step}*k frames")
        # The first frame is encoded alone (it gets its own latent frame), then each
        # group of `step` frames becomes one latent frame.
        chunks = [video[:, :, :1]]
        if frames > 1:  # split() of an empty time axis would still yield one empty chunk
            chunks += video[:, :, 1:].split(step, dim=2)
        chunks = [channels_last(patchify(chunk, self.config.patch_size or 1)) for chunk in chunks]
        cache = CausalCache()
        moments = []
        for chunk in chunks:
            cache.begin_chunk()
            moments.append(self.encoder(chunk, cache))
        return LatentDistribution.from_moments(self.quant_conv(torch.cat(moments, dim=2)))

    @torch.no_grad()
    def decode(
        self,
        latents: Tensor,
        progress: Callable[[int, int], None] | None = None,
        tiling: SpatialTiling | None = None,
    ) -> Tensor:
        """Raw latents [B, z, T, h, w] -> video [B, 3, 1 + (T-1)*temporal_factor, H, W] clamped to [-1, 1].

        `progress(done, total)` is called after each latent frame (of each tile) is decoded.
        With `tiling`, overlapping spatial tiles are decoded one at a time and blended,
        so peak activation memory follows the tile size instead of the frame size.
        """
        if latents.ndim != 5 or latents.shape[1] != self.config.z_dim:
            raise ValueError(
                f"latents must be [B, {self.config.z_dim}, T, h, w]; got shape {tuple(latents.shape)}"
            )
        x = self.post_quant_conv(channels_last(latents))
        patch = self.config.patch_size or 1
        if tiling is None:
            return unpatchify(self._decode_frames(x, progress, 0, x.shape[2]), patch).clamp(-1.0, 1.0)
        # Wan2.2 (patch 2): tiles decode to the patched grid and blend there, unpatched once at the end, as
        # diffusers' AutoencoderKLWan.tiled_decode does (its tile sizes divided by the patch).
        if tiling.tile % self.config.spatial_factor or tiling.stride % self.config.spatial_factor:
            raise ValueError(f"tile ({tiling.tile}) and stride ({tiling.stride}) must be multiples of "
                             f"{self.config.spatial_factor}")
        patched = SpatialTiling(tile=tiling.tile // patch, stride=tiling.stride // patch)
        tiled = decode_tiled(x, lambda tile, done, total: self._decode_frames(tile, progress, done, total),
                             patched, self.config.spatial_factor // patch)
        return unpatchify(tiled, patch).clamp(-1.0, 1.0)

    def _decode_frames(
        self, x: Tensor, progress: Callable[[int, int], None] | None, done: int, total: int
    ) -> Tensor:
        """Causal decode of post-quant latents [B, z, T, h, w] to the patched pixel grid (Wan2.2: 3 * patch^2
        channels at 1/patch the size); unclamped."""
        cache = CausalCache()
        frames = []
        # One latent frame at a time bounds activation memory by a single chunk.
        for index in range(x.shape[2]):
            cache.begin_chunk()
            frames.append(self.decoder(x[:, :, index : index + 1], cache))
            if progress is not None:
                progress(done + index + 1, total)
        return torch.cat(frames, dim=2)

    def normalize_latents(self, raw: Tensor) -> Tensor:
        """Encoder latents -> the standardised latents the transformer works in."""
        mean, inv_std = self._latent_stats(raw)
        return (raw - mean) * inv_std

    def denormalize_latents(self, z: Tensor) -> Tensor:
        """Transformer latents -> raw latents for `decode`."""
        mean, inv_std = self._latent_stats(z)
        # Dividing by the reciprocal (not multiplying by std) is what WanPipeline does;
        # keeping it makes our latents match bit for bit.
        return z / inv_std + mean

    def _latent_stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        shape = (1, self.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.config.latents_mean, dtype=torch.float32).view(shape)
        # The reciprocal is taken in fp32 before casting, as diffusers does.
        inv_std = 1.0 / torch.tensor(self.config.latents_std, dtype=torch.float32).view(shape)
        return mean.to(like.device, like.dtype), inv_std.to(like.device, like.dtype)


# diffusers AutoencoderKLWan state_dict keys -> WanVAE state_dict keys. Unlisted keys
# (conv_in, conv_out, norm_out, quant_conv, post_quant_conv, norm1/conv1/...) keep their names.
WAN_VAE_NAME_MAP = NameMap(
    (
        # Wan2.2 (is_residual): one down/up block per stage with nested resnets and resamplers.
        ("encoder.down_blocks.{n}.resnets.{n}.conv_shortcut", "encoder.layers.{n}.blocks.{n}.skip"),
        ("encoder.down_blocks.{n}.resnets.{n}", "encoder.layers.{n}.blocks.{n}"),
        ("encoder.down_blocks.{n}.downsampler.resample.1", "encoder.layers.{n}.down.spatial"),
        ("encoder.down_blocks.{n}.downsampler.time_conv", "encoder.layers.{n}.down.temporal"),
        ("decoder.up_blocks.{n}.upsampler.resample.1", "decoder.stages.{n}.upsampler.spatial"),
        ("decoder.up_blocks.{n}.upsampler.time_conv", "decoder.stages.{n}.upsampler.temporal"),
        # Wan2.1
        ("encoder.down_blocks.{n}.conv_shortcut", "encoder.layers.{n}.skip"),
        ("encoder.down_blocks.{n}.resample.1", "encoder.layers.{n}.spatial"),
        ("encoder.down_blocks.{n}.time_conv", "encoder.layers.{n}.temporal"),
        ("encoder.down_blocks.{n}", "encoder.layers.{n}"),
        ("encoder.mid_block.resnets.0", "encoder.mid.res_in"),
        ("encoder.mid_block.attentions.0", "encoder.mid.attn"),
        ("encoder.mid_block.resnets.1", "encoder.mid.res_out"),
        ("decoder.mid_block.resnets.0", "decoder.mid.res_in"),
        ("decoder.mid_block.attentions.0", "decoder.mid.attn"),
        ("decoder.mid_block.resnets.1", "decoder.mid.res_out"),
        ("decoder.up_blocks.{n}.resnets.{n}.conv_shortcut", "decoder.stages.{n}.blocks.{n}.skip"),
        ("decoder.up_blocks.{n}.resnets.{n}", "decoder.stages.{n}.blocks.{n}"),
        ("decoder.up_blocks.{n}.upsamplers.0.resample.1", "decoder.stages.{n}.up.spatial"),
        ("decoder.up_blocks.{n}.upsamplers.0.time_conv", "decoder.stages.{n}.up.temporal"),
    )
)
