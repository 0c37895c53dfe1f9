"""The LTX-2 latent upsampler (diffusers `LTX2LatentUpsamplerModel`) and the latent path around it.

The module works on raw (denormalised) VAE latents: conv trunk -> residual blocks -> a learned 2x (or
rational 3/2, 3/4, 4x) spatial and/or 2x temporal resample -> residual blocks -> conv back to the latent
width. `upsample_latents` reproduces LTX2LatentUpsamplePipeline's latent path (denormalise, upsample,
optional AdaIN and tone mapping) and re-normalises for the refinement pass, as LTX2Pipeline does with
latents it is handed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap
from vidloom.models.ltx2.video_vae import LTX2VideoVAE, LTX2VideoVAEConfig
from vidloom.models.ltx2.video_vae_config import read_scalar

# diffusers latent_upsampler.RATIONAL_RESAMPLER_SCALE_MAPPING: scale -> (upsample by, then blur-downsample by).
RATIONAL_SCALES = {0.75: (3, 4), 1.5: (3, 2), 2.0: (2, 1), 4.0: (4, 1)}
GROUPS = 32  # GroupNorm groups in every block
BLUR_TAPS = 5  # binomial anti-alias kernel [1, 4, 6, 4, 1]
SOURCE = "latent upsampler config.json"


@dataclass(frozen=True)
class LTX2LatentUpsamplerConfig:
    """Architecture of one latent upsampler; defaults are diffusers' (LTX-2's spatial 2x checkpoint)."""

    in_channels: int = 128
    mid_channels: int = 1024
    num_blocks_per_stage: int = 4
    dims: int = 3
    spatial_upsample: bool = True
    temporal_upsample: bool = False
    rational_spatial_scale: float = 2.0
    use_rational_resampler: bool = True

    @property
    def spatial_scale(self) -> float:
        if not self.spatial_upsample:
            return 1.0
        return self.rational_spatial_scale if self.use_rational_resampler and not self.temporal_upsample else 2.0

    @property
    def uses_rational_resampler(self) -> bool:
        return self.spatial_upsample and not self.temporal_upsample and self.use_rational_resampler

    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """The config.json keys from_diffusers reads (UPSAMPLER_POLICY); any other is refused."""
        return UPSAMPLER_POLICY.known

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> LTX2LatentUpsamplerConfig:
        """Read an `LTX2LatentUpsamplerModel` config.json; unknown keys or unsupported values -> CheckpointError."""
        UPSAMPLER_POLICY.check(cfg, SOURCE)
        fields = cls.__dataclass_fields__
        defaults = cls()
        config = cls(**{name: read_scalar(cfg, name, type(getattr(defaults, name)), getattr(defaults, name), SOURCE)
                        for name in fields})
        if config.dims not in (2, 3):
            raise CheckpointError(f"{SOURCE}: dims={config.dims} is not supported (2 or 3)")
        if not (config.spatial_upsample or config.temporal_upsample):
            raise CheckpointError(f"{SOURCE}: spatial_upsample and temporal_upsample are both false")
        if config.temporal_upsample and config.dims == 2:
            raise CheckpointError(f"{SOURCE}: temporal_upsample needs dims=3 (diffusers cannot run dims=2 in time)")
        if config.uses_rational_resampler and config.rational_spatial_scale not in RATIONAL_SCALES:
            raise CheckpointError(f"{SOURCE}: rational_spatial_scale={config.rational_spatial_scale} is not "
                                  f"supported (known: {', '.join(map(str, RATIONAL_SCALES))})")
        if config.mid_channels % GROUPS:
            raise CheckpointError(f"{SOURCE}: mid_channels={config.mid_channels} is not a multiple of {GROUPS}")
        return config


# Only the Sequential's conv is renamed; everything else keeps diffusers' names.
LTX2_UPSAMPLER_NAME_MAP = NameMap((("upsampler.0", "upsampler.conv"),))


# LTX2LatentUpsamplerModel has had these __init__ keys since LTX-2's first diffusers release (2026-01); every one
# is read (the values that we cannot run are refused by from_diffusers' checks).
UPSAMPLER_POLICY = KeyPolicy(frozenset(LTX2LatentUpsamplerConfig.__dataclass_fields__))


def _conv(dims: int, cin: int, cout: int) -> nn.Module:
    return (nn.Conv2d if dims == 2 else nn.Conv3d)(cin, cout, kernel_size=3, padding=1)


class ResBlock(nn.Module):
    """conv -> GroupNorm -> SiLU -> conv -> GroupNorm, then SiLU of the sum with the input."""

    def __init__(self, channels: int, dims: int) -> None:
        super().__init__()
        self.conv1 = _conv(dims, channels, channels)
        self.norm1 = nn.GroupNorm(GROUPS, channels)
        self.conv2 = _conv(dims, channels, channels)
        self.norm2 = nn.GroupNorm(GROUPS, channels)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm2(self.conv2(F.silu(self.norm1(self.conv1(x)))))
        return F.silu(h + x)


def _pixel_shuffle(x: Tensor, factors: tuple[int, ...]) -> Tensor:
    """Depth -> space on the trailing len(factors) axes; channel order (c, f1, f2, ...) as diffusers' PixelShuffleND."""
    n = len(factors)
    x = x.unflatten(1, (-1, *factors))
    # [B, C, f1..fn, D1..Dn] -> [B, C, D1, f1, ..., Dn, fn]
    order = [0, 1] + [p for i in range(n) for p in (2 + n + i, 2 + i)] + list(range(2 + 2 * n, x.ndim))
    x = x.permute(*order)
    for i in reversed(range(n)):
        x = x.flatten(2 + 2 * i, 3 + 2 * i)
    return x


class ConvShuffle(nn.Module):
    """A conv to factor-times the width, then pixel shuffle (2x in space, time, or both)."""

    def __init__(self, dims: int, channels: int, factors: tuple[int, ...]) -> None:
        super().__init__()
        self.factors = factors
        self.conv = _conv(dims, channels, channels * math.prod(factors))

    def forward(self, x: Tensor) -> Tensor:
        return _pixel_shuffle(self.conv(x), self.factors)


class RationalResampler(nn.Module):
    """Per-frame 2D: conv + pixel shuffle up by `num`, then binomial blur + stride down by `den`."""

    def __init__(self, channels: int, scale: float) -> None:
        super().__init__()
        self.num, self.den = RATIONAL_SCALES[scale]
        self.conv = nn.Conv2d(channels, self.num**2 * channels, kernel_size=3, padding=1)
        self.blur_down = BlurKernel()

    def forward(self, x: Tensor) -> Tensor:
        x = _pixel_shuffle(self.conv(x), (self.num, self.num))
        if self.den == 1:
            return x
        channels = x.shape[1]
        weight = self.blur_down.kernel.expand(channels, 1, BLUR_TAPS, BLUR_TAPS)
        return F.conv2d(x, weight, stride=self.den, padding=BLUR_TAPS // 2, groups=channels)


class BlurKernel(nn.Module):
    """Holds the normalised 5x5 binomial kernel as a buffer named like diffusers' (its checkpoints save it)."""

    def __init__(self) -> None:
        super().__init__()
        taps = torch.tensor([math.comb(BLUR_TAPS - 1, k) for k in range(BLUR_TAPS)])
        kernel = (taps[:, None] @ taps[None, :]).float()
        self.register_buffer("kernel", (kernel / kernel.sum())[None, None])


class LTX2LatentUpsampler(nn.Module):
    """Raw VAE latents [B, C, F, H, W] -> [B, C, F', H*s, W*s] (F' = 2F - 1 when it upsamples time)."""

    def __init__(self, config: LTX2LatentUpsamplerConfig) -> None:
        super().__init__()
        self.config = config
        dims, mid = config.dims, config.mid_channels
        self.initial_conv = _conv(dims, config.in_channels, mid)
        self.initial_norm = nn.GroupNorm(GROUPS, mid)
        self.res_blocks = nn.ModuleList(ResBlock(mid, dims) for _ in range(config.num_blocks_per_stage))
        self.upsampler: nn.Module
        if config.spatial_upsample and config.temporal_upsample:
            self.upsampler = ConvShuffle(3, mid, (2, 2, 2))
        elif config.uses_rational_resampler:
            self.upsampler = RationalResampler(mid, config.rational_spatial_scale)
        elif config.spatial_upsample:
            self.upsampler = ConvShuffle(2, mid, (2, 2))
        else:
            self.upsampler = ConvShuffle(3, mid, (2,))
        self.post_upsample_res_blocks = nn.ModuleList(ResBlock(mid, dims) for _ in range(config.num_blocks_per_stage))
        self.final_conv = _conv(dims, mid, config.in_channels)

    def forward(self, latents: Tensor) -> Tensor:
        if latents.ndim != 5 or latents.shape[1] != self.config.in_channels:
            raise InvalidRequest("latents", f"expected [batch, {self.config.in_channels}, frames, height, width] "
                                            f"for this upsampler, got {tuple(latents.shape)}")
        b = latents.shape[0]
        per_frame = self.config.dims == 2
        x = _frames_to_batch(latents) if per_frame else latents
        x = F.silu(self.initial_norm(self.initial_conv(x)))
        for block in self.res_blocks:
            x = block(x)
        if per_frame or self.config.temporal_upsample:
            x = self.upsampler(x)
        else:  # 3D trunk, 2D spatial resample per frame
            x = _batch_to_frames(self.upsampler(_frames_to_batch(x)), b)
        if self.config.temporal_upsample:
            x = x[:, :, 1:]  # the first latent frame is a single image frame: it is not doubled
        for block in self.post_upsample_res_blocks:
            x = block(x)
        x = self.final_conv(x)
        return _batch_to_frames(x, b) if per_frame else x


def _frames_to_batch(x: Tensor) -> Tensor:
    return x.permute(0, 2, 1, 3, 4).flatten(0, 1)


def _batch_to_frames(x: Tensor, batch: int) -> Tensor:
    return x.unflatten(0, (batch, -1)).permute(0, 2, 1, 3, 4)


# -- the latent path of LTX2LatentUpsamplePipeline -------------------------------------------------


@dataclass(frozen=True)
class LatentUpsampleParams:
    """Per-request filtering options of LTX2LatentUpsamplePipeline; both off by default, as there."""

    adain_factor: float = 0.0  # blend towards the input's per-channel mean/std (AdaIN); 0 = off, up to 10
    tone_map_compression_ratio: float = 0.0  # sigmoid compression of large latent values; 0 = off, 1 = full

    def check(self) -> None:
        if not 0.0 <= self.adain_factor <= 10.0:
            # diffusers documents [-10, 10] but only ever applies positive factors; refuse what it would ignore.
            raise InvalidRequest("adain_factor", f"{self.adain_factor} is outside [0, 10]")
        if not 0.0 <= self.tone_map_compression_ratio <= 1.0:
            raise InvalidRequest("tone_map_compression_ratio", f"{self.tone_map_compression_ratio} is outside [0, 1]")


def check_upsampler_matches(upsampler: LTX2LatentUpsamplerConfig, vae: LTX2VideoVAEConfig, source: str) -> None:
    """An upsampler works on one VAE's latents: refuse a pairing whose channel counts differ."""
    if upsampler.in_channels != vae.latent_channels:
        raise CheckpointError(f"{source}: the latent upsampler takes {upsampler.in_channels}-channel latents but "
                              f"the model's video VAE makes {vae.latent_channels}-channel ones")


@torch.no_grad()
def upsample_latents(upsampler: LTX2LatentUpsampler, vae: LTX2VideoVAE, latents: Tensor,
                     params: LatentUpsampleParams = LatentUpsampleParams(), normalized: bool = True,
                     renormalize: bool = True) -> Tensor:
    """Upsample stage-1 latents for the refinement pass.

    With `normalized` the input is in the transformer's (normalised) space and is first denormalised with
    the VAE's statistics; with `renormalize` the result is brought back to that space, as LTX2Pipeline does
    to latents it is handed. `normalized=False, renormalize=False` is LTX2LatentUpsamplePipeline's
    `output_type="latent"` path for raw latents.
    """
    params.check()
    check_upsampler_matches(upsampler.config, vae.config, "latent upsampler")
    raw = vae.denormalize_latents(latents) if normalized else latents
    dtype = upsampler.initial_conv.weight.dtype
    upsampled = upsampler(raw.to(dtype))
    if params.adain_factor > 0.0:
        upsampled = adain(upsampled, raw.to(dtype), params.adain_factor)
    if params.tone_map_compression_ratio > 0.0:
        upsampled = tone_map(upsampled, params.tone_map_compression_ratio)
    return vae.normalize_latents(upsampled) if renormalize else upsampled


def adain(latents: Tensor, reference: Tensor, factor: float) -> Tensor:
    """Per (sample, channel): match `reference`'s mean and (unbiased) std, then blend by `factor`."""
    ref_std, ref_mean = torch.std_mean(reference, dim=(2, 3, 4), keepdim=True)
    std, mean = torch.std_mean(latents, dim=(2, 3, 4), keepdim=True)
    matched = (latents - mean) / std * ref_std + ref_mean
    return torch.lerp(latents, matched, factor)


def tone_map(latents: Tensor, compression: float) -> Tensor:
    """Shrink values beyond ~1 smoothly: x * (1 - 0.8*k*sigmoid(4k(|x| - 1))), k = 0.75*compression.

    Constants from diffusers' LTX2LatentUpsamplePipeline.tone_map_latents.
    """
    k = compression * 0.75
    return latents * (1.0 - 0.8 * k * torch.sigmoid(4.0 * k * (latents.abs() - 1.0)))
