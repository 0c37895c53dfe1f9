"""Per-family name maps from our taps to the reference pipeline's modules, and how to call it.

Keyed by the diffusers pipeline class a checkpoint folder names (model_index.json), since
that pipeline is the reference for the folder. Our tap names are the canonical ones: the
reference's block lists and forward arguments are recorded under them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.parity.families_av import SANA_WM, STABLE_AUDIO
from vidloom.parity.families_omni import QWEN_OMNI
from vidloom.parity.family import FamilyParity, SequenceParity, generator_for
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
        guidance_scale=request.guidance_scale, guidance_scale_2=request.guidance_scale_2,
        generator=generator_for(request), output_type="np", **media, **callback,
    )
    return out.frames[0]  # [F, H, W, 3] in [0, 1], our decode layout on CPU


def _call_wan_v2v(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                  callback: dict[str, Any]) -> np.ndarray:
    pipe.scheduler = _wan_scheduler(scheduler, request)
    out = pipe(  # the frame count is the input video's
        video=list(request.video), prompt=request.prompt, negative_prompt=request.negative_prompt,
        height=request.height, width=request.width, num_inference_steps=request.num_inference_steps,
        strength=request.strength, guidance_scale=request.guidance_scale, generator=generator_for(request),
        output_type="np", **callback,
    )
    return out.frames[0]


def _call_flux2_klein(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                      callback: dict[str, Any]) -> np.ndarray:
    out = pipe(
        prompt=request.prompt, image=list(request.image) if request.image else None, height=request.height,
        width=request.width, num_inference_steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
        generator=generator_for(request), output_type="np", **callback,
    )
    return np.asarray(out.images)  # [1, H, W, 3]: one frame, like our video slot


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


def _call_cosmos3(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                  callback: dict[str, Any]) -> np.ndarray:
    out = pipe(
        request.prompt, negative_prompt=request.negative_prompt, image=request.image[0] if request.image else None,
        num_frames=request.num_frames, height=request.height, width=request.width, fps=request.fps,
        num_inference_steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
        generator=generator_for(request), output_type="np", enable_safety_check=False, **callback,
    )
    return np.asarray(out.video)  # [F, H, W, 3]


def _call_far(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
              callback: dict[str, Any]) -> np.ndarray:
    from vidloom.families.wan_causal.loop import chunk_partition

    latent_frames = (int(request.num_frames) - 1) // pipe.vae_scale_factor_temporal + 1  # type: ignore[arg-type]
    partition = chunk_partition(latent_frames, tuple(pipe.transformer.config.chunk_partition))
    out = pipe(
        prompt=request.prompt, negative_prompt=request.negative_prompt, height=request.height, width=request.width,
        num_frames=request.num_frames, num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale, chunk_partition=list(partition), generator=generator_for(request),
        output_type="np", use_kv_cache=True, **callback,
    )
    return out.frames[0]


def _far_chunk_latents(state: Any) -> Any:
    """The chunk being generated; after its last step our loop has moved it into the video (and the next
    chunk's noise into `chunk_latents`), so it is read back from there."""
    if state.step > 0:
        return state.chunk_latents
    k = state.chunk - 1
    return state.latents[:, :, state.frame_starts[k]:state.frame_starts[k + 1]]


_WAN_OURS = {"latents": "latents", "timestep": "timestep", "text_embeds": "text_embeds"}
_WAN_THEIRS = {"hidden_states": "latents", "timestep": "timestep", "encoder_hidden_states": "text_embeds"}

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

FLUX2_KLEIN = FamilyParity(
    pipeline="Flux2KleinPipeline",
    # The position ids differ in layout (ours [N, 4] shared by the batch, theirs [B, N, 4]): not compared;
    # a wrong id shows at the first block anyway.
    our_inputs={"img": "img", "txt": "txt", "timestep": "timestep"},
    their_inputs={"hidden_states": "img", "encoder_hidden_states": "txt", "timestep": "timestep"},
    blocks={
        # The reference's double blocks return (text, image); ours the joint [text, image] stream, split here.
        "double_blocks": (BlockList("double_blocks", ("txt", "img"), split_by="text_tokens"),
                          BlockList("transformer_blocks", ("txt", "img"))),
        "single_blocks": (BlockList("single_blocks"), BlockList("single_transformer_blocks")),
    },
    call=_call_flux2_klein,
    # Klein encodes an empty negative prompt itself; sampler and shift are its own schedule's.
    refused=("negative_prompt", "video", "sampler", "flow_shift"),
)

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

COSMOS3 = FamilyParity(  # text-to-image/video and image-to-video through the generation pathway
    pipeline="Cosmos3OmniPipeline",
    # Our steps run only the generated tokens against the cached text prefix (the reference re-runs the
    # prefix each step), through the generator's stages, never a forward: no input / prediction taps. The
    # reference's mixture-of-transformers layers return (text, generated) streams; the generated one is ours.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks", ("gen",)), BlockList("layers", ("", "gen")))},
    call=_call_cosmos3,
    denoisers=("generator",),
    reference_denoisers=("transformer",),
    their_latents=lambda latents: latents[0],  # the pipeline steps a leading batch axis of one
    load_kwargs={"enable_safety_checker": False},
    untapped=frozenset({"input", "output"}),
    refused=("last_image", "video", "reason", "sound", "action", "sampler", "flow_shift"),
)

ANYFLOW_FAR = FamilyParity(  # causal chunk rollout with the KV cache (use_kv_cache=True), text-to-video
    pipeline="AnyFlowFARPipeline",
    # Both sides batch the CFG branches as [uncond, cond] in one call per step; our step runs the network's
    # stages, not the transformer's forward: no input / prediction taps. Steps count across chunks.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks"), BlockList("blocks"))},
    call=_call_far,
    output="rollout.video",  # the rollout decodes chunk by chunk as it goes
    loop="rollout",
    state_latents=_far_chunk_latents,
    their_latents=lambda latents: latents.permute(0, 2, 1, 3, 4),  # [B, F, C, h, w] -> ours [B, C, F, h, w]
    step_call=lambda kwargs: not kwargs.get("kv_cache_flag", {}).get("is_cache_step", False),
    untapped=frozenset({"input", "output"}),
    refused=("image", "last_image", "video", "extend_from", "sampler", "flow_shift"),
)

FAMILIES: dict[str, FamilyParity] = {
    spec.pipeline: spec for spec in (WAN_T2V, WAN_I2V, WAN_V2V, FLUX2_KLEIN, LTX2_T2V, LTX2_I2V, COSMOS3, ANYFLOW_FAR,
                                     STABLE_AUDIO, SANA_WM)
}
"""Pipeline class -> its parity map."""
VIDEO_TO_VIDEO: dict[str, str] = {"WanPipeline": "WanVideoToVideoPipeline"}
"""A folder's pipeline -> the one diffusers runs video-to-video with on the same folder."""
IMAGE_TO_VIDEO: dict[str, str] = {"LTX2Pipeline": "LTX2ImageToVideoPipeline"}
TWO_STAGE: dict[str, FamilyParity] = {"LTX2Pipeline": LTX2_TWO_STAGE}
"""A folder's pipeline -> the map of its two-stage chain (our DeployConfig two_stage), by the same pipeline class."""
"""A folder's pipeline -> the one diffusers runs image-to-video with on the same folder's components."""
SEQUENCE_FAMILIES: dict[str, SequenceParity] = {spec.architecture: spec for spec in (QWEN_OMNI,)}
"""A transformers checkpoint's architecture (config.json) -> its autoregressive parity map."""
