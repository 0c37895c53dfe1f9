"""Cosmos3's sound decoder: sound latents [C, T] -> a waveform [channels, T * hop] (the AVAE's Oobleck decoder).

Layout (diffusers `Cosmos3AVAEAudioTokenizer.decoder`): a 7-tap conv in, then per upsampling stride a
block [Snake -> transposed conv (x stride) -> three dilated residual units (1, 3, 9)], then Snake and a
7-tap conv out, clamped to [-1, 1]; the blocks are the shared Oobleck pieces (vidloom.layers.oobleck).
Only the decoder: generation never encodes sound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor

from vidloom.core.errors import CheckpointError
from vidloom.layers.oobleck import OobleckDecoder
from vidloom.loading.key_policy import KeyPolicy

# Cosmos3AVAEAudioTokenizer's config.json, key by key. Read: the decoder's sizes (below).
DECODER_KEYS = frozenset({"sampling_rate", "vocoder_input_dim", "dec_dim", "dec_c_mults", "dec_strides",
                          "dec_out_channels", "hop_size"})
# The only values the reference implements (it raises NotImplementedError on others); we refuse the rest.
FIXED_KEYS: dict[str, Any] = {
    "model_type": "autoencoder_v2", "use_wav_as_input": True, "enc_type": "spec_convnext", "bottleneck_type": "vae",
    "dec_type": "oobleck", "dec_use_snake": True, "dec_final_tanh": False, "dec_anti_aliasing": False,
    "dec_use_nearest_upsample": False, "dec_use_tanh_at_final": False, "activation": "snakebeta",
    "snake_logscale": True, "anti_aliasing": False, "use_cuda_kernel": False, "latent_mean": None, "latent_std": None,
}
# The encoder's settings (and `bottleneck`, checked as the reference does): generation never encodes sound.
ENCODER_KEYS = frozenset({"stereo", "normalize_volume", "input_channels", "enc_dim", "enc_intermediate_dim",
                          "enc_num_layers", "enc_num_blocks", "enc_n_fft", "enc_hop_length", "enc_latent_dim",
                          "enc_c_mults", "enc_strides", "enc_identity_init", "enc_use_snake", "causal",
                          "padding_mode", "encoder_enabled", "bottleneck"})
SOUND_TOKENIZER_KEYS = DECODER_KEYS | FIXED_KEYS.keys() | ENCODER_KEYS


def check_sound_tokenizer_keys(raw: Mapping[str, Any]) -> None:
    """CheckpointError naming a key we do not read or a value the shipped AVAE does not have."""
    where = "sound_tokenizer/config.json"
    KeyPolicy(SOUND_TOKENIZER_KEYS).check(raw, where)
    for key, expected in FIXED_KEYS.items():
        value = raw.get(key, expected)
        if value != expected or type(value) is not type(expected):
            raise CheckpointError(f"{where}: {key}={value!r} is not supported; the AVAE decoder needs {expected!r}")
    bottleneck = raw.get("bottleneck")
    if bottleneck is not None and (not isinstance(bottleneck, dict) or bottleneck.get("type", "vae") != "vae"):
        raise CheckpointError(f"{where}: bottleneck={bottleneck!r} is not supported; expected a 'vae' bottleneck")


@dataclass(frozen=True)
class SoundDecoderConfig:
    """The decoder's sizes from sound_tokenizer/config.json."""

    sampling_rate: int
    latent_dim: int  # vocoder_input_dim: equals the transformer's sound_dim
    channels: int  # dec_dim
    channel_mults: tuple[int, ...]
    strides: tuple[int, ...]  # dec_strides, applied in reverse order (the encoder's order)
    audio_channels: int
    hop_size: int  # waveform samples per latent step

    @classmethod
    def from_diffusers(cls, raw: Mapping[str, Any]) -> SoundDecoderConfig:
        check_sound_tokenizer_keys(raw)
        try:
            strides = tuple(int(s) for s in raw.get("dec_strides", (2, 4, 5, 6, 8)))
            hop = raw.get("hop_size")
            return cls(
                sampling_rate=int(raw.get("sampling_rate", 48000)),
                latent_dim=int(raw.get("vocoder_input_dim", 64)),
                channels=int(raw.get("dec_dim", 320)),
                channel_mults=tuple(int(m) for m in raw.get("dec_c_mults", (1, 2, 4, 8, 16))),
                strides=strides,
                audio_channels=int(raw.get("dec_out_channels", 2)),
                hop_size=int(hop) if hop is not None else math.prod(strides),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"sound_tokenizer/config.json: {exc}") from None

    def latent_steps(self, num_frames: int, fps: float) -> int:
        """Latent length for a clip of `num_frames` at `fps` (the reference's rounding: truncate, then ceil by hop)."""
        samples = int(num_frames / fps * self.sampling_rate)
        return (samples + self.hop_size - 1) // self.hop_size


class SoundDecoder(OobleckDecoder):
    """The Oobleck decoder of the checkpoint's `decoder.*` keys (loaded with the `decoder.` prefix stripped)."""

    def __init__(self, config: SoundDecoderConfig) -> None:
        super().__init__(config.latent_dim, config.channels, config.channel_mults, config.strides,
                         config.audio_channels)
        self.config = config

    @torch.no_grad()
    def forward(self, latents: Tensor) -> Tensor:
        """latents [C, T] -> waveform [audio_channels, samples] in [-1, 1]."""
        return super().forward(latents[None]).clamp(-1.0, 1.0)[0]
