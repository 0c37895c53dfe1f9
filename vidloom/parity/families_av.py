"""Parity maps for Stable Audio Open (audio) and SANA-WM (camera-controlled world model, stage 1)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.request import GenerationRequest
from vidloom.parity.align import Tolerance
from vidloom.parity.family import FamilyParity, generator_for
from vidloom.parity.taps import BlockList


def _call_stable_audio(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                       callback: dict[str, Any]) -> dict[str, np.ndarray]:
    # StableAudioPipeline still takes the old per-step callback(step, timestep, latents).
    on_step_end = callback["callback_on_step_end"]
    media: dict[str, Any] = {}
    if request.init_audio is not None:  # our resolved request holds it as [channels, samples] at the VAE's rate
        media = {"initial_audio_waveforms": torch.from_numpy(np.asarray(request.init_audio))[None],
                 "initial_audio_sampling_rate": pipe.vae.sampling_rate}
    start = float(request.seconds_start)
    out = pipe(
        request.prompt, negative_prompt=request.negative_prompt or None, audio_start_in_s=start,
        audio_end_in_s=start + float(request.seconds), num_inference_steps=request.num_inference_steps,
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


def _call_sana_wm(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                  callback: dict[str, Any]) -> np.ndarray:
    from diffusers import FlowMatchEulerDiscreteScheduler

    # The request's flow shift replaces the scheduler's, as our stage 1 does (the card's default is the saved one).
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler, shift=float(request.flow_shift))
    camera = request.camera  # resolved: families.sana_wm.camera.CameraInput
    pose = {"action": camera.action} if camera.action is not None else {"c2w": camera.c2w}
    out = pipe(
        image=request.image[0], prompt=request.prompt, negative_prompt=request.negative_prompt,
        intrinsics=camera.intrinsics, height=request.height, width=request.width, num_frames=request.num_frames,
        num_inference_steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
        generator=generator_for(request), output_type="np", **pose, **callback,
    )
    return np.asarray(out.frames)  # [F, H, W, 3] in [0, 1]


SANA_WM = FamilyParity(  # stage 1 (the bidirectional DiT) and the LTX-2 VAE decode; the refiner is another pipeline
    pipeline="SanaWMPipeline",
    # Both sides batch CFG as [negative, positive] in one call; our network runs the DiT's stages with the
    # request's camera bound, never its forward: no input / prediction taps.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks"), BlockList("blocks"))},
    call=_call_sana_wm,
    loop="stage1",
    # The softmax blocks run bf16 SDPA on both sides; an ulp-level difference upstream can flip one bf16
    # rounding (observed up to 5.5e-5 of a block output's scale on the first tiny config, 7e-6 on the second).
    # 5e-4 stays ~8x under one bf16 ulp (3.9e-3) and far under a wrong op (> 1e-3, see the tests).
    tolerance=Tolerance(atol=1e-4, rtol=5e-4),
    untapped=frozenset({"input", "output"}),
    refused=("last_image", "video", "sampler"),
)
