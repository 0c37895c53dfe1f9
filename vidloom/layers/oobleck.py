"""The Oobleck autoencoder's pieces: Snake, weight-normalised 1-d convolutions, dilated residual units, the decoder's
up block. Cosmos3's sound decoder and Stable Audio's VAE are built from them.

Convolutions are weight-normalised as the checkpoints store them (`weight_g`, `weight_v`): the weight is
g * v / |v| (norm over all but the first axis), formed at use.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Snake(nn.Module):
    """x + sin^2(a x) / b with log-scaled per-channel a, b (SnakeBeta)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(1, channels, 1))
        self.beta = nn.Parameter(torch.zeros(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        alpha, beta = self.alpha.exp(), self.beta.exp()
        return x + (beta + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


class NormedConv(nn.Module):
    """A weight-normalised (transposed) 1-d convolution holding the checkpoint's g and v."""

    def __init__(self, c_in: int, c_out: int, kernel: int, *, stride: int = 1, padding: int = 0,
                 dilation: int = 1, output_padding: int = 0, transposed: bool = False, bias: bool = True) -> None:
        super().__init__()
        shape = (c_in, c_out, kernel) if transposed else (c_out, c_in, kernel)
        self.weight_g = nn.Parameter(torch.ones(shape[0], 1, 1))
        self.weight_v = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.zeros(c_out)) if bias else None
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.output_padding, self.transposed = output_padding, transposed

    def forward(self, x: Tensor) -> Tensor:
        v = self.weight_v
        weight = v * (self.weight_g / v.norm(dim=(1, 2), keepdim=True))
        if self.transposed:
            return F.conv_transpose1d(x, weight, self.bias, self.stride, self.padding, self.output_padding)
        return F.conv1d(x, weight, self.bias, self.stride, self.padding, self.dilation)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake(channels)
        self.conv1 = NormedConv(channels, channels, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake(channels)
        self.conv2 = NormedConv(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class UpBlock(nn.Module):
    """Snake, a strided transposed conv, three dilated residual units: the Oobleck decoder block (Stable Audio's
    decoder pads no output: `output_padding=0`; Cosmos3's pads `stride % 2`, the default)."""

    def __init__(self, c_in: int, c_out: int, stride: int, output_padding: int | None = None) -> None:
        super().__init__()
        self.snake1 = Snake(c_in)
        self.conv_t1 = NormedConv(c_in, c_out, 2 * stride, stride=stride, padding=math.ceil(stride / 2),
                                  output_padding=stride % 2 if output_padding is None else output_padding,
                                  transposed=True)
        self.res_unit1 = ResidualUnit(c_out, 1)
        self.res_unit2 = ResidualUnit(c_out, 3)
        self.res_unit3 = ResidualUnit(c_out, 9)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class OobleckDecoder(nn.Module):
    """latents [B, latent, T] -> waveform [B, audio_channels, T * prod(strides)]: conv, one UpBlock per stride (the
    encoder's, reversed) narrowing `channels` * `multiples`, Snake, a bias-free conv. Parameter names are the
    checkpoints' `decoder.*` keys without that prefix."""

    def __init__(self, latent_channels: int, channels: int, multiples: tuple[int, ...], strides: tuple[int, ...],
                 audio_channels: int, output_padding: int | None = None) -> None:
        super().__init__()
        mults = (1, *multiples)
        strides = tuple(reversed(strides))
        n = len(strides)
        self.conv1 = NormedConv(latent_channels, channels * mults[-1], 7, padding=3)
        self.block = nn.ModuleList(
            UpBlock(channels * mults[n - i], channels * mults[n - i - 1], stride, output_padding)
            for i, stride in enumerate(strides))
        self.snake1 = Snake(channels)
        self.conv2 = NormedConv(channels, audio_channels, 7, padding=3, bias=False)

    @torch.no_grad()
    def forward(self, latents: Tensor) -> Tensor:
        x = self.conv1(latents.to(self.conv1.weight_v.dtype))
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))
