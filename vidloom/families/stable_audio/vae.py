"""Stable Audio Open's Oobleck VAE: latents [B, C, T] <-> waveform [B, audio_channels, T * hop].

Layout (diffusers `AutoencoderOobleck.decoder`): a 7-tap conv in, then per upsampling stride (the encoder's
downsampling ratios reversed) a block [Snake -> transposed conv (x stride) -> residual units with dilation 1, 3,
9], then Snake and a 7-tap conv out without bias; no clamp (the pipeline returns the raw waveform). The
weight-normalised convolutions and the Snake activation are the Oobleck pieces Cosmos3's sound decoder
uses too (vidloom.layers.oobleck). The encoder (blocks of residual units then a strided conv, mirrored) only
runs for a request's initial waveform; its posterior is mean + (softplus(scale) + 1e-4) * noise, as
diffusers' OobleckDiagonalGaussianDistribution samples it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.oobleck import NormedConv, OobleckDecoder, ResidualUnit, Snake
from vidloom.layers.tiling import SpatialTiling, decode_windows_1d
from vidloom.loading.config_keys import check_class_name, positive_int, positive_ints, read_key
from vidloom.loading.key_policy import KeyPolicy

DIFFUSERS_CLASS_NAME = "AutoencoderOobleck"
# Every AutoencoderOobleck argument (diffusers 0.42).
CONFIG_KEYS = frozenset({"encoder_hidden_size", "downsampling_ratios", "channel_multiples", "decoder_channels",
                         "decoder_input_channels", "audio_channels", "sampling_rate"})


@dataclass(frozen=True)
class OobleckDecoderConfig:
    """The decoder's sizes from vae/config.json."""

    downsampling_ratios: tuple[int, ...] = (2, 4, 4, 8, 8)
    channel_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    encoder_channels: int = 128  # encoder_hidden_size (the posterior holds half of it: mean and scale)
    channels: int = 128  # decoder_channels
    latent_channels: int = 64  # decoder_input_channels
    audio_channels: int = 2
    sampling_rate: int = 44100

    @property
    def hop_length(self) -> int:
        """Waveform samples per latent step."""
        return math.prod(self.downsampling_ratios)

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> OobleckDecoderConfig:
        where = "vae/config.json"
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), where)
        KeyPolicy(CONFIG_KEYS).check(cfg, where)
        d = cls()
        config = cls(
            downsampling_ratios=read_key(cfg, "downsampling_ratios", d.downsampling_ratios, positive_ints, where),
            channel_multiples=read_key(cfg, "channel_multiples", d.channel_multiples, positive_ints, where),
            encoder_channels=read_key(cfg, "encoder_hidden_size", d.encoder_channels, positive_int, where),
            channels=read_key(cfg, "decoder_channels", d.channels, positive_int, where),
            latent_channels=read_key(cfg, "decoder_input_channels", d.latent_channels, positive_int, where),
            audio_channels=read_key(cfg, "audio_channels", d.audio_channels, positive_int, where),
            sampling_rate=read_key(cfg, "sampling_rate", d.sampling_rate, positive_int, where),
        )
        if len(config.channel_multiples) != len(config.downsampling_ratios):
            raise ValueError(f"{where}: channel_multiples and downsampling_ratios must have equal lengths")
        if config.audio_channels > 2:
            raise ValueError(f"{where}: audio_channels={config.audio_channels}; mono or stereo only")
        return config


class EncoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.res_unit1 = ResidualUnit(c_in, 1)
        self.res_unit2 = ResidualUnit(c_in, 3)
        self.res_unit3 = ResidualUnit(c_in, 9)
        self.snake1 = Snake(c_in)
        self.conv1 = NormedConv(c_in, c_out, 2 * stride, stride=stride, padding=math.ceil(stride / 2))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv1(self.snake1(self.res_unit3(self.res_unit2(self.res_unit1(x)))))


class OobleckEncoder(nn.Module):
    def __init__(self, config: OobleckDecoderConfig) -> None:
        super().__init__()
        mults = (1, *config.channel_multiples)
        width = config.encoder_channels
        self.conv1 = NormedConv(config.audio_channels, width, 7, padding=3)
        self.block = nn.ModuleList(EncoderBlock(width * mults[i], width * mults[i + 1], stride)
                                   for i, stride in enumerate(config.downsampling_ratios))
        self.snake1 = Snake(width * mults[-1])
        self.conv2 = NormedConv(width * mults[-1], width, 3, padding=1)

    def forward(self, audio: Tensor) -> Tensor:
        x = self.conv1(audio)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class OobleckVAE(nn.Module):
    """Holds the encoder and decoder under `encoder.` / `decoder.` so the checkpoint's names load unchanged."""

    def __init__(self, config: OobleckDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = OobleckEncoder(config)
        # Stable Audio's decoder pads no output (UpBlock's output_padding).
        self.decoder = OobleckDecoder(config.latent_channels, config.channels, config.channel_multiples,
                                      config.downsampling_ratios, config.audio_channels, output_padding=0)

    def decode(self, latents: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
        """Latents [B, C, T] -> waveform [B, audio_channels, T * hop]. With `tiling` (in waveform samples,
        multiples of the hop), windows over time decode with overlapping context cut away again, as
        diffusers' AutoencoderOobleck does with `enable_tiling`: peak memory follows the window."""
        if tiling is None:
            return self.decoder(latents)
        return decode_windows_1d(latents, self.decoder, tiling, self.config.hop_length)

    @torch.no_grad()
    def encode_sample(self, audio: Tensor, generator: torch.Generator) -> Tensor:
        """A posterior sample [B, latent, T] of waveforms [B, audio_channels, samples]; the noise is drawn from
        `generator` on the CPU in float32 (the reference draws it from the pipeline's generator)."""
        mean, scale = self.encoder(audio.to(self.encoder.conv1.weight_v.dtype)).chunk(2, dim=1)
        std = F.softplus(scale) + 1e-4
        noise = torch.randn(mean.shape, generator=generator, dtype=torch.float32).to(mean.device, mean.dtype)
        return mean + std * noise
