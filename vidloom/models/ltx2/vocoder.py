"""The LTX-2 vocoder: stereo mel spectrogram -> waveform, numerically equivalent to diffusers' LTX2Vocoder
(LTX-2.0: one generator, 24 kHz) and LTX2VocoderWithBWE (LTX-2.3: a 16 kHz generator, then a bandwidth
extender that re-analyses its output and adds a high band on top of a resampled copy, 48 kHz).
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
from vidloom.models.ltx2.vocoder_layers import Generator, GeneratorConfig, UpSample1d

PLAIN_CLASS, BWE_CLASS = "LTX2Vocoder", "LTX2VocoderWithBWE"
ACT_FNS = ("leaky_relu", "snake", "snakebeta")
FINAL_ACTS = ("tanh", "clamp", None)

# diffusers LTX2Vocoder keys sit at the top level; ours under `generator`.
LTX2_VOCODER_NAME_MAP = NameMap(tuple((name, f"generator.{name}")
                                      for name in ("conv_in", "upsamplers", "resnets", "act_out", "conv_out")))
# LTX2VocoderWithBWE: its first stage is `vocoder`, the extender `bwe_generator`, the analysis `mel_stft`.
LTX2_VOCODER_BWE_NAME_MAP = NameMap((("vocoder", "generator"), ("bwe_generator", "extender"),
                                     ("mel_stft.stft_fn", "mel"), ("mel_stft", "mel")))
LTX2_VOCODER_BWE_SKIPPED = ("mel_stft.stft_fn.inverse_basis",)
"""Checkpoint tensors not loaded: the inverse STFT basis, which inference never uses."""

_GENERATOR_INTS = ("in_channels", "hidden_channels", "out_channels", "antialias_ratio", "antialias_kernel_size")
_GENERATOR_KEYS = (*_GENERATOR_INTS, "upsample_kernel_sizes", "upsample_factors", "resnet_kernel_sizes",
                   "resnet_dilations", "act_fn", "leaky_relu_negative_slope", "antialias", "final_act_fn", "final_bias")
_BWE_INTS = ("filter_length", "hop_length", "window_length", "num_mel_channels", "input_sampling_rate")


@dataclass(frozen=True)
class BandwidthExtensionConfig:
    """LTX2VocoderWithBWE's second stage: log-mel analysis of the first stage's output, and a generator on it."""

    extender: GeneratorConfig
    filter_length: int = 512
    hop_length: int = 80
    """Waveform samples per analysis frame; the first stage's output is zero-padded to a multiple of it."""
    window_length: int = 512
    num_mel_channels: int = 64
    input_sampling_rate: int = 16000
    """Rate of the first stage's waveform."""


@dataclass(frozen=True)
class LTX2VocoderConfig:
    generator: GeneratorConfig
    output_sampling_rate: int = 24000
    """Rate of the waveform the vocoder returns."""
    bandwidth_extension: BandwidthExtensionConfig | None = None

    @staticmethod
    def config_keys(class_name: str = PLAIN_CLASS) -> frozenset[str]:
        """The config.json keys from_diffusers reads for `class_name`; any other is refused."""
        bwe = (*(f"bwe_{k}" for k in _GENERATOR_KEYS), *_BWE_INTS) if class_name == BWE_CLASS else ()
        return frozenset((*_GENERATOR_KEYS, *bwe, "output_sampling_rate"))

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> LTX2VocoderConfig:
        """Read a diffusers LTX2Vocoder / LTX2VocoderWithBWE config.json dict; a key or value we cannot
        honour is a CheckpointError naming it."""
        where = "vocoder config"
        class_name = check_class_name(cfg, (PLAIN_CLASS, BWE_CLASS), where)
        KeyPolicy(cls.config_keys(class_name)).check(cfg, where)
        generator = _generator_config(cfg, "", where)
        rate = read_key(cfg, "output_sampling_rate", 48000 if class_name == BWE_CLASS else 24000, positive_int, where)
        if class_name == PLAIN_CLASS:
            return cls(generator, rate)
        bwe = BandwidthExtensionConfig(
            _generator_config(cfg, "bwe_", where),
            **{key: read_key(cfg, key, getattr(BandwidthExtensionConfig, key), positive_int, where)
               for key in _BWE_INTS})
        _check_extension(bwe, generator, rate, where)
        return cls(generator, rate, bwe)


def _generator_config(cfg: Mapping[str, Any], prefix: str, where: str) -> GeneratorConfig:
    """One stage's keys (`prefix` "bwe_" for the extender); the BWE class's defaults differ from the plain one's."""
    defaults = {**GeneratorConfig().__dict__, **(_BWE_DEFAULTS[prefix] if cfg.get("_class_name") == BWE_CLASS else {})}

    def read(key: str, convert: Any) -> Any:
        return read_key(cfg, prefix + key, defaults[key], convert, where)

    values: dict[str, Any] = {key: read(key, positive_int) for key in _GENERATOR_INTS}
    for key in ("upsample_kernel_sizes", "upsample_factors", "resnet_kernel_sizes"):
        values[key] = read(key, positive_ints)
    values["resnet_dilations"] = read("resnet_dilations", lambda v: tuple(positive_ints(d) for d in v))
    values["act_fn"] = read("act_fn", str)
    values["leaky_relu_negative_slope"] = read("leaky_relu_negative_slope", float)
    values["antialias"] = read("antialias", strict_bool)
    values["final_bias"] = read("final_bias", strict_bool)
    key = prefix + "final_act_fn"  # null is meaningful (no final activation): only an absent key takes the default
    values["final_act_fn"] = cfg[key] if key in cfg else defaults["final_act_fn"]
    config = GeneratorConfig(**values)
    _check_generator(config, prefix, where)
    return config


# LTX2VocoderWithBWE's own defaults for keys its config.json may omit (diffusers writes them all).
_BWE_DEFAULTS: dict[str, dict[str, Any]] = {
    "": {"hidden_channels": 1536, "upsample_kernel_sizes": (11, 4, 4, 4, 4, 4), "upsample_factors": (5, 2, 2, 2, 2, 2),
         "act_fn": "snakebeta", "antialias": True, "final_act_fn": None, "final_bias": False},
    "bwe_": {"hidden_channels": 512, "upsample_kernel_sizes": (12, 11, 4, 4, 4), "upsample_factors": (6, 5, 2, 2, 2),
             "act_fn": "snakebeta", "antialias": True, "final_act_fn": None, "final_bias": False},
}


def _check_generator(config: GeneratorConfig, prefix: str, where: str) -> None:
    check_choice(config.act_fn, f"{prefix}act_fn", ACT_FNS, where)
    check_choice(config.final_act_fn, f"{prefix}final_act_fn", FINAL_ACTS, where)
    if config.act_fn == "leaky_relu" and config.antialias:
        # The reference nests anti-aliasing wrappers ever deeper in that combination; no checkpoint uses it.
        raise CheckpointError(f"{where}: {prefix}antialias=true is not supported with {prefix}act_fn='leaky_relu'")
    if len(config.upsample_kernel_sizes) != len(config.upsample_factors):
        raise CheckpointError(f"{where}: {prefix}upsample_kernel_sizes and {prefix}upsample_factors differ in length")
    if len(config.resnet_kernel_sizes) != len(config.resnet_dilations):
        raise CheckpointError(f"{where}: {prefix}resnet_kernel_sizes and {prefix}resnet_dilations differ in length")
    if config.hidden_channels >> len(config.upsample_factors) < 1:
        raise CheckpointError(f"{where}: {prefix}hidden_channels={config.hidden_channels} cannot be halved "
                              f"{len(config.upsample_factors)} times")
    odd = [(k, s) for k, s in zip(config.upsample_kernel_sizes, config.upsample_factors) if (k - s) % 2]
    if odd:  # then each layer would make hop + 1 samples per frame and the length rule below breaks
        raise CheckpointError(f"{where}: {prefix}upsample kernel/factor pairs {odd} differ by an odd number")


def _check_extension(bwe: BandwidthExtensionConfig, first: GeneratorConfig, rate: int, where: str) -> None:
    if rate % bwe.input_sampling_rate:
        raise CheckpointError(f"{where}: output_sampling_rate={rate} is not a multiple of "
                              f"input_sampling_rate={bwe.input_sampling_rate}")
    if bwe.window_length != bwe.filter_length:
        raise CheckpointError(f"{where}: window_length={bwe.window_length} must equal filter_length="
                              f"{bwe.filter_length} (else analysis frames and samples disagree)")
    if bwe.extender.hop != bwe.hop_length * (rate // bwe.input_sampling_rate):
        raise CheckpointError(f"{where}: bwe_upsample_factors multiply to {bwe.extender.hop}; "
                              f"hop_length x rate ratio is {bwe.hop_length * (rate // bwe.input_sampling_rate)}")
    if bwe.extender.in_channels != first.out_channels * bwe.num_mel_channels:
        raise CheckpointError(f"{where}: bwe_in_channels={bwe.extender.in_channels}, expected out_channels x "
                              f"num_mel_channels = {first.out_channels * bwe.num_mel_channels}")


class CausalLogMel(nn.Module):
    """Log-mel spectrogram over causal (left-padded) windows, with the DFT and mel bases the checkpoint stores."""

    def __init__(self, config: BandwidthExtensionConfig) -> None:
        super().__init__()
        self.hop, self.left_pad = config.hop_length, max(0, config.window_length - config.hop_length)
        freqs = config.filter_length // 2 + 1
        self.register_buffer("forward_basis", torch.zeros(2 * freqs, 1, config.filter_length))  # real; imag rows
        self.register_buffer("mel_basis", torch.zeros(config.num_mel_channels, freqs))

    def forward(self, waveform: Tensor) -> Tensor:
        """[N, S] -> log mel [N, mels, S / hop]."""
        spec = F.conv1d(F.pad(waveform.unsqueeze(1), (self.left_pad, 0)), self.forward_basis, stride=self.hop)
        real, imag = spec.chunk(2, dim=1)
        magnitude = torch.sqrt(real ** 2 + imag ** 2)
        return torch.log(torch.clamp(torch.matmul(self.mel_basis.to(magnitude.dtype), magnitude), min=1e-5))


class LTX2Vocoder(nn.Module):
    """mel [B, C, T, M] -> waveform [B, channels, samples] at `sample_rate`."""

    def __init__(self, config: LTX2VocoderConfig) -> None:
        super().__init__()
        self.config = config
        self.generator = Generator(config.generator)
        bwe = config.bandwidth_extension
        if bwe is not None:
            self.mel = CausalLogMel(bwe)
            self.extender = Generator(bwe.extender)
            self.resampler = UpSample1d(config.output_sampling_rate // bwe.input_sampling_rate, window="hann")

    @property
    def sample_rate(self) -> int:
        return self.config.output_sampling_rate

    @property
    def name_map(self) -> NameMap:
        return LTX2_VOCODER_NAME_MAP if self.config.bandwidth_extension is None else LTX2_VOCODER_BWE_NAME_MAP

    def output_samples(self, mel_frames: int) -> int:
        """Waveform samples per channel for `mel_frames` input frames."""
        samples = mel_frames * self.config.generator.hop
        bwe = self.config.bandwidth_extension
        return samples if bwe is None else samples * self.config.output_sampling_rate // bwe.input_sampling_rate

    @torch.no_grad()
    def forward(self, mel: Tensor) -> Tensor:
        if mel.ndim != 4 or mel.shape[1] * mel.shape[3] != self.config.generator.in_channels:
            raise ValueError(f"mel must be [B, C, T, M] with C x M = {self.config.generator.in_channels}, "
                             f"got {tuple(mel.shape)}")
        waveform = self.generator(mel)
        if self.config.bandwidth_extension is None:
            return waveform
        return self._extend(waveform)

    def _extend(self, low: Tensor) -> Tensor:
        # Follows diffusers' LTX2VocoderWithBWE.forward step by step (its padding branch reaches hop_length
        # through a deprecated config attribute; the zero padding is the same).
        bwe = self.config.bandwidth_extension
        assert bwe is not None
        batch, channels, samples = low.shape
        if samples % bwe.hop_length:
            low = F.pad(low, (0, bwe.hop_length - samples % bwe.hop_length))
        mel = self.mel(low.flatten(0, 1)).unflatten(0, (batch, channels))  # [B, C, mels, frames]
        residual = self.extender(mel.transpose(2, 3))
        waveform = torch.clamp(residual + self.resampler(low), -1, 1)
        return waveform[..., :samples * self.config.output_sampling_rate // bwe.input_sampling_rate]
