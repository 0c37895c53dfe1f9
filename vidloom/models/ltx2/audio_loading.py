"""Load the LTX-2 audio VAE and vocoder from their diffusers component folders (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import read_json
from vidloom.loading.safetensors_io import load_weights, skip_prefixes
from vidloom.models.ltx2.audio_vae import LTX2_AUDIO_VAE_NAME_MAP, LTX2_AUDIO_VAE_SKIPPED, LTX2AudioVAE, LTX2AudioVAEConfig
from vidloom.models.ltx2.vocoder import LTX2_VOCODER_BWE_SKIPPED, LTX2Vocoder, LTX2VocoderConfig

C = TypeVar("C")


def load_audio_vae(folder: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> LTX2AudioVAE:
    """The decoder half of an `audio_vae` folder (AutoencoderKLLTX2Audio), in eval mode on `device`."""
    vae = LTX2AudioVAE(_read_config(Path(folder), LTX2AudioVAEConfig.from_diffusers))
    load_weights(vae, Path(folder), LTX2_AUDIO_VAE_NAME_MAP, skip=skip_prefixes(LTX2_AUDIO_VAE_SKIPPED))
    return vae.to(device=device, dtype=dtype).eval()


def load_vocoder(folder: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> LTX2Vocoder:
    """A `vocoder` folder (LTX2Vocoder or LTX2VocoderWithBWE), in eval mode on `device`.

    The filter taps and analysis bases are loaded from the checkpoint like the weights (the reference
    stores them in bfloat16 for LTX-2.3); only the Hann resampler is computed.
    """
    vocoder = LTX2Vocoder(_read_config(Path(folder), LTX2VocoderConfig.from_diffusers))
    skip = LTX2_VOCODER_BWE_SKIPPED if vocoder.config.bandwidth_extension is not None else ()
    load_weights(vocoder, Path(folder), vocoder.name_map, skip=skip_prefixes(skip))
    return vocoder.to(device=device, dtype=dtype).eval()


def _read_config(folder: Path, parse: Callable[[dict[str, Any]], C]) -> C:
    """`parse` of `folder`/config.json; its CheckpointError names the file."""
    path = folder / "config.json"
    try:
        return parse(read_json(path))
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def load_audio_decoders(root: Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> tuple[LTX2AudioVAE, LTX2Vocoder]:
    """The `audio_vae` and `vocoder` folders of a diffusers LTX-2 checkpoint at `root`, checked to fit together."""
    vae = load_audio_vae(Path(root) / "audio_vae", device, dtype)
    vocoder = load_vocoder(Path(root) / "vocoder", device, dtype)
    check_vocoder_fits(vae.config, vocoder.config, Path(root))
    return vae, vocoder


def check_vocoder_fits(vae: LTX2AudioVAEConfig, vocoder: LTX2VocoderConfig, root: Path) -> None:
    """CheckpointError unless the vocoder reads the mel spectrograms the audio VAE decodes (channels x bins)."""
    mel_features = vae.output_channels * vae.mel_bins
    if vocoder.generator.in_channels != mel_features:
        raise CheckpointError(
            f"{root}: vocoder/config.json in_channels={vocoder.generator.in_channels}, but audio_vae decodes "
            f"{vae.output_channels} x {vae.mel_bins} mel features ({mel_features}); the two do not belong together")
