"""The HiFi-GAN / BigVGAN-style generator inside LTX-2's vocoder: mel [B, C*M, T] -> waveform, with
alias-free Snake activations (up-sample, activate, low-pass down-sample) where the checkpoint asks for them.

Filters and the forward order follow diffusers' ltx2/vocoder.py step by step, for bit-closeness; the
Kaiser-windowed sinc design is BigVGAN's (Lee et al. 2023, after alias-free-torch), the Hann resampling
kernel torchaudio's `resample` design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.kaiser import kaiser_grid


@dataclass(frozen=True)
class GeneratorConfig:
    """One generator stage (diffusers LTX2Vocoder's keys, or the bwe_-prefixed ones of the extender)."""

    in_channels: int = 128
    """Mel channels x mel bins, flattened (2 x 64 for LTX-2)."""
    hidden_channels: int = 1024
    """Width after conv_in; each upsampling layer halves it."""
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (16, 15, 8, 4, 4)
    upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    """Samples per mel frame = their product."""
    resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    act_fn: str = "leaky_relu"
    """leaky_relu | snake | snakebeta."""
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = False
    """Wrap residual activations in up-sample / act / down-sample (always so for the snake output act)."""
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = "tanh"
    """tanh | clamp | None, applied to the waveform."""
    final_bias: bool = True

    @property
    def hop(self) -> int:
        """Waveform samples per input frame."""
        return math.prod(self.upsample_factors)


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> Tensor:
    """Low-pass FIR: a sinc at `cutoff` (of the sample rate) under a Kaiser window, normalised to unit gain."""
    window, t = kaiser_grid(half_width, kernel_size)
    if cutoff == 0.0:
        return torch.zeros_like(t)
    t = 2 * cutoff * t
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(math.pi * t) / math.pi / t)
    taps = 2 * cutoff * window * sinc
    return taps / taps.sum()


def hann_resample_filter(ratio: int, rolloff: float = 0.99, zero_crossings: int = 6) -> tuple[Tensor, int]:
    """torchaudio-style windowed-sinc interpolation kernel for integer up-sampling; returns (taps, width)."""
    width = math.ceil(zero_crossings / rolloff)
    t = (torch.arange(2 * width * ratio + 1) / ratio - width) * rolloff
    window = torch.cos(t.clamp(-zero_crossings, zero_crossings) * math.pi / zero_crossings / 2) ** 2
    return torch.sinc(t) * window * rolloff / ratio, width


class UpSample1d(nn.Module):
    """Integer up-sampling by zero-stuffing and low-pass filtering, replicate-padded at the edges."""

    def __init__(self, ratio: int, kernel_size: int = 12, window: str = "kaiser") -> None:
        super().__init__()
        self.ratio = ratio
        if window == "hann":  # the extender's skip path; computed, never stored in checkpoints
            taps, self.pad = hann_resample_filter(ratio)
            self.pad_left, self.pad_right = 2 * self.pad * ratio, taps.numel() - ratio
            self.register_buffer("filter", taps.view(1, 1, -1), persistent=False)
        else:
            self.pad = kernel_size // ratio - 1
            self.pad_left = self.pad * ratio + (kernel_size - ratio) // 2
            self.pad_right = self.pad * ratio + (kernel_size - ratio + 1) // 2
            taps = kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel_size)
            self.register_buffer("filter", taps.view(1, 1, -1))

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        taps = self.filter.to(dtype=x.dtype, device=x.device).expand(channels, -1, -1)
        x = self.ratio * F.conv_transpose1d(x, taps, stride=self.ratio, groups=channels)
        return x[..., self.pad_left:-self.pad_right]


class DownSample1d(nn.Module):
    """Low-pass filter then keep every `ratio`-th sample (replicate-padded)."""

    def __init__(self, ratio: int, kernel_size: int = 12) -> None:
        super().__init__()
        self.ratio = ratio
        self.pad_left = kernel_size // 2 + kernel_size % 2 - 1
        self.pad_right = kernel_size // 2
        self.register_buffer("filter", kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel_size).view(1, 1, -1))

    def forward(self, x: Tensor) -> Tensor:
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.filter.expand(x.shape[1], -1, -1), stride=self.ratio, groups=x.shape[1])


class Snake(nn.Module):
    """x + sin^2(alpha x) / beta per channel, alpha and beta stored as logs (SnakeBeta; Snake: beta = alpha)."""

    def __init__(self, channels: int, use_beta: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels)) if use_beta else None

    def forward(self, x: Tensor) -> Tensor:
        alpha = torch.exp(self.alpha.view(1, -1, 1))
        amplitude = alpha if self.beta is None else torch.exp(self.beta.view(1, -1, 1))
        return x + (1.0 / (amplitude + 1e-9)) * torch.sin(x * alpha).pow(2)


class AntiAliasAct(nn.Module):
    """Apply a pointwise activation at `ratio` x the rate so its harmonics do not alias."""

    def __init__(self, act: nn.Module, ratio: int, kernel_size: int) -> None:
        super().__init__()
        self.upsample = UpSample1d(ratio, kernel_size)
        self.act = act
        self.downsample = DownSample1d(ratio, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.downsample(self.act(self.upsample(x)))


def make_act(config: GeneratorConfig, channels: int) -> nn.Module:
    if config.act_fn == "leaky_relu":  # from_diffusers refuses leaky_relu with antialias
        return nn.LeakyReLU(config.leaky_relu_negative_slope)
    act = Snake(channels, use_beta=config.act_fn == "snakebeta")
    return AntiAliasAct(act, config.antialias_ratio, config.antialias_kernel_size) if config.antialias else act


class ResBlock(nn.Module):
    """Per dilation: act -> dilated conv -> act -> conv, added to the input."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...], config: GeneratorConfig) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel_size, dilation=d, padding="same")
                                    for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel_size, padding="same") for _ in dilations)
        self.acts1 = nn.ModuleList(make_act(config, channels) for _ in dilations)
        self.acts2 = nn.ModuleList(make_act(config, channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for act1, conv1, act2, conv2 in zip(self.acts1, self.convs1, self.acts2, self.convs2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class Generator(nn.Module):
    """mel [B, C, T, M] -> waveform [B, out_channels, T * hop]."""

    def __init__(self, config: GeneratorConfig) -> None:
        super().__init__()
        self.config = config
        self.conv_in = nn.Conv1d(config.in_channels, config.hidden_channels, 7, padding=3)
        self.upsamplers, self.resnets = nn.ModuleList(), nn.ModuleList()
        width = config.hidden_channels
        for stride, kernel in zip(config.upsample_factors, config.upsample_kernel_sizes):
            self.upsamplers.append(nn.ConvTranspose1d(width, width // 2, kernel, stride, padding=(kernel - stride) // 2))
            width //= 2
            for res_kernel, dilations in zip(config.resnet_kernel_sizes, config.resnet_dilations):
                self.resnets.append(ResBlock(width, res_kernel, dilations, config))
        if config.act_fn == "leaky_relu":
            self.act_out: nn.Module = nn.LeakyReLU()  # the reference's default slope 0.01 here, not the config's
        else:
            self.act_out = AntiAliasAct(Snake(width), config.antialias_ratio, config.antialias_kernel_size)
        self.conv_out = nn.Conv1d(width, config.out_channels, 7, padding=3, bias=config.final_bias)

    def forward(self, mel: Tensor) -> Tensor:
        x = self.conv_in(mel.transpose(2, 3).flatten(1, 2))  # [B, C*M, T]: channels-major, then mel bins
        per_layer = len(self.config.resnet_kernel_sizes)
        for index, upsample in enumerate(self.upsamplers):
            if self.config.act_fn == "leaky_relu":  # snake acts live inside the residual blocks instead
                x = F.leaky_relu(x, self.config.leaky_relu_negative_slope)
            x = upsample(x)
            blocks = self.resnets[index * per_layer:(index + 1) * per_layer]
            x = torch.mean(torch.stack([block(x) for block in blocks], dim=0), dim=0)
        x = self.conv_out(self.act_out(x))
        if self.config.final_act_fn == "tanh":
            return torch.tanh(x)
        if self.config.final_act_fn == "clamp":
            return torch.clamp(x, -1, 1)
        return x
