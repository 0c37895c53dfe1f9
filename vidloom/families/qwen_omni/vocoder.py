"""token2wav's BigVGAN vocoder: mel [B, mel_dim, frames] -> waveform in [-1, 1].

BigVGAN (Lee et al. 2022, arXiv:2206.04658): transposed-conv upsampling, each stage followed by the
mean of anti-aliased multi-periodicity (AMP) residual blocks whose SnakeBeta activations run at twice
the rate between Kaiser-windowed sinc filters. Follows transformers' `Qwen2_5OmniToken2WavBigVGANModel`
(5.24) step by step, including its mel normalisation (log-mel -> dB -> [-1, 1]), as the weights require.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.kaiser import kaiser_grid
from vidloom.loading.name_map import NameMap
from vidloom.families.qwen_omni.config import VocoderConfig

VOCODER_NAME_MAP = NameMap((
    ("token2wav.code2wav_bigvgan_model.conv_pre", "conv_pre"),
    ("token2wav.code2wav_bigvgan_model.ups.{n}.0", "ups.{n}"),
    ("token2wav.code2wav_bigvgan_model.resblocks.{n}.convs1", "resblocks.{n}.convs1"),
    ("token2wav.code2wav_bigvgan_model.resblocks.{n}.convs2", "resblocks.{n}.convs2"),
    ("token2wav.code2wav_bigvgan_model.resblocks.{n}.activations.{n}.act", "resblocks.{n}.acts.{n}"),
    ("token2wav.code2wav_bigvgan_model.activation_post.act", "post_act"),
    ("token2wav.code2wav_bigvgan_model.conv_post", "conv_post"),
))
VOCODER_KEYS = ("token2wav.code2wav_bigvgan_model.",)
FILTER_TAPS = 12  # the anti-aliasing filters' length (BigVGAN's default)
MIN_DB, REF_DB = -115.0, 20.0  # mel normalisation constants of the reference vocoder


def kaiser_sinc(cutoff: float, half_width: float, taps: int) -> Tensor:
    """A Kaiser-windowed sinc low-pass [1, 1, taps] summing to 1 (Kaiser's beta from the attenuation formula)."""
    window, times = kaiser_grid(half_width, taps, torch.float32)
    taps_ = 2 * cutoff * window * torch.sinc(2 * cutoff * times)
    return (taps_ / taps_.sum()).view(1, 1, taps)


@functools.lru_cache(maxsize=1)
def _half_band_filter() -> Tensor:
    """The 2x resampling low-pass (cutoff 0.5 / ratio, transition 0.6 / ratio), derived rather than stored."""
    return kaiser_sinc(0.25, 0.3, FILTER_TAPS)


class SnakeBeta(nn.Module):
    """x + 1/exp(beta) * sin^2(x * exp(alpha)), per channel (log-scale parameters)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        alpha, beta = self.alpha.exp()[None, :, None], self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class AntiAliasedSnake(SnakeBeta):
    """SnakeBeta at twice the rate: 2x sinc upsampling, the activation, sinc low-pass and 2x decimation."""

    def forward(self, x: Tensor) -> Tensor:
        channels, taps = x.shape[1], FILTER_TAPS
        weight = _half_band_filter().to(x.device, x.dtype).expand(channels, -1, -1)
        pad = taps // 2 - 1  # upsampler: replicate padding, transposed conv, then trim
        up = 2 * F.conv_transpose1d(F.pad(x, (pad, pad), mode="replicate"), weight, stride=2, groups=channels)
        trim_left, trim_right = pad * 2 + (taps - 2) // 2, pad * 2 + (taps - 2 + 1) // 2
        up = super().forward(up[..., trim_left:-trim_right])
        down = F.pad(up, (taps // 2 - 1, taps // 2), mode="replicate")  # even taps: one less on the left
        return F.conv1d(down, weight, stride=2, groups=channels)


class AMPBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel * d - d) // 2)
                                    for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2)
                                    for _ in dilations)
        self.acts = nn.ModuleList(AntiAliasedSnake(channels) for _ in range(2 * len(dilations)))

    def forward(self, x: Tensor) -> Tensor:
        for i, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2)):
            x = x + conv2(self.acts[2 * i + 1](conv1(self.acts[2 * i](x))))
        return x


def receptive_field(c: VocoderConfig) -> int:
    """Mel frames on each side that one output sample can depend on (an upper bound, from the layer sizes):
    running the vocoder on a span plus this margin gives that span's samples as the whole mel would.

    Each layer's reach in samples at its own rate is divided by its upsampling from the mel rate; the
    residual blocks of a stage run side by side (the widest counts), their convolutions in series (sum).
    """
    # AntiAliasedSnake: the 2x sinc upsampler reads 3 inputs back, the decimator 2.5 (taps 12): 5.5, rounded up.
    snake = FILTER_TAPS // 2
    reach, rate = 3.0, 1  # conv_pre: kernel 7
    for up, kernel in zip(c.upsample_rates, c.upsample_kernel_sizes):
        pad = (kernel - up) // 2  # a transposed conv's output reads inputs within max(k - 1 - pad, pad) / stride
        reach += max(kernel - 1 - pad, pad) / up / rate
        rate *= up
        amp = max(sum(2 * snake + d * (k - 1) // 2 + (k - 1) // 2 for d in dilations)
                  for k, dilations in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes))
        reach += amp / rate
    reach += (snake + 3) / rate  # post activation, conv_post (kernel 7)
    return math.ceil(reach)


class BigVGAN(nn.Module):
    def __init__(self, c: VocoderConfig) -> None:
        super().__init__()
        self.config = c
        width = c.upsample_initial_channel
        self.conv_pre = nn.Conv1d(c.mel_dim, width, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(width // 2 ** i, width // 2 ** (i + 1), k, rate, padding=(k - rate) // 2)
            for i, (rate, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes)))
        self.resblocks = nn.ModuleList(
            AMPBlock(width // 2 ** (i + 1), k, d) for i in range(len(c.upsample_rates))
            for k, d in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes))
        out_width = width // 2 ** len(c.upsample_rates)
        self.post_act = AntiAliasedSnake(out_width)
        self.conv_post = nn.Conv1d(out_width, 1, 7, padding=3, bias=False)

    @staticmethod
    def normalize(mel: Tensor) -> Tensor:
        """Log-mel -> dB (floored at MIN_DB, minus REF_DB) -> [-1, 1]."""
        floor = torch.exp(torch.tensor(MIN_DB / 20.0 * math.log(10), device=mel.device, dtype=mel.dtype))
        db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=floor)) - REF_DB
        return torch.clamp(2 * ((db - MIN_DB) / (-MIN_DB)) - 1, -1, 1)

    def forward(self, mel: Tensor) -> Tensor:
        """mel [B, mel_dim, frames] -> waveform [B, frames * hop] in [-1, 1]."""
        x = self.conv_pre(self.normalize(mel))
        per_stage = len(self.config.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(x)
            x = sum(self.resblocks[i * per_stage + j](x) for j in range(per_stage)) / per_stage
        return torch.clamp(self.conv_post(self.post_act(x)), -1.0, 1.0)[:, 0]
