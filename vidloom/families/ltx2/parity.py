"""LTX-2's parity maps: LTX2Pipeline, its image-to-video pipeline and the two-stage chain."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from vidloom.core.request import GenerationRequest
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _call_ltx2(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
               callback: dict[str, Any]) -> dict[str, np.ndarray]:
    # The pipeline's own guidance defaults are our card's (families/ltx2/settings.py); the request sets video CFG.
    out = pipe(
        prompt=request.prompt, negative_prompt=request.negative_prompt, height=request.height, width=request.width,
        num_frames=request.num_frames, frame_rate=float(request.fps), num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale, generator=generator_for(request), output_type="np", **callback,
    )
    return {"decode_video.video": out.frames[0], "decode_audio.audio": out.audio[0].float().numpy()}


def _call_ltx2_i2v(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                   callback: dict[str, Any]) -> dict[str, np.ndarray]:
    from vidloom.families.ltx2.settings import LTX2Settings

    # The first frame is re-encoded at our card's CRF (the pipeline's own default depends on its text encoder).
    out = pipe(
        image=request.image[0], image_crf=LTX2Settings().image_crf, prompt=request.prompt,
        negative_prompt=request.negative_prompt, height=request.height, width=request.width,
        num_frames=request.num_frames, frame_rate=float(request.fps), num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale, generator=generator_for(request), output_type="np", **callback,
    )
    return {"decode_video.video": out.frames[0], "decode_audio.audio": out.audio[0].float().numpy()}


def _call_ltx2_two_stage(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                         callback: dict[str, Any]) -> dict[str, np.ndarray]:
    """The chain diffusers documents: LTX2Pipeline (latents) -> LTX2LatentUpsamplePipeline -> LTX2Pipeline again on
    the upsampled latents at twice the size, the distilled sigmas and no CFG (our card's stage-2 defaults)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    from vidloom.families.ltx2.settings import LTX2Settings

    next_stage = callback.pop("next_stage")
    settings = LTX2Settings()
    generator = generator_for(request)  # one generator through the chain, as the documented recipe
    common = dict(prompt=request.prompt, negative_prompt=request.negative_prompt, num_frames=request.num_frames,
                  frame_rate=float(request.fps), generator=generator, **callback)
    video, audio = pipe(height=request.height, width=request.width, num_inference_steps=request.num_inference_steps,
                        guidance_scale=request.guidance_scale, output_type="latent", return_dict=False, **common)
    # The upsampler is the folder's latent_upsampler/ (what our two_stage deploy loads).
    upsampler = LTX2LatentUpsamplerModel.from_pretrained(f"{pipe.config._name_or_path}/latent_upsampler")
    upsampler = upsampler.to(pipe.device)
    upsampled = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=upsampler)(
        latents=video, output_type="latent", return_dict=False)[0]
    saved = pipe.scheduler
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler, use_dynamic_shifting=False,
                                                                 shift_terminal=None)
    sigmas = list(settings.stage2_sigmas)
    next_stage()
    try:
        frames, waveform = pipe(latents=upsampled, audio_latents=audio, height=2 * request.height,
                                width=2 * request.width, num_inference_steps=len(sigmas), sigmas=sigmas,
                                noise_scale=sigmas[0], guidance_scale=settings.stage2.video_cfg, output_type="np",
                                return_dict=False, **common)
    finally:
        pipe.scheduler = saved
    return {"decode_video.video": frames[0], "decode_audio.audio": waveform[0].float().numpy()}



def _ltx2_idle_stg(transformer: Any, kwargs: Mapping[str, Any]) -> bool:
    """The pipeline's STG pass where it perturbs no block (a checkpoint without perturbed_attn, or block indices past
    the last): equal to its conditional pass, so our loop does not run it (families.ltx2.loop)."""
    blocks = kwargs.get("spatio_temporal_guidance_blocks") or ()
    if not blocks or kwargs.get("isolate_modalities"):
        return False
    layers = len(transformer.transformer_blocks)
    return not (transformer.config.perturbed_attn and any(0 <= b < layers for b in blocks))


LTX2_T2V = FamilyParity(
    pipeline="LTX2Pipeline",
    # Our guidance passes run the transformer's stages (embed -> blocks -> head), never its forward, so its
    # arguments and velocities are not seen; each pass (the CFG pair batched, STG where it perturbs a block,
    # modality isolation, in the pipeline's order) is a call from its first block on.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks", ("video", "audio")),
                       BlockList("transformer_blocks", ("video", "audio")))},
    call=_call_ltx2,
    output="decode_video.video",
    loop="stage1",
    state_latents="video",  # packed video tokens [1, N, C], as the pipeline's callback `latents`
    untapped=frozenset({"input", "output"}),
    their_skipped=_ltx2_idle_stg,
    # Image-to-video is LTX2_I2V; the two-stage chain is three pipelines: no map yet.
    refused=("image", "last_image", "video", "sampler", "flow_shift"),
)

LTX2_TWO_STAGE = dataclasses.replace(  # DeployConfig(two_stage=True): generate, upsample 2x, refine
    LTX2_T2V, call=_call_ltx2_two_stage, stages=("stage1", "stage2"), deploy={"two_stage": True},
)

LTX2_I2V = dataclasses.replace(  # an LTX2Pipeline folder given a first frame: its components in the I2V pipeline
    LTX2_T2V, pipeline="LTX2ImageToVideoPipeline", call=_call_ltx2_i2v,
    refused=("last_image", "video", "sampler", "flow_shift"),
)

PARITY = ParityMaps(pipelines=(LTX2_T2V, LTX2_I2V), image_to_video={"LTX2Pipeline": "LTX2ImageToVideoPipeline"},
                    two_stage={"LTX2Pipeline": LTX2_TWO_STAGE})
