"""ECAPA-TDNN speaker encoder of token2wav's DiT: a reference mel -> one conditioning vector.

ECAPA-TDNN (Desplanques et al. 2020, arXiv:2005.07143): a TDNN, SE-Res2Net blocks, multi-layer
feature aggregation and attentive statistics pooling. Follows transformers' `ECAPA_TimeDelayNet`
(5.24) step by step, as the checkpoint's weights require; parameter names are the checkpoint's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vidloom.families.qwen_omni.config import DiTConfig


def _conv(cin: int, cout: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """Conv1d ('same', reflect padding) then ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channel groups processed hierarchically: group i sees group i's input plus group i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out, prev = [parts[0]], None
        for i, part in enumerate(parts[1:]):
            prev = self.blocks[i](part if prev is None else part + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = _conv(channels, se_channels, 1), _conv(se_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcite(cout, se_channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _stats(x: Tensor, weights: Tensor, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
    """Weighted mean and std over time of x [B, C, T] with weights [B, C or 1, T] summing to 1."""
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(eps))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Attention over time (conditioned on global mean/std), then the attended mean and std."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        frames = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, frames), 1.0 / frames, dtype=x.dtype, device=x.device)
        mean, std = _stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, frames), std.unsqueeze(2).expand(-1, -1, frames)], 1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _stats(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """Reference mel [B, frames, mel_dim] -> [B, enc_dim]."""

    def __init__(self, c: DiTConfig) -> None:
        super().__init__()
        ch, ks, dil = c.enc_channels, c.enc_kernel_sizes, c.enc_dilations
        if not len(ch) == len(ks) == len(dil):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have the same length")
        blocks: list[nn.Module] = [TDNN(c.mel_dim, ch[0], ks[0], dil[0])]
        blocks += [SERes2NetBlock(ch[i - 1], ch[i], c.enc_res2net_scale, c.enc_se_channels, ks[i], dil[i])
                   for i in range(1, len(ch) - 1)]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], c.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, c.enc_dim, 1)

    def forward(self, mel: Tensor) -> Tensor:
        x = mel.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))  # multi-layer feature aggregation
        return self.fc(self.asp(x)).squeeze(-1)
