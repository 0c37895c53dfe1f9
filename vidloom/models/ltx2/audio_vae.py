"""The LTX-2 audio VAE decoder: audio latents -> stereo mel spectrogram, numerically equivalent to
diffusers' AutoencoderKLLTX2Audio.decode.

Only the decoder runs here: no LTX-2 pipeline encodes audio, so a checkpoint's `encoder.*` tensors
are left unread (LTX2_AUDIO_VAE_SKIPPED). Layer names mirror diffusers', so the name map is the identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.core.errors import CheckpointError
from vidloom.loading.config_keys import (
    check_choice, check_class_name, positive_int, positive_ints, read_key, strict_bool,
)
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap

DIFFUSERS_CLASS_NAME = "AutoencoderKLLTX2Audio"
_INT_KEYS = ("base_channels", "output_channels", "num_res_blocks", "resolution", "latent_channels", "sample_rate",
             "mel_hop_length")
_ENCODER_ONLY_KEYS = ("in_channels", "double_z", "dropout", "is_causal")
_READ_KEYS = frozenset((*_INT_KEYS, "ch_mult", "attn_resolutions", "norm_type", "causality_axis",
                        "mid_block_add_attention", "mel_bins"))
AUDIO_VAE_POLICY = KeyPolicy(_READ_KEYS, harmless=dict.fromkeys(
    _ENCODER_ONLY_KEYS, "sizes only the encoder; this module decodes (generation never encodes audio)"))
LATENT_DOWNSAMPLE = 4
"""Mel frames (and mel bins) per latent frame (bin); fixed in the reference, not a config key."""
CAUSALITY_AXES = ("none", "width", "height", "width-compatibility")
NORM_TYPES = ("pixel", "group")

# Our module tree mirrors the diffusers one, so every key keeps its name.
LTX2_AUDIO_VAE_NAME_MAP = NameMap(())
LTX2_AUDIO_VAE_SKIPPED = ("encoder",)
"""Checkpoint key prefixes not loaded: the encoder half nothing encodes with."""


@dataclass(frozen=True)
class LTX2AudioVAEConfig:
    """Architecture of the audio VAE's decoder, plus the audio timing the pipeline derives sizes from."""

    base_channels: int = 128
    """Channels of the highest-resolution stage; stage i has base_channels * ch_mult[i]. Also the size of
    latents_mean / latents_std (the reference sizes them so; they normalise packed latents of latent_channels x
    latent mel bins features)."""
    output_channels: int = 2
    """Mel spectrogram channels (2: stereo)."""
    ch_mult: tuple[int, ...] = (1, 2, 4)
    num_res_blocks: int = 2
    """Residual blocks per encoder stage; the decoder uses one more per stage."""
    attn_resolutions: tuple[int, ...] = ()
    """Stage resolutions (resolution / 2^k) whose blocks are followed by self-attention."""
    resolution: int = 256
    """Nominal input resolution; only attn_resolutions is measured against it."""
    latent_channels: int = 8
    norm_type: str = "pixel"
    """pixel (RMS over channels, no weights) or group (GroupNorm, 32 groups; only with causality_axis none)."""
    causality_axis: str = "height"
    """Axis of the spectrogram the convolutions are causal along (height = time), or none."""
    mid_block_add_attention: bool = False
    sample_rate: int = 16000
    """Waveform rate the mel spectrogram was computed at (the vocoder's input rate)."""
    mel_hop_length: int = 160
    """Waveform samples per mel frame."""
    mel_bins: int = 64
    """Mel bins of the decoded spectrogram (the latent has a quarter as many)."""

    @property
    def latents_per_second(self) -> float:
        """Audio latent frames per second of sound (the pipeline sizes audio latents from the video's duration)."""
        return self.sample_rate / self.mel_hop_length / LATENT_DOWNSAMPLE

    @property
    def latent_mel_bins(self) -> int:
        return self.mel_bins // LATENT_DOWNSAMPLE

    def latent_frames(self, seconds: float) -> int:
        """Audio latent frames for a clip of `seconds` (LTX2Pipeline: round(duration x latents per second))."""
        return round(seconds * self.latents_per_second)

    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """Every config.json key from_diffusers classifies (AUDIO_VAE_POLICY); any other is refused."""
        return AUDIO_VAE_POLICY.known

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> LTX2AudioVAEConfig:
        """Read a diffusers AutoencoderKLLTX2Audio config.json dict; a key or value we cannot honour is a
        CheckpointError naming it."""
        where = "audio VAE config"
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), where)
        AUDIO_VAE_POLICY.check(cfg, where)
        values: dict[str, Any] = {key: read_key(cfg, key, getattr(cls, key), positive_int, where) for key in _INT_KEYS}
        values["ch_mult"] = read_key(cfg, "ch_mult", cls.ch_mult, positive_ints, where)
        values["attn_resolutions"] = read_key(cfg, "attn_resolutions", (), positive_ints, where)
        values["mid_block_add_attention"] = read_key(cfg, "mid_block_add_attention", False, strict_bool, where)
        if "mel_bins" in cfg and cfg["mel_bins"] is None:  # the reference decoder allows it; its pipelines cannot
            raise CheckpointError(f"{where}: mel_bins=null is not supported (LTX-2 pipelines size audio latents "
                                  "from mel_bins)")
        values["mel_bins"] = read_key(cfg, "mel_bins", cls.mel_bins, positive_int, where)
        values["norm_type"] = str(cfg.get("norm_type", cls.norm_type))
        values["causality_axis"] = str(cfg.get("causality_axis", cls.causality_axis))
        check_choice(values["norm_type"], "norm_type", NORM_TYPES, where)
        check_choice(values["causality_axis"], "causality_axis", CAUSALITY_AXES, where)
        if values["norm_type"] == "group":
            if values["causality_axis"] != "none":
                raise CheckpointError(f"{where}: norm_type='group' needs causality_axis='none' "
                                      f"(got {values['causality_axis']!r}; the reference refuses it too)")
            widths = [values["base_channels"] * m for m in values["ch_mult"]]
            if any(w % 32 for w in widths):
                raise CheckpointError(f"{where}: norm_type='group' needs stage widths divisible by 32, got {widths}")
        return cls(**values)


class CausalConv2d(nn.Module):
    """A 2D conv padded so no output sees inputs later along the causal axis (symmetric for axis none)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, causality_axis: str) -> None:
        super().__init__()
        pad = kernel_size - 1
        before, after = pad // 2, pad - pad // 2
        # F.pad order: (left, right, top, bottom) = (width start, width end, height start, height end)
        self.padding = {
            "none": (before, after, before, after),
            "width": (pad, 0, before, after),
            "width-compatibility": (pad, 0, before, after),
            "height": (before, after, pad, 0),
        }[causality_axis]
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, self.padding))


class PixelNorm(nn.Module):
    """RMS normalisation over channels at every position; no weights."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x / torch.sqrt(torch.mean(x * x, dim=1, keepdim=True) + self.eps)


def make_norm(norm_type: str, channels: int) -> nn.Module:
    if norm_type == "group":
        return nn.GroupNorm(32, channels, eps=1e-6, affine=True)
    return PixelNorm(1e-6)


class ResnetBlock(nn.Module):
    """norm -> SiLU -> conv, twice, plus a 1x1 projection of the input when the width changes."""

    def __init__(self, in_channels: int, out_channels: int, config: LTX2AudioVAEConfig) -> None:
        super().__init__()
        axis = config.causality_axis
        self.norm1 = make_norm(config.norm_type, in_channels)
        self.conv1 = CausalConv2d(in_channels, out_channels, 3, axis)
        self.norm2 = make_norm(config.norm_type, out_channels)
        self.conv2 = CausalConv2d(out_channels, out_channels, 3, axis)
        self.nin_shortcut = CausalConv2d(in_channels, out_channels, 1, axis) if in_channels != out_channels else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all (time, mel) positions, residual."""

    def __init__(self, channels: int, norm_type: str) -> None:
        super().__init__()
        self.norm = make_norm(norm_type, channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        normed = self.norm(x)
        q = self.q(normed).reshape(b, c, h * w).transpose(1, 2)  # [B, HW, C]
        k = self.k(normed).reshape(b, c, h * w)  # [B, C, HW]
        v = self.v(normed).reshape(b, c, h * w)
        weights = torch.softmax(torch.bmm(q, k) * c ** -0.5, dim=2)  # [B, HW query, HW key]
        out = torch.bmm(v, weights.transpose(1, 2)).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    """Nearest 2x, a causal conv, then drop the first row/column along the causal axis (keeps causality)."""

    def __init__(self, channels: int, causality_axis: str) -> None:
        super().__init__()
        self.causality_axis = causality_axis
        self.conv = CausalConv2d(channels, channels, 3, causality_axis)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        if self.causality_axis == "height":
            return x[:, :, 1:, :]
        if self.causality_axis == "width":
            return x[:, :, :, 1:]
        return x


class MidBlock(nn.Module):
    def __init__(self, channels: int, config: LTX2AudioVAEConfig) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, config)
        self.attn_1 = AttnBlock(channels, config.norm_type) if config.mid_block_add_attention else nn.Identity()
        self.block_2 = ResnetBlock(channels, channels, config)

    def forward(self, x: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class UpStage(nn.Module):
    """num_res_blocks + 1 residual blocks (each optionally followed by attention), then an optional upsample."""

    def __init__(self, in_channels: int, out_channels: int, attention: bool, upsample: bool,
                 config: LTX2AudioVAEConfig) -> None:
        super().__init__()
        widths = [in_channels] + [out_channels] * (config.num_res_blocks + 1)
        self.block = nn.ModuleList(ResnetBlock(a, b, config) for a, b in zip(widths, widths[1:]))
        self.attn = nn.ModuleList(AttnBlock(out_channels, config.norm_type) for _ in self.block) if attention \
            else nn.ModuleList()
        self.upsample = Upsample(out_channels, config.causality_axis) if upsample else None

    def forward(self, x: Tensor) -> Tensor:
        for index, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[index](x)
        return x if self.upsample is None else self.upsample(x)


class Decoder(nn.Module):
    """Latent [B, latent_channels, T, M/4] -> mel [B, output_channels, 4T - 3, mel_bins]."""

    def __init__(self, config: LTX2AudioVAEConfig) -> None:
        super().__init__()
        self.config = config
        levels = len(config.ch_mult)
        widths = [config.base_channels * m for m in config.ch_mult]
        self.conv_in = CausalConv2d(config.latent_channels, widths[-1], 3, config.causality_axis)
        self.mid = MidBlock(widths[-1], config)
        stages: list[UpStage] = []  # built deepest first, stored shallowest first (up[0] runs last)
        width, resolution = widths[-1], config.resolution // 2 ** (levels - 1)
        for level in reversed(range(levels)):
            attention = resolution in config.attn_resolutions
            stages.insert(0, UpStage(width, widths[level], attention, level != 0, config))
            width = widths[level]
            resolution = resolution * 2 if level != 0 else resolution
        self.up = nn.ModuleList(stages)
        self.norm_out = make_norm(config.norm_type, widths[0])
        self.conv_out = CausalConv2d(widths[0], config.output_channels, 3, config.causality_axis)

    def forward(self, latents: Tensor) -> Tensor:
        # Follows diffusers' LTX2AudioDecoder.forward step by step, including its crop / zero-pad to the target size.
        frames = latents.shape[2]
        target_frames = max(frames * LATENT_DOWNSAMPLE - (LATENT_DOWNSAMPLE - 1), 1)  # causal: first frame is 1
        target_bins = self.config.mel_bins
        h = self.mid(self.conv_in(latents))
        for level in reversed(range(len(self.up))):
            h = self.up[level](h)
        mel = self.conv_out(F.silu(self.norm_out(h)))
        mel = mel[:, :, :target_frames, :target_bins]
        pad_frames, pad_bins = target_frames - mel.shape[2], target_bins - mel.shape[3]
        if pad_frames > 0 or pad_bins > 0:
            mel = F.pad(mel, (0, max(pad_bins, 0), 0, max(pad_frames, 0)))
        return mel


class LTX2AudioVAE(nn.Module):
    """The decoder and the per-feature latent statistics the pipeline (de)normalises packed audio latents with."""

    latents_mean: Tensor
    latents_std: Tensor

    def __init__(self, config: LTX2AudioVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.decoder = Decoder(config)
        # Sized base_channels as in the reference; they apply to packed latents [B, T, latent_channels * M/4].
        self.register_buffer("latents_mean", torch.zeros(config.base_channels))
        self.register_buffer("latents_std", torch.ones(config.base_channels))

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Unpacked latents [B, latent_channels, T, M/4] -> mel spectrogram [B, output_channels, 4T - 3, mel_bins]."""
        if latents.ndim != 4 or latents.shape[1] != self.config.latent_channels:
            raise ValueError(f"audio latents must be [B, {self.config.latent_channels}, T, M], got {tuple(latents.shape)}")
        return self.decoder(latents)

    def denormalize(self, packed: Tensor) -> Tensor:
        """Packed latents [B, T, F] the transformer produced -> the VAE's latent scale (inverse of normalize)."""
        self._check_packed(packed)
        return packed * self.latents_std.to(packed) + self.latents_mean.to(packed)

    def normalize(self, packed: Tensor) -> Tensor:
        """Packed VAE-scale latents [B, T, F] -> the transformer's unit scale."""
        self._check_packed(packed)
        return (packed - self.latents_mean.to(packed)) / self.latents_std.to(packed)

    def _check_packed(self, packed: Tensor) -> None:
        if packed.ndim != 3 or packed.shape[-1] != self.latents_mean.numel():
            raise ValueError(f"packed audio latents must be [B, T, {self.latents_mean.numel()}] (the statistics' "
                             f"size, base_channels), got {tuple(packed.shape)}")


def pack_audio_latents(latents: Tensor) -> Tensor:
    """[B, C, T, M] -> the transformer's token sequence [B, T, C * M] (one token per latent frame, channels major)."""
    return latents.transpose(1, 2).flatten(2, 3)


def unpack_audio_latents(tokens: Tensor, latent_mel_bins: int) -> Tensor:
    """Inverse of pack_audio_latents: [B, T, C * M] -> [B, C, T, M]."""
    return tokens.unflatten(2, (-1, latent_mel_bins)).transpose(1, 2)
