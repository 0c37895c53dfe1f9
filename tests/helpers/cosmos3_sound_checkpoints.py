"""A tiny Cosmos3 Omni folder that makes sound: a sound-generating transformer plus a decoder-only
Cosmos3AVAEAudioTokenizer, written by Cosmos3OmniPipeline.save_pretrained (safety checker off)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.cosmos3_checkpoints import COSMOS3_A, TinyCosmos3, build_pipeline

SOUND_DIM = 8
# 8 kHz (the lowest rate AAC takes) keeps the waveform short; strides (4, 5): 20 samples per latent step.
SOUND_TOKENIZER = dict(sampling_rate=8000, vocoder_input_dim=SOUND_DIM, dec_dim=4, dec_c_mults=(1, 2),
                       dec_strides=(4, 5), dec_out_channels=2, encoder_enabled=False)
COSMOS3_SOUND = TinyCosmos3(name="cosmos3-sound",
                            transformer={**COSMOS3_A.transformer, "sound_gen": True, "sound_dim": SOUND_DIM})


def build_sound_tokenizer(seed: int = 0):
    from diffusers import Cosmos3AVAEAudioTokenizer

    torch.manual_seed(seed + 3)
    tokenizer = Cosmos3AVAEAudioTokenizer(**SOUND_TOKENIZER).eval()
    g = torch.Generator().manual_seed(seed + 4)
    with torch.no_grad():
        for name, p in tokenizer.named_parameters():
            if name.endswith(("alpha", "beta")):  # SnakeBeta starts at exp(0) = 1: move it
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("weight_g"):
                p.mul_(0.5)  # keep the waveform mostly inside the [-1, 1] clamp
    return tokenizer


def write_tiny_cosmos3_sound(folder: Path, seed: int = 0) -> Path:
    pipe = build_pipeline(COSMOS3_SOUND, seed)
    pipe.register_modules(sound_tokenizer=build_sound_tokenizer(seed))
    pipe.save_pretrained(folder)
    return folder
