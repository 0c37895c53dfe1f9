"""The HunyuanVideo-1.5 causal video VAE (16x spatial, 4x temporal, 32 latent channels), numerically equivalent
to diffusers' AutoencoderKLHunyuanVideo15, whose state dict it loads unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.core.errors import CheckpointError
from vidloom.families.hunyuan15.vae_blocks import CausalConv3d, Downsample, MidBlock, Stage, Upsample, group_mean
from vidloom.layers.tiling import SpatialTiling, decode_tiles_2d
from vidloom.loading.config_keys import check_class_name, positive_int, positive_ints, read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy
from vidloom.models.wan.vae import LatentDistribution
from vidloom.models.wan.vae_blocks import RMSNorm

DIFFUSERS_CLASS_NAME = "AutoencoderKLHunyuanVideo15"
# Every AutoencoderKLHunyuanVideo15.__init__ argument (diffusers 0.42), all read; any other key is refused.
VAE_POLICY = KeyPolicy(frozenset({
    "in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
    "spatial_compression_ratio", "temporal_compression_ratio", "downsample_match_channel", "upsample_match_channel",
    "scaling_factor",
}))


@dataclass(frozen=True)
class StagePlan:
    """One encoder or decoder stage: resnets `in_dim` -> `out_dim`, then a resample to `resample_dim` (None: none)."""

    in_dim: int
    out_dim: int
    resample_dim: int | None
    temporal: bool


@dataclass(frozen=True)
class Hunyuan15VAEConfig:
    """Architecture of a HunyuanVideo-1.5 VAE (diffusers' names; defaults: the published 480p/720p VAE)."""

    in_channels: int = 3
    """Video channels into the encoder."""
    out_channels: int = 3
    """Video channels out of the decoder."""
    latent_channels: int = 32
    """Latent channels (the encoder predicts twice as many: mean and log-variance)."""
    block_out_channels: tuple[int, ...] = (128, 256, 512, 1024, 1024)
    """Channels of each encoder stage (the decoder runs them reversed)."""
    layers_per_block: int = 2
    """Resnets per encoder stage (the decoder has one more)."""
    spatial_compression_ratio: int = 16
    """Pixels per latent cell along height and width: a power of two, one 2x resample per stage from the first."""
    temporal_compression_ratio: int = 4
    """Frames per latent frame after the first: a power of two, at most the spatial ratio."""
    downsample_match_channel: bool = True
    """An encoder resample outputs the next stage's channels (false: keeps its own)."""
    upsample_match_channel: bool = True
    """A decoder resample outputs the next stage's channels (false: keeps its own)."""
    scaling_factor: float = 1.03682
    """The pipelines divide latents by it before decoding (and multiply encoded ones)."""

    def __post_init__(self) -> None:
        for key in ("spatial_compression_ratio", "temporal_compression_ratio"):
            value = getattr(self, key)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{key}={value} is not a power of two")
        if self.temporal_compression_ratio > self.spatial_compression_ratio:
            raise ValueError(f"temporal_compression_ratio={self.temporal_compression_ratio} exceeds "
                             f"spatial_compression_ratio={self.spatial_compression_ratio}")
        for match in ("downsample_match_channel", "upsample_match_channel"):
            # A matching resample takes the next stage's channels, so the last resample needs a stage after it.
            needed = self._spatial_steps + int(getattr(self, match))
            if len(self.block_out_channels) < needed:
                raise ValueError(f"block_out_channels has {len(self.block_out_channels)} stages; spatial_compression_"
                                 f"ratio={self.spatial_compression_ratio} with {match}="
                                 f"{str(getattr(self, match)).lower()} needs at least {needed}")
        if self.block_out_channels[-1] % (2 * self.latent_channels):
            raise ValueError(f"block_out_channels[-1]={self.block_out_channels[-1]} is not a multiple of "
                             f"2 * latent_channels={2 * self.latent_channels} (the encoder's output shortcut)")
        for plan in self.encoder_stages():
            _check_downsample(plan)
        for plan in self.decoder_stages():
            _check_upsample(plan)

    @property
    def _spatial_steps(self) -> int:
        return self.spatial_compression_ratio.bit_length() - 1

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent cell along height and width."""
        return self.spatial_compression_ratio

    @property
    def temporal_factor(self) -> int:
        """Video frames per latent frame, after the first (which maps to one frame)."""
        return self.temporal_compression_ratio

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames of a 1 + temporal_factor*k frame video."""
        return (num_frames - 1) // self.temporal_factor + 1

    def encoder_stages(self) -> tuple[StagePlan, ...]:
        """The encoder's stages: a 2x resample in each of the first log2(spatial) ones, halving time too in the
        last log2(temporal) of those."""
        dims, spatial = self.block_out_channels, self._spatial_steps
        first_temporal = spatial - (self.temporal_compression_ratio.bit_length() - 1)
        plans, in_dim = [], dims[0]
        for i, out_dim in enumerate(dims):
            resample = None
            if i < spatial:
                resample = dims[i + 1] if self.downsample_match_channel else out_dim
            plans.append(StagePlan(in_dim, out_dim, resample, resample is not None and i >= first_temporal))
            in_dim = out_dim if resample is None else resample
        return tuple(plans)

    def decoder_stages(self) -> tuple[StagePlan, ...]:
        """The decoder's stages over the reversed channels: upsampling in the first log2(spatial) ones, doubling
        time too in the first log2(temporal) of those."""
        dims, temporal = self.block_out_channels[::-1], self.temporal_compression_ratio.bit_length() - 1
        plans, in_dim = [], dims[0]
        for i, out_dim in enumerate(dims):
            resample = None
            if i < self._spatial_steps:
                resample = dims[i + 1] if self.upsample_match_channel else out_dim
            plans.append(StagePlan(in_dim, out_dim, resample, resample is not None and i < temporal))
            in_dim = out_dim if resample is None else resample
        return tuple(plans)

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Hunyuan15VAEConfig:
        """Read a diffusers AutoencoderKLHunyuanVideo15 config.json dict; a bad or unknown key is a CheckpointError
        naming it."""
        where = "VAE config"
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), where)
        VAE_POLICY.check(cfg, where)
        values: dict[str, Any] = {}
        for key in ("in_channels", "out_channels", "latent_channels", "layers_per_block",
                    "spatial_compression_ratio", "temporal_compression_ratio"):
            values[key] = read_key(cfg, key, getattr(cls, key), positive_int, where)
        values["block_out_channels"] = read_key(cfg, "block_out_channels", cls.block_out_channels, _channel_list,
                                                where)
        for key in ("downsample_match_channel", "upsample_match_channel"):
            values[key] = read_key(cfg, key, getattr(cls, key), strict_bool, where)
        values["scaling_factor"] = read_key(cfg, "scaling_factor", cls.scaling_factor, _positive_float, where)
        try:
            return cls(**values)
        except ValueError as exc:
            raise CheckpointError(f"{where}: {exc}") from None

    def to_diffusers(self) -> dict[str, Any]:
        """This config as a diffusers AutoencoderKLHunyuanVideo15 config.json dict."""
        values = {key: getattr(self, key) for key in sorted(VAE_POLICY.read)}
        return {"_class_name": DIFFUSERS_CLASS_NAME, **values, "block_out_channels": list(self.block_out_channels)}


def _channel_list(value: Any) -> tuple[int, ...]:
    channels = positive_ints(value)
    if not channels:
        raise ValueError("expected at least one stage")
    return channels


def _positive_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError("expected a positive number")
    return float(value)


def _check_downsample(plan: StagePlan) -> None:
    # The conv packs out/factor channels into out; the shortcut averages groups of factor*in/out channels
    # (half as many for the lone first frame when time is halved).
    if plan.resample_dim is None:
        return
    factor, dim = (8 if plan.temporal else 4), plan.resample_dim
    group = factor * plan.out_dim // dim
    if dim % factor or (factor * plan.out_dim) % dim or (plan.temporal and group % 2):
        raise ValueError(f"block_out_channels: an encoder resample cannot take {plan.out_dim} to {dim} channels")


def _check_upsample(plan: StagePlan) -> None:
    # The shortcut unpacks the input into space (and time) and repeats each channel factor*out/in times.
    if plan.resample_dim is None:
        return
    factor, dim = (8 if plan.temporal else 4), plan.resample_dim
    repeats = factor * dim // plan.out_dim
    if (factor * dim) % plan.out_dim or (plan.temporal and (plan.out_dim % 8 or repeats % 2)):
        raise ValueError(f"block_out_channels: a decoder resample cannot take {plan.out_dim} to {dim} channels")


class Encoder(nn.Module):
    """Video [B, C, 1 + t*k, s*h, s*w] -> latent moments [B, 2z, 1 + k, h, w]."""

    def __init__(self, config: Hunyuan15VAEConfig) -> None:
        super().__init__()
        dims = config.block_out_channels
        self.moments = 2 * config.latent_channels
        self.conv_in = CausalConv3d(config.in_channels, dims[0])
        self.down_blocks = nn.ModuleList(
            Stage(p.in_dim, p.out_dim, config.layers_per_block, "downsamplers",
                  None if p.resample_dim is None else Downsample(p.out_dim, p.resample_dim, p.temporal))
            for p in config.encoder_stages()
        )
        self.mid_block = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1], spatial_dims=3)
        self.conv_out = CausalConv3d(dims[-1], self.moments)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_in(x)
        for stage in self.down_blocks:
            x = stage(x)
        x = self.mid_block(x)
        # A parameter-free shortcut around the head: channel-group means of the features.
        return self.conv_out(F.silu(self.norm_out(x))) + group_mean(x, self.moments)


class Decoder(nn.Module):
    """Latents [B, z, T, h, w] -> video [B, C, 1 + t*(T-1), s*h, s*w]."""

    def __init__(self, config: Hunyuan15VAEConfig) -> None:
        super().__init__()
        dims = config.block_out_channels[::-1]
        self.repeats = dims[0] // config.latent_channels
        self.conv_in = CausalConv3d(config.latent_channels, dims[0])
        self.up_blocks = nn.ModuleList(
            Stage(p.in_dim, p.out_dim, config.layers_per_block + 1, "upsamplers",
                  None if p.resample_dim is None else Upsample(p.out_dim, p.resample_dim, p.temporal))
            for p in config.decoder_stages()
        )
        self.mid_block = MidBlock(dims[0])
        self.norm_out = RMSNorm(dims[-1], spatial_dims=3)
        self.conv_out = CausalConv3d(dims[-1], config.out_channels)

    def forward(self, z: Tensor) -> Tensor:
        # A parameter-free shortcut around the stem: each latent channel repeated to the first stage's width.
        x = self.conv_in(z) + z.repeat_interleave(self.repeats, dim=1)
        x = self.mid_block(x)
        for stage in self.up_blocks:
            x = stage(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class Hunyuan15VAE(nn.Module):
    """HunyuanVideo-1.5 VAE encoder and decoder; weights only, so one instance serves concurrent calls."""

    def __init__(self, config: Hunyuan15VAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Hunyuan15VAE:
        """Random-initialised VAE of a diffusers config.json dict (load weights with load_state_dict)."""
        return cls(Hunyuan15VAEConfig.from_diffusers(config))

    @torch.no_grad()
    def encode_moments(self, video: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
        """Video [B, C, 1 + t*k, H, W] (H, W multiples of s) in [-1, 1] -> [B, 2z, 1 + k, H/s, W/s]: mean, then
        log-variance. `tiling`: as `decode`'s, in the same pixels (diffusers tiles encode and decode alike)."""
        cfg = self.config
        if video.ndim != 5 or video.shape[1] != cfg.in_channels:
            raise ValueError(f"video must be [B, {cfg.in_channels}, F, H, W]; got shape {tuple(video.shape)}")
        frames, height, width = video.shape[2:]
        if (frames - 1) % cfg.temporal_factor:
            raise ValueError(f"video has {frames} frames; the VAE needs 1 + {cfg.temporal_factor}*k frames")
        if height % cfg.spatial_factor or width % cfg.spatial_factor:
            raise ValueError(f"video is {height}x{width}; the VAE needs multiples of {cfg.spatial_factor}")
        if tiling is None:
            return self.encoder(video)
        s = cfg.spatial_factor
        tile, stride = tiling.in_cells(s)
        if max(height, width) <= tiling.tile:  # as the reference: no tiles for a video within one tile
            return self.encoder(video)
        # Seen as [B, C, F, s, s, H/s, W/s] (s x s pixel blocks over the last two axes), the video tiles by the
        # shared rule with one block per latent cell: tiles of tile/s blocks every stride/s, blended in latents.
        blocks = video.unflatten(4, (-1, s)).unflatten(3, (-1, s)).permute(0, 1, 2, 4, 6, 3, 5)
        return decode_tiles_2d(blocks, self._encode_blocks, SpatialTiling(tile, stride), 1)

    def _encode_blocks(self, blocks: Tensor) -> Tensor:
        b, c, f, s, _, h, w = blocks.shape
        return self.encoder(blocks.permute(0, 1, 2, 5, 3, 6, 4).reshape(b, c, f, h * s, w * s))

    def encode_mode(self, video: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
        """The latent distribution's mean (diffusers' `latent_dist.mode()`)."""
        return LatentDistribution.from_moments(self.encode_moments(video, tiling)).mean

    def encode_sample(
        self, video: Tensor, generator: torch.Generator | None = None, tiling: SpatialTiling | None = None
    ) -> Tensor:
        """A draw from the latent distribution; the same generator state gives diffusers' `latent_dist.sample`."""
        return LatentDistribution.from_moments(self.encode_moments(video, tiling)).sample(generator)

    @torch.no_grad()
    def decode(self, latents: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
        """Raw latents [B, z, T, h, w] -> video [B, C, 1 + t*(T-1), s*h, s*w], unclamped (diffusers' `.sample`).

        With `tiling` (pixels, multiples of `spatial_factor`), a latent larger than one tile is decoded in
        overlapping spatial tiles blended at the seams: diffusers' `tiled_decode` with `tile_sample_min_*` =
        tile, `tile_latent_min_*` = tile / s and a stride of (1 - `tile_overlap_factor`) tiles; its
        `enable_tiling()` defaults are SpatialTiling() (256 every 192) with the published 16x VAE.
        """
        z = self.config.latent_channels
        if latents.ndim != 5 or latents.shape[1] != z:
            raise ValueError(f"latents must be [B, {z}, T, h, w]; got shape {tuple(latents.shape)}")
        if tiling is None:
            return self.decoder(latents)
        tile, _ = tiling.in_cells(self.config.spatial_factor)
        if max(latents.shape[-2:]) <= tile:  # as the reference: no tiles for a latent within one tile
            return self.decoder(latents)
        return decode_tiles_2d(latents, self.decoder, tiling, self.config.spatial_factor)
