"""Tiny Stable Audio Open checkpoints written by diffusers + transformers (random weights, offline tokenizer).

Saved by `StableAudioPipeline.save_pretrained` itself, so loading them also tests our checkpoint reader. Two
shapes: stereo with a projected text width, grouped cross-attention heads and the exponential schedule; mono with
the identity text projection, a deeper VAE and the Karras schedule with the Heun second-order update. Random init
leaves the conditioning faint, so the seconds frequencies and the text/global projections are scaled up: a wrong
duration or text path then moves the waveform far beyond the parity tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from vidloom.demo.tokenizer import train_t5_tokenizer

TEXT_TOKENS = 16  # the tokenizer's model_max_length: prompts are padded to it


@dataclass(frozen=True)
class TinyStableAudio:
    name: str
    transformer: dict
    vae: dict
    projection: dict
    scheduler: dict = field(default_factory=dict)
    text_encoder: dict = field(default_factory=lambda: {
        "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
        "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
        "feed_forward_proj": "relu", "dropout_rate": 0.0,
    })

    @property
    def max_seconds(self) -> float:
        hop = 1
        for r in self.vae["downsampling_ratios"]:
            hop *= r
        return self.transformer["sample_size"] * hop / self.vae["sampling_rate"]


TINY_STEREO = TinyStableAudio(
    name="stereo",
    transformer=dict(sample_size=32, in_channels=8, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                     num_key_value_attention_heads=2, out_channels=8, cross_attention_dim=16, time_proj_dim=16,
                     global_states_input_dim=48, cross_attention_input_dim=24),
    vae=dict(encoder_hidden_size=16, downsampling_ratios=[2, 4], channel_multiples=[1, 2], decoder_channels=4,
             decoder_input_channels=8, audio_channels=2, sampling_rate=256),
    projection=dict(text_encoder_dim=32, conditioning_dim=24, min_value=0, max_value=4),
)
TINY_MONO = TinyStableAudio(
    name="mono",
    transformer=dict(sample_size=24, in_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
                     num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=32, time_proj_dim=32,
                     global_states_input_dim=64, cross_attention_input_dim=32),
    vae=dict(encoder_hidden_size=8, downsampling_ratios=[2, 2, 2], channel_multiples=[1, 2, 2], decoder_channels=4,
             decoder_input_channels=4, audio_channels=1, sampling_rate=160),
    projection=dict(text_encoder_dim=32, conditioning_dim=32, min_value=0, max_value=3),
    scheduler=dict(sigma_schedule="karras", solver_type="heun", sigma_max=200.0),
)
CONFIGS = (TINY_STEREO, TINY_MONO)


def build_pipeline(spec: TinyStableAudio, seed: int = 0):
    """A StableAudioPipeline of `spec` (random weights, CosineDPMSolverMultistepScheduler)."""
    from diffusers import AutoencoderOobleck, CosineDPMSolverMultistepScheduler, StableAudioDiTModel, StableAudioPipeline
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    transformer = StableAudioDiTModel(**spec.transformer).eval()
    vae = AutoencoderOobleck(**spec.vae).eval()
    projection = StableAudioProjectionModel(**spec.projection).eval()
    tokenizer = train_t5_tokenizer()
    tokenizer.model_max_length = TEXT_TOKENS
    text_encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), **spec.text_encoder)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for conditioner in (projection.start_number_conditioner, projection.end_number_conditioner):
            conditioner.time_positional_embedding[0].weights.mul_(3.0)
            conditioner.time_positional_embedding[1].weight.mul_(4.0)
        for proj in (transformer.global_proj, transformer.cross_attention_proj, transformer.timestep_proj):
            proj[0].weight.mul_(3.0)
        transformer.time_proj.weight.mul_(4.0)
        for snake in [m for m in vae.modules() if type(m).__name__ == "Snake1d"]:
            snake.alpha.add_(torch.randn(snake.alpha.shape, generator=g) * 0.3)
            snake.beta.add_(torch.randn(snake.beta.shape, generator=g) * 0.3)
    scheduler = CosineDPMSolverMultistepScheduler(**spec.scheduler)
    return StableAudioPipeline(vae=vae, text_encoder=text_encoder, projection_model=projection, tokenizer=tokenizer,
                               transformer=transformer, scheduler=scheduler)


def write_tiny_stable_audio(folder: Path, spec: TinyStableAudio, seed: int = 0) -> Path:
    """Save `spec` as a StableAudioPipeline folder with diffusers' own save_pretrained."""
    build_pipeline(spec, seed).save_pretrained(str(folder))
    return folder


def load_reference(folder: Path):
    """The reference pipeline read back from `folder` (float32, CPU)."""
    from diffusers import StableAudioPipeline

    return StableAudioPipeline.from_pretrained(str(folder)).to("cpu")
