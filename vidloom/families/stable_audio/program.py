"""The Stable Audio program: encode text and seconds -> draw noise (plus an initial waveform's latents) -> denoise
-> decode and cut the clip.

The model always denoises its whole latent window (transformer sample_size); the clip is the decoded waveform
from seconds_start to seconds_start + seconds, as StableAudioPipeline cuts it (int(seconds x sample rate)).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from vidloom.core.card import clip_samples as audio_clip_samples
from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.cosine_dpm import CosineDPMConfig
from vidloom.diffusion.guidance import GuidancePolicy, make_guidance
from vidloom.diffusion.noise import initial_noise
from vidloom.layers.tiling import deploy_tiling
from vidloom.families.stable_audio.projection import StableAudioProjection
from vidloom.families.stable_audio.vae import OobleckVAE
from vidloom.families.stable_audio.loop import StableAudioDenoiseLoop
from vidloom.families.stable_audio.text import StableAudioTextEncoder

NO_FRAMES = np.zeros((0, 0, 0, 3), dtype=np.uint8)  # an audio-only output's "video" slot: no frames


def build_program(instance: ModelInstance, guidance: GuidancePolicy | None = None) -> Program:
    text: StableAudioTextEncoder = instance["text_encoder"]
    projection: StableAudioProjection = instance["projection_model"]
    vae: OobleckVAE = instance["vae"]
    sampler: CosineDPMConfig = instance["scheduler"]
    transformer = instance["transformer"]
    device = instance.device
    # vae_tile: windows over time in waveform samples (a multiple of the hop), the shared 1D rule.
    tiling = deploy_tiling(instance.deploy, vae.config.hop_length, unit="samples")

    def encode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        return conditioning(text, projection, request, device)

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        config = transformer.config
        noise, generator = initial_noise((1, config.in_channels, config.sample_size), request.seed)
        latents = (noise * sampler.init_noise_sigma).to(device)
        if request.init_audio is not None:  # its posterior sample, drawn next from the same generator, is added
            window = initial_window(request.init_audio, vae.config.audio_channels,
                                    config.sample_size * vae.config.hop_length)
            latents = vae.encode_sample(window.to(device), generator).float() + latents
        return {"latents": latents}

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        rate = vae.config.sampling_rate
        first, last = clip_samples(request, rate)
        waveform = vae.decode(slots["latents"].float(), tiling)[0, :, first:last]
        ctx.progress("decode", 1, 1)
        return {"audio": waveform.float().cpu(), "sample_rate": rate, "video": NO_FRAMES}

    guidance = guidance if guidance is not None else make_guidance(instance.deploy.cfg_mode)
    loop = StableAudioDenoiseLoop(transformer, sampler, instance.dtype, guidance)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds", "global_states"),
                 run=encode),
            Node("prepare_latents", reads=("request",), writes=("latents",), run=prepare_latents),
            Node("denoise", reads=("request", "latents", "prompt_embeds", "negative_embeds", "global_states"),
                 writes=("latents",), loop=loop),
            Node("decode", reads=("request", "latents"), writes=("audio", "sample_rate", "video"), run=decode),
        ),
        inputs=frozenset({"request"}),
        outputs=("video", "audio", "sample_rate"),
    )


def initial_window(audio: np.ndarray, channels: int, length: int) -> Tensor:
    """[1, channels, length]: the initial waveform in the model's channel layout (mono repeated, stereo
    averaged), cut or padded with silence to the model's window (StableAudioPipeline.prepare_latents)."""
    wave = torch.from_numpy(audio)[None]
    if wave.shape[1] == 1 and channels == 2:
        wave = wave.repeat(1, 2, 1)
    elif wave.shape[1] == 2 and channels == 1:
        wave = wave.mean(1, keepdim=True)
    window = wave.new_zeros((1, channels, length))
    keep = min(wave.shape[-1], length)
    window[:, :, :keep] = wave[:, :, :keep]
    return window


def clip_samples(request: GenerationRequest, sample_rate: int) -> tuple[int, int]:
    """The clip's first and end sample in the decoded window (the rule the request was checked by)."""
    return audio_clip_samples(float(request.option("seconds_start")), float(request.option("seconds")), sample_rate)


@torch.inference_mode()
def conditioning(text: StableAudioTextEncoder, projection: StableAudioProjection, request: GenerationRequest,
                 device: torch.device) -> dict[str, Tensor | None]:
    """Cross-attention tokens (text, then start and end seconds) per CFG branch, and the global token.

    As StableAudioPipeline builds them: with a negative prompt its tokens carry the same seconds; without
    one (None or empty) the unconditional branch is all zeros. Both branches share the global token.
    """
    start = float(request.option("seconds_start"))
    start_token, end_token = projection.seconds(start, start + float(request.option("seconds")), device)
    global_states = torch.cat([start_token, end_token], dim=2)  # [1, 1, 2 * dim]
    negative_prompt = request.negative_prompt or None
    cfg = request.uses_cfg
    prompts = [request.prompt] + ([negative_prompt] if cfg and negative_prompt is not None else [])
    embeds = text.encode(prompts)
    tokens = torch.cat([embeds, start_token.expand(len(prompts), -1, -1), end_token.expand(len(prompts), -1, -1)],
                       dim=1)
    negative = None
    if cfg:
        negative = tokens[1:] if negative_prompt is not None else torch.zeros_like(tokens[:1])
    return {"prompt_embeds": tokens[:1], "negative_embeds": negative, "global_states": global_states}
