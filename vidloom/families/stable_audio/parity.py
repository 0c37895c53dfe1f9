"""Stable Audio Open's parity map against StableAudioPipeline."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.request import GenerationRequest
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _call_stable_audio(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                       callback: dict[str, Any]) -> dict[str, np.ndarray]:
    # StableAudioPipeline still takes the old per-step callback(step, timestep, latents).
    on_step_end = callback["callback_on_step_end"]
    media: dict[str, Any] = {}
    if request.init_audio is not None:  # our resolved request holds it as [channels, samples] at the VAE's rate
        media = {"initial_audio_waveforms": torch.from_numpy(np.asarray(request.init_audio))[None],
                 "initial_audio_sampling_rate": pipe.vae.sampling_rate}
    start = float(request.option("seconds_start"))
    out = pipe(
        request.prompt, negative_prompt=request.negative_prompt or None, audio_start_in_s=start,
        audio_end_in_s=start + float(request.option("seconds")), num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale, generator=generator_for(request), **media,
        callback=lambda step, timestep, latents: on_step_end(pipe, step, timestep, {"latents": latents}),
    )
    return {"decode.audio": out.audios[0].float().numpy()}  # [channels, samples], the clip our decode cuts


STABLE_AUDIO = FamilyParity(
    pipeline="StableAudioPipeline",
    # Our network runs the DiT's stages (embed -> blocks -> head) with the request's duration token bound,
    # never its forward: no input / prediction taps. The blocks see the same [B, 1 + T, dim] stream (the
    # global token first) on both sides.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks"), BlockList("transformer_blocks"))},
    call=_call_stable_audio,
    output="decode.audio",
    # The pipeline batches CFG as [uncond, cond] in one call; our default sequential CFG runs cond, then uncond.
    their_rows=(1, 0),
    untapped=frozenset({"input", "output"}),
    refused=("image", "last_image", "video", "sampler", "flow_shift"),
)

PARITY = ParityMaps(pipelines=(STABLE_AUDIO,))
