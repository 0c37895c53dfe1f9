"""Wan's parity maps: our taps against WanPipeline, WanImageToVideoPipeline and WanVideoToVideoPipeline."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _wan_scheduler(base: Mapping[str, Any], request: GenerationRequest) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if request.sampler == "euler":
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=request.flow_shift)
    if request.sampler == "unipc":
        return UniPCMultistepScheduler.from_config(base, flow_shift=request.flow_shift)
    raise InvalidRequest("sampler", f"the WanPipeline reference runs unipc or euler, not {request.sampler!r}")


def _call_wan(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
              callback: dict[str, Any]) -> np.ndarray:
    pipe.scheduler = _wan_scheduler(scheduler, request)
    media = {}
    if request.image is not None:  # WanImageToVideoPipeline: the first frame (and the last one)
        media = {"image": request.image[0], "last_image": request.last_image}
    out = pipe(
        prompt=request.prompt, negative_prompt=request.negative_prompt, height=request.height, width=request.width,
        num_frames=request.num_frames, num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale, guidance_scale_2=request.option("guidance_scale_2"),
        generator=generator_for(request), output_type="np", **media, **callback,
    )
    return out.frames[0]  # [F, H, W, 3] in [0, 1], our decode layout on CPU


def _call_wan_v2v(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                  callback: dict[str, Any]) -> np.ndarray:
    pipe.scheduler = _wan_scheduler(scheduler, request)
    out = pipe(  # the frame count is the input video's
        video=list(request.video), prompt=request.prompt, negative_prompt=request.negative_prompt,
        height=request.height, width=request.width, num_inference_steps=request.num_inference_steps,
        strength=request.option("strength"), guidance_scale=request.guidance_scale, generator=generator_for(request),
        output_type="np", **callback,
    )
    return out.frames[0]



# The prompt reaches our DiT as every block's prepared keys/values (layers.prompt_kv), not as the embeddings the
# reference's call takes, so the text argument is not compared: the encoder's rows meet the blocks' outputs.
_WAN_OURS = {"latents": "latents", "timestep": "timestep"}
_WAN_THEIRS = {"hidden_states": "latents", "timestep": "timestep"}

WAN_T2V = FamilyParity(  # Wan2.1 T2V, Wan2.2 TI2V text-to-video and the A14B two-expert mixture
    pipeline="WanPipeline",
    our_inputs=_WAN_OURS,
    their_inputs=_WAN_THEIRS,
    blocks={"blocks": (BlockList("blocks"), BlockList("blocks"))},
    call=_call_wan,
    denoisers=("transformer", "transformer_2"),
    refused=("image", "last_image", "video"),  # video-to-video is WanVideoToVideoPipeline: no map yet
)

WAN_I2V = dataclasses.replace(  # Wan2.1 I2V / first-last-frame (CLIP tokens), Wan2.2 TI2V and A14B I2V
    WAN_T2V, pipeline="WanImageToVideoPipeline", refused=("video",),
    # Our image-conditioned network runs the DiT's stages with the request's CLIP tokens bound, never its
    # forward, so its arguments and prediction are not seen; the tokens reach every block's cross-attention.
    untapped=frozenset({"input", "output"}),
)

WAN_V2V = dataclasses.replace(  # a T2V folder given an input video; our step 0 is its first step run
    WAN_T2V, pipeline="WanVideoToVideoPipeline", call=_call_wan_v2v, denoisers=("transformer",),
    refused=("image", "last_image", "guidance_scale_2"),
)

PARITY = ParityMaps(pipelines=(WAN_T2V, WAN_I2V, WAN_V2V),
                    video_to_video={"WanPipeline": "WanVideoToVideoPipeline"})
