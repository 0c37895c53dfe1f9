"""The LTX-2 video VAE's encoder and decoder: stages of residual blocks around space<->depth resamplers.

Channel arithmetic and stage order (the decoder reverses most per-stage settings but not `upsample_type`)
follow diffusers' `LTX2VideoEncoder3d` / `LTX2VideoDecoder3d`, so the same checkpoints load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.models.ltx2.video_vae_blocks import (
    CausalConv3d,
    Downsampler,
    ResnetBlock,
    TimestepMLP,
    Upsampler,
    channel_rms_norm,
)

if TYPE_CHECKING:
    from vidloom.models.ltx2.video_vae import LTX2VideoVAEConfig

DOWN_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2), "conv": (2, 2, 2)}
UP_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}


class DownStage(nn.Module):
    """Residual blocks at the input width, then an optional downsample to `cout`."""

    def __init__(self, cin: int, cout: int, layers: int, kind: str | None, eps: float, padding_mode: str) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock(cin, cin, eps, padding_mode) for _ in range(layers))
        self.downsample: nn.Module | None = None
        if kind == "conv":  # a plain strided conv keeps the width
            self.downsample = CausalConv3d(cin, cin, stride=(2, 2, 2), padding_mode=padding_mode)
        elif kind is not None:
            self.downsample = Downsampler(cin, cout, DOWN_STRIDES[kind], padding_mode)

    def forward(self, x: Tensor, causal: bool) -> Tensor:
        for resnet in self.resnets:
            x = resnet(x, None, None, causal)
        return x if self.downsample is None else self.downsample(x, causal)


class MidStage(nn.Module):
    """Residual blocks at one width; with timestep conditioning, one embedding feeds all of them."""

    def __init__(self, channels: int, layers: int, eps: float, padding_mode: str, inject_noise: bool = False,
                 timestep_conditioning: bool = False) -> None:
        super().__init__()
        self.time_embedder = TimestepMLP(4 * channels) if timestep_conditioning else None
        self.resnets = nn.ModuleList(
            ResnetBlock(channels, channels, eps, padding_mode, inject_noise, timestep_conditioning)
            for _ in range(layers)
        )

    def forward(self, x: Tensor, timestep: Tensor | None, generator: torch.Generator | None, causal: bool) -> Tensor:
        temb = _embed(self.time_embedder, timestep, x)
        for resnet in self.resnets:
            x = resnet(x, temb, generator, causal)
        return x


class UpStage(nn.Module):
    """Optional width change (a residual block), an optional upsample, then residual blocks."""

    def __init__(self, cin: int, cout: int, layers: int, upsample: tuple[str, bool, int] | None, eps: float,
                 padding_mode: str, inject_noise: bool, timestep_conditioning: bool) -> None:
        super().__init__()
        # The config reader refuses conv_in together with timestep conditioning (diffusers cannot run it).
        self.conv_in = ResnetBlock(cin, cout, eps, padding_mode, inject_noise) if cin != cout else None
        self.time_embedder = TimestepMLP(4 * cin) if timestep_conditioning else None
        self.upsample: Upsampler | None = None
        if upsample is not None:
            kind, residual, factor = upsample
            self.upsample = Upsampler(cout * factor, UP_STRIDES[kind], residual, factor, padding_mode)
        self.resnets = nn.ModuleList(
            ResnetBlock(cout, cout, eps, padding_mode, inject_noise, timestep_conditioning) for _ in range(layers)
        )

    def forward(self, x: Tensor, timestep: Tensor | None, generator: torch.Generator | None, causal: bool) -> Tensor:
        if self.conv_in is not None:
            x = self.conv_in(x, None, generator, causal)
        temb = _embed(self.time_embedder, timestep, x)
        if self.upsample is not None:
            x = self.upsample(x, causal)
        for resnet in self.resnets:
            x = resnet(x, temb, generator, causal)
        return x


def _embed(embedder: TimestepMLP | None, timestep: Tensor | None, x: Tensor) -> Tensor | None:
    if embedder is None:
        return None
    assert timestep is not None, "timestep conditioning needs a timestep"
    return embedder(timestep, x.dtype).view(x.shape[0], -1, 1, 1, 1)


class Encoder(nn.Module):
    """[B, 3, F, H, W] pixels -> [B, latent + 1, F', H', W']: latent means and one shared log-variance channel."""

    def __init__(self, config: LTX2VideoVAEConfig) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.causal = config.encoder_causal
        mode, eps = config.encoder_spatial_padding_mode, config.resnet_norm_eps
        width = config.latent_channels
        self.conv_in = CausalConv3d(config.in_channels * config.patch_size**2, width, padding_mode=mode)
        stages = []
        for i, cout in enumerate(config.block_out_channels):
            kind = config.downsample_type[i] if config.spatio_temporal_scaling[i] else None
            stages.append(DownStage(width, cout, config.layers_per_block[i], kind, eps, mode))
            width = cout
        self.down_blocks = nn.ModuleList(stages)
        self.mid_block = MidStage(width, config.layers_per_block[-1], eps, mode)
        self.conv_out = CausalConv3d(width, config.latent_channels + 1, padding_mode=mode)

    def forward(self, video: Tensor) -> Tensor:
        # 1. Patchify: [B, C, F, H*p, W*p] -> [B, C*p*p, F, H, W] in diffusers' (c, p_w, p_h) channel order.
        b, c, f, h, w = video.shape
        p = self.patch_size
        x = video.reshape(b, c, f, 1, h // p, p, w // p, p).permute(0, 1, 3, 7, 5, 2, 4, 6).flatten(1, 4)
        # 2. Trunk.
        x = self.conv_in(x, self.causal)
        for stage in self.down_blocks:
            x = stage(x, self.causal)
        x = self.mid_block(x, None, None, self.causal)
        # 3. Head.
        return self.conv_out(F.silu(channel_rms_norm(x)), self.causal)


class Decoder(nn.Module):
    """[B, latent, F, H, W] -> [B, 3, 1 + t*(F-1), s*H, s*W] pixels, optionally timestep-conditioned."""

    def __init__(self, config: LTX2VideoVAEConfig) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.causal = config.decoder_causal
        mode, eps = config.decoder_spatial_padding_mode, config.resnet_norm_eps
        cond = config.timestep_conditioning
        widths = tuple(reversed(config.decoder_block_out_channels))
        layers = tuple(reversed(config.decoder_layers_per_block))
        scaling = tuple(reversed(config.decoder_spatio_temporal_scaling))
        noise = tuple(reversed(config.decoder_inject_noise))
        residual = tuple(reversed(config.upsample_residual))
        factors = tuple(reversed(config.upsample_factor))
        width = widths[0]
        self.conv_in = CausalConv3d(config.latent_channels, width, padding_mode=mode)
        self.mid_block = MidStage(width, layers[0], eps, mode, noise[0], cond)
        stages = []
        for i, block_width in enumerate(widths):
            cin, width = width // factors[i], block_width // factors[i]
            upsample = (config.upsample_type[i], residual[i], factors[i]) if scaling[i] else None
            stages.append(UpStage(cin, width, layers[i + 1], upsample, eps, mode, noise[i + 1], cond))
        self.up_blocks = nn.ModuleList(stages)
        self.conv_out = CausalConv3d(width, config.out_channels * config.patch_size**2, padding_mode=mode)
        self.timestep_scale_multiplier = nn.Parameter(torch.tensor(1000.0)) if cond else None
        self.time_embedder = TimestepMLP(2 * width) if cond else None
        self.scale_shift_table = nn.Parameter(torch.randn(2, width) / width**0.5) if cond else None

    def forward(self, z: Tensor, timestep: Tensor | None, generator: torch.Generator | None) -> Tensor:
        # 1. Trunk; the timestep is scaled once (a learned multiplier) and embedded per stage.
        x = self.conv_in(z, self.causal)
        if self.timestep_scale_multiplier is not None:
            assert timestep is not None, "the caller checks that a conditioned decoder gets a timestep"
            timestep = timestep * self.timestep_scale_multiplier
        x = self.mid_block(x, timestep, generator, self.causal)
        for stage in self.up_blocks:
            x = stage(x, timestep, generator, self.causal)
        # 2. Head: RMS norm, timestep scale/shift, SiLU, conv.
        x = channel_rms_norm(x)
        if self.time_embedder is not None:
            assert self.scale_shift_table is not None and timestep is not None
            temb = self.time_embedder(timestep, x.dtype).view(x.shape[0], 2, -1, 1, 1, 1)
            shift, scale = (temb + self.scale_shift_table[None, :, :, None, None, None]).unbind(dim=1)
            x = x * (1 + scale) + shift
        x = self.conv_out(F.silu(x), self.causal)
        # 3. Unpatchify, the inverse of the encoder's channel order.
        b, _, f, h, w = x.shape
        p = self.patch_size
        x = x.reshape(b, -1, 1, p, p, f, h, w).permute(0, 1, 5, 2, 6, 4, 7, 3)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)
