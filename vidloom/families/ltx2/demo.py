"""ltx2-demo: the LTX-2 architecture at a tiny size with seeded random weights: video with its own sound.

The audio-video transformer, the text connectors, the video VAE (32x space, 8x time), the audio VAE and
the HiFi-GAN vocoder, a tiny Gemma3 text encoder built by transformers, and a latent upsampler in
latent_upsampler/ for the two-stage program (--two-stage). Written once into the user's cache as an
LTX2Pipeline folder with our own modules and loaded through the same loader as real checkpoints. Its
weights are random: the video and the sound are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
import torch

from vidloom.core.card import ModelCard
from vidloom.loading.name_map import NameMap
from vidloom.models.ltx2.audio_vae import LTX2_AUDIO_VAE_NAME_MAP, LTX2AudioVAE, LTX2AudioVAEConfig
from vidloom.models.ltx2.demo_parts import (
    DEMO_TRANSFORMER, LTX2_DEMO_SEED, connectors_part, ltx2_part, train_tokenizer, transformer_part,
    write_text_encoder,
)
from vidloom.models.ltx2.demo_parts import DEMO_VIDEO_VAE as DEMO_VAE
from vidloom.models.ltx2.upsampler import LTX2_UPSAMPLER_NAME_MAP, LTX2LatentUpsampler, LTX2LatentUpsamplerConfig
from vidloom.models.ltx2.video_vae import LTX2_VIDEO_VAE_NAME_MAP, LTX2VideoVAE, LTX2VideoVAEConfig
from vidloom.models.ltx2.vocoder import LTX2Vocoder, LTX2VocoderConfig
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.writer import model_index, write_parts, write_pipeline_files
from vidloom.families.ltx2.cards import DEFAULTS, ltx2_card

DEMO_ID = "ltx2-demo"
DEMO_VERSION = 2  # bump when the demo's architecture or files change
DEMO_SEED = LTX2_DEMO_SEED
DEMO_NOTE = noise_note(DEMO_ID, "LTX-2", "Lightricks/LTX-2")

# LTX-2's audio layout (pixel norm, causal along time): 4 channels x 16 mel bins / 4 = the transformer's 16.
DEMO_AUDIO_VAE = {
    "_class_name": "AutoencoderKLLTX2Audio",
    "base_channels": 16, "output_channels": 2, "ch_mult": [1, 2], "num_res_blocks": 1, "latent_channels": 4,
    "norm_type": "pixel", "causality_axis": "height", "mel_bins": 16, "sample_rate": 16000,
    "mel_hop_length": 160, "resolution": 16,
}
# LTX-2.0's HiFi-GAN kind: 2 x 16 mel features in, 240 samples per mel frame (24 kHz from 100 frames/s).
DEMO_VOCODER = {
    "_class_name": "LTX2Vocoder",
    "in_channels": 32, "hidden_channels": 32, "out_channels": 2, "upsample_kernel_sizes": [12, 11, 16],
    "upsample_factors": [6, 5, 8], "resnet_kernel_sizes": [3, 5], "resnet_dilations": [[1, 3], [1, 2]],
    "act_fn": "leaky_relu", "leaky_relu_negative_slope": 0.1, "final_act_fn": "tanh", "output_sampling_rate": 24000,
}
DEMO_UPSAMPLER = {
    "_class_name": "LTX2LatentUpsamplerModel",
    "in_channels": 8, "mid_channels": 32, "num_blocks_per_stage": 1, "dims": 3, "spatial_upsample": True,
    "rational_spatial_scale": 2.0,
}
# Lightricks/LTX-2 scheduler/scheduler_config.json (the keys the pipeline reads).
DEMO_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
    "use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05, "base_image_seq_len": 1024,
    "max_image_seq_len": 4096, "shift_terminal": 0.1,
}
MODEL_INDEX = model_index(
    "LTX2Pipeline",
    scheduler="diffusers:FlowMatchEulerDiscreteScheduler", vae="diffusers:AutoencoderKLLTX2Video",
    audio_vae="diffusers:AutoencoderKLLTX2Audio", text_encoder="transformers:Gemma3ForConditionalGeneration",
    tokenizer="transformers:GemmaTokenizerFast", connectors="ltx2:LTX2TextConnectors",
    transformer="diffusers:LTX2VideoTransformer3DModel", vocoder="ltx2:LTX2Vocoder",
)
# The video's cross-attention to the prompt, louder: keys x2 (logits x2, so the prompt's tokens stand out from
# the connectors' registers) and output x3. At default init a new prompt moved the video by 2 levels on average.
TEXT_ATTENTION_SCALE = (("blocks.*.video_text.norm_k.weight", 2.0), ("blocks.*.video_text.out.weight", 3.0))
# Four 32-pixel latent cells a side; the two-stage program (--two-stage) adds the upsampler's 2x pass.
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, height=128, width=128, num_frames=9, num_inference_steps=4)
SIZE_MULTIPLE, TEMPORAL_FACTOR = 32, 8


def demo_card() -> ModelCard:
    return ltx2_card(
        DEMO_ID, f"demo:{DEMO_ID}", multiple=SIZE_MULTIPLE, temporal=TEMPORAL_FACTOR, defaults=DEMO_DEFAULTS,
        description="LTX-2 video with sound (audio VAE + vocoder, two-stage upsampler) at a tiny size, random weights",
        notes=(DEMO_NOTE,), precision="float32",
    )


def write_demo_checkpoint(folder: Path) -> None:
    """An LTX2Pipeline folder (plus latent_upsampler/) from our own modules."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, (
        dataclasses.replace(transformer_part(DEMO_TRANSFORMER), scale=TEXT_ATTENTION_SCALE),
        connectors_part(),
        ltx2_part("vae", lambda: LTX2VideoVAE(LTX2VideoVAEConfig.from_diffusers(DEMO_VAE)), LTX2_VIDEO_VAE_NAME_MAP,
                  DEMO_VAE),
        ltx2_part("audio_vae", lambda: LTX2AudioVAE(LTX2AudioVAEConfig.from_diffusers(DEMO_AUDIO_VAE)),
                  LTX2_AUDIO_VAE_NAME_MAP, DEMO_AUDIO_VAE),
        ltx2_part("vocoder", lambda: LTX2Vocoder(LTX2VocoderConfig.from_diffusers(DEMO_VOCODER)), None, DEMO_VOCODER),
        ltx2_part("latent_upsampler", _upsampler, _upsampler_name_map(), DEMO_UPSAMPLER),
    ))
    tokenizer = train_tokenizer()
    write_text_encoder(folder / "text_encoder", len(tokenizer) + 3)
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)


def _upsampler() -> LTX2LatentUpsampler:
    return LTX2LatentUpsampler(LTX2LatentUpsamplerConfig.from_diffusers(DEMO_UPSAMPLER))


def _upsampler_name_map() -> NameMap:
    # LTX2_UPSAMPLER_NAME_MAP renames the pixel-shuffle conv (diffusers' upsampler.0); the rational
    # resampler's conv has diffusers' own name already, so writing it back through that map would be wrong.
    rational = LTX2LatentUpsamplerConfig.from_diffusers(DEMO_UPSAMPLER).uses_rational_resampler
    return NameMap(()) if rational else LTX2_UPSAMPLER_NAME_MAP


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
