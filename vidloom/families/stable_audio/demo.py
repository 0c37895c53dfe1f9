"""stable-audio-demo: the Stable Audio Open architecture at a tiny size with seeded random weights.

Text to audio (about one second of 16 kHz stereo), through the same cosine DPM-solver++ recipe as
stabilityai/stable-audio-open-1.0. Written once into the user's cache as a StableAudioPipeline folder (our own DiT,
Oobleck decoder and projection, a small T5 encoder built by transformers, a tokenizer trained offline) and loaded
through the same loader as real checkpoints. Its weights are random: the sound is noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import AudioSpec, ModelCard
from vidloom.loading.name_map import NameMap
from vidloom.families.stable_audio.projection import (
    STABLE_AUDIO_PROJECTION_NAME_MAP, ProjectionConfig, StableAudioProjection,
)
from vidloom.families.stable_audio.transformer import STABLE_AUDIO_DIT_NAME_MAP, StableAudioDiT, StableAudioDiTConfig
from vidloom.families.stable_audio.vae import OobleckDecoderConfig, OobleckVAE
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.demo.writer import Part, model_index, write_parts, write_pipeline_files, write_t5_encoder
from vidloom.families.stable_audio.cards import DEFAULTS, stable_audio_card

DEMO_ID = "stable-audio-demo"
DEMO_VERSION = 3  # bump when the demo's architecture or files change
DEMO_SEED = 20261201
DEMO_NOTE = noise_note(DEMO_ID, "Stable Audio Open", "stabilityai/stable-audio-open-1.0")
TEXT_TOKENS = 32  # the tokenizer's model_max_length (the real checkpoint's is 128)

DEMO_TRANSFORMER = {
    "_class_name": "StableAudioDiTModel", "sample_size": 128, "in_channels": 8, "num_layers": 2,
    "attention_head_dim": 16, "num_attention_heads": 2, "num_key_value_attention_heads": 1, "out_channels": 8,
    "cross_attention_dim": 32, "time_proj_dim": 32, "global_states_input_dim": 64, "cross_attention_input_dim": 32,
}
# hop 2*4*4*4 = 128 samples per latent step: 128 steps are 16384 samples, 1.024 s at 16 kHz.
DEMO_VAE = {
    "_class_name": "AutoencoderOobleck", "encoder_hidden_size": 16, "downsampling_ratios": [2, 4, 4, 4],
    "channel_multiples": [1, 2, 2, 4], "decoder_channels": 4, "decoder_input_channels": 8, "audio_channels": 2,
    "sampling_rate": 16000,
}
DEMO_PROJECTION = {"_class_name": "StableAudioProjectionModel", "text_encoder_dim": 32, "conditioning_dim": 32,
                   "min_value": 0, "max_value": 10}
DEMO_TEXT_ENCODER = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
                     "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
                     "feed_forward_proj": "relu", "dropout_rate": 0.0}
# stabilityai/stable-audio-open-1.0's scheduler_config.json.
DEMO_SCHEDULER = {
    "_class_name": "CosineDPMSolverMultistepScheduler", "sigma_min": 0.3, "sigma_max": 500.0, "sigma_data": 1.0,
    "sigma_schedule": "exponential", "num_train_timesteps": 1000, "solver_order": 2,
    "prediction_type": "v_prediction", "rho": 7.0, "solver_type": "midpoint", "lower_order_final": True,
    "euler_at_final": False, "final_sigmas_type": "zero",
}
MODEL_INDEX = model_index(
    "StableAudioPipeline",
    projection_model="stable_audio:StableAudioProjectionModel",
    scheduler="diffusers:CosineDPMSolverMultistepScheduler", text_encoder="transformers:T5EncoderModel",
    tokenizer="transformers:T5TokenizerFast", transformer="diffusers:StableAudioDiTModel",
    vae="diffusers:AutoencoderOobleck",
)
DEMO_WINDOW = 128 * 128 / 16000
DEMO_AUDIO = AudioSpec(max_seconds=DEMO_WINDOW, default_seconds=DEMO_WINDOW, min_start=0.0, max_end=DEMO_WINDOW,
                       sample_rate=16000, min_seconds=1 / 16000)
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, num_inference_steps=8)


def demo_card() -> ModelCard:
    return stable_audio_card(
        DEMO_ID, f"demo:{DEMO_ID}", DEMO_AUDIO, defaults=DEMO_DEFAULTS, precision="float32",
        description="Stable Audio Open (text to audio, ~1 s of 16 kHz stereo) at a tiny size, random weights",
        notes=(DEMO_NOTE,),
    )


def write_demo_checkpoint(folder: Path) -> None:
    """A StableAudioPipeline folder from our own modules (diffusers can load it too)."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, (
        # fill 1.0: the Fourier frequencies of the noise level, N(0, 1) as trained from
        Part("transformer", lambda: StableAudioDiT(StableAudioDiTConfig.from_diffusers(DEMO_TRANSFORMER)),
             STABLE_AUDIO_DIT_NAME_MAP, DEMO_TRANSFORMER, fill_std=1.0),
        Part("vae", _quiet_vae, NameMap(()), DEMO_VAE),
        Part("projection_model", lambda: StableAudioProjection(ProjectionConfig.from_diffusers(DEMO_PROJECTION)),
             STABLE_AUDIO_PROJECTION_NAME_MAP, DEMO_PROJECTION, fill_std=1.0),
    ))
    tokenizer = train_t5_tokenizer()
    tokenizer.model_max_length = TEXT_TOKENS
    write_t5_encoder(folder / "text_encoder", len(tokenizer), DEMO_TEXT_ENCODER, DEMO_SEED + 1, umt5=False)
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)


def _quiet_vae() -> OobleckVAE:
    """The Oobleck VAE with a quiet output layer: the random decoder's waveform then peaks near full scale.
    Set before the part's fill, which leaves nonzero weights as they are."""
    vae = OobleckVAE(OobleckDecoderConfig.from_diffusers(DEMO_VAE))
    with torch.no_grad():
        vae.decoder.conv2.weight_g.fill_(0.01)
    return vae


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
