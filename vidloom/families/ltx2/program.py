"""The LTX-2 program: text -> stage 1 (joint video + audio denoise) -> [upsample -> stage 2] -> video and audio decode.

Slots: prompt_text / negative_text (LTX2Text), video_latents / audio_latents (packed, normalised),
layout (LTX2Layout), generator (the request's one CPU generator, drawn from in the pipeline's order),
the two-stage program's `upsampled` (raw VAE-space latents at the new size), then video (frames in [0, 1]), audio (float32 [channels, samples]) and sample_rate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.av_guidance import AudioVideoGuidance, AudioVideoScales, SplitAudioVideoGuidance
from vidloom.diffusion.guidance import ParallelCFG
from vidloom.media.frames import to_uint8
from vidloom.models.ltx2.upsampler import upsample_latents
from vidloom.layers.tiling import deploy_tiling
from vidloom.families.ltx2.latents import LTX2Geometry, image_pixels, noised, pack_audio, recompress, unpack_audio
from vidloom.families.ltx2.loop import STAGE2_LORA, LTX2DenoiseLoop
from vidloom.families.ltx2.schedule import LTX2Schedule
from vidloom.families.ltx2.settings import LTX2Settings


def build_program(instance: ModelInstance, guidance: AudioVideoGuidance | ParallelCFG | None = None) -> Program:
    """`guidance`: how a step's guidance passes run; a --cfg-parallel rank group's ParallelCFG spreads every pass
    (cond, uncond, STG, isolated) over the group (SplitAudioVideoGuidance)."""
    settings: LTX2Settings = instance["settings"]
    transformer, vae, audio_vae = instance["transformer"], instance["vae"], instance["audio_vae"]
    tiling = deploy_tiling(instance.deploy, vae.spatial_compression_ratio)  # vae_tile: diffusers' enable_tiling rule
    geometry = LTX2Geometry.of(transformer.config, vae, audio_vae)
    schedule: LTX2Schedule = instance["schedule"]
    upsampler = instance.components.get("upsampler")
    two_stage = upsampler is not None
    device, dtype = instance.device, instance.dtype

    def stage1_scales(request: GenerationRequest) -> AudioVideoScales:
        return dataclasses.replace(settings.stage1, video_cfg=float(request.guidance_scale))

    def any_cfg(request: GenerationRequest) -> bool:
        return stage1_scales(request).cfg or (two_stage and settings.stage2.cfg)

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        text = instance["text_encoder"]
        if not any_cfg(request):
            return {"prompt_text": text.encode([request.prompt]), "negative_text": None}
        both = text.encode([request.negative_prompt or "", request.prompt])  # the pipeline's [negative, prompt]
        neg, pos = (dataclasses.replace(both, video=both.video[i:i + 1], audio=both.audio[i:i + 1],
                                        mask=both.mask[i:i + 1]) for i in (0, 1))
        return {"prompt_text": pos, "negative_text": neg}

    def prepare(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        generator = torch.Generator("cpu").manual_seed(request.seed)
        fps = float(request.fps) / settings.motion_speed
        image = request.image[0] if request.image else None
        if image is None:
            layout = geometry.layout(request.num_frames, request.height, request.width, fps)
            video = geometry.video_noise(layout, generator)
        else:
            video, layout = _first_frame_latents(image, request, fps, generator)
        audio = geometry.audio_noise(layout, generator)
        return {"video_latents": video.to(device), "audio_latents": audio.to(device), "layout": layout,
                "generator": generator}

    def _first_frame_latents(image: Any, request: GenerationRequest, fps: float, generator: torch.Generator):
        # LTX2ImageToVideoPipeline: the image's latent (mode), normalised without the scaling factor, fills
        # frame 0 (kept clean: timestep 0, never stepped); the other frames start from noise.
        image = recompress(image, settings.image_crf)
        pixels = image_pixels(image, request.height, request.width).to(device=device, dtype=torch.float32)
        encoded = vae.normalize_latents(vae.encode(pixels.unsqueeze(2)), scaling_factor=1.0)
        layout = geometry.layout(request.num_frames, request.height, request.width, fps)
        first = encoded.cpu().repeat(1, 1, layout.frames, 1, 1)
        mask = torch.zeros((1, 1, layout.frames, layout.height, layout.width))
        mask[:, :, 0] = 1.0
        noise = torch.randn(first.shape, generator=generator, dtype=torch.float32)
        video = geometry.pack(first * mask + noise * (1 - mask))
        frozen = geometry.pack(mask).squeeze(-1)
        return video, dataclasses.replace(layout, frozen=frozen.to(device))

    def upsample(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        layout = slots["layout"]
        # Stage 1's output as the pipeline returns it (output_type="latent": raw VAE latents), upsampled raw.
        raw = vae.denormalize_latents(geometry.unpack(slots["video_latents"], layout))
        big = upsample_latents(upsampler, vae, raw, normalized=False, renormalize=False)
        fps = float(request.fps) / settings.motion_speed
        new = geometry.layout(request.num_frames, request.height, request.width, fps,
                              latent_size=(big.shape[3], big.shape[4]))
        ctx.progress("upsample", 1, 1)
        return {"upsampled": big, "layout": new}

    def renoise(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        # Stage 2 takes the latents like LTX2Pipeline takes `latents=` / `audio_latents=`: normalise,
        # pack, then noise both to the first refinement sigma (video drawn first, then audio).
        generator: torch.Generator = slots["generator"]
        scale = settings.stage2_sigmas[0]
        video = geometry.pack(vae.normalize_latents(slots["upsampled"])).cpu()
        raw_audio = audio_vae.denormalize(slots["audio_latents"])  # stage 1's audio output, packed again
        audio = audio_vae.normalize(pack_audio(unpack_audio(raw_audio, geometry.audio_mel_bins))).cpu()
        return {"video_latents": noised(video, scale, generator).to(device),
                "audio_latents": noised(audio, scale, generator).to(device)}

    def decode_video(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        latents = geometry.unpack(slots["video_latents"], slots["layout"]).to(torch.float32)
        video = vae.decode_normalized(latents, settings.decode_timestep, None, slots["generator"], tiling)
        frames = (video[0].float() / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)  # [F, H, W, 3]
        ctx.progress("decode", 1, 1)
        return {"video": to_uint8(frames).cpu().numpy() if frames.is_cuda else frames.cpu().numpy()}

    def decode_audio(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        packed = audio_vae.denormalize(slots["audio_latents"].float())
        mel = audio_vae.decode(unpack_audio(packed, geometry.audio_mel_bins))
        with torch.inference_mode():
            waveform = instance["vocoder"](mel)[0]
        ctx.progress("audio", 1, 1)
        return {"audio": waveform.float().cpu().numpy().astype(np.float32),
                "sample_rate": int(instance["vocoder"].sample_rate)}

    if isinstance(guidance, ParallelCFG):
        guidance = SplitAudioVideoGuidance(guidance.pair)
    guidance = guidance or AudioVideoGuidance()
    stage2_schedule = dataclasses.replace(schedule, dynamic=False, terminal=None)
    stage1 = LTX2DenoiseLoop(
        "stage1", transformer, dtype, lambda r, n: schedule.sigmas(r.num_inference_steps, n), stage1_scales,
        settings.use_cross_timestep, schedule.num_train_timesteps, guidance)
    stage2 = LTX2DenoiseLoop(
        "stage2", transformer, dtype, lambda r, n: stage2_schedule.sigmas(0, n, list(settings.stage2_sigmas)),
        lambda r: settings.stage2, settings.use_cross_timestep, schedule.num_train_timesteps, guidance,
        stage_lora=instance.components.get(STAGE2_LORA))
    latents = ("video_latents", "audio_latents")
    loop_reads = ("request", *latents, "layout", "prompt_text", "negative_text")
    nodes = [
        Node("encode_text", reads=("request",), writes=("prompt_text", "negative_text"), run=encode_text),
        Node("prepare_latents", reads=("request",), writes=(*latents, "layout", "generator"), run=prepare),
        Node("stage1", reads=loop_reads, writes=latents, loop=stage1),
    ]
    if two_stage:
        nodes += [
            Node("upsample", reads=("request", "video_latents", "layout"), writes=("upsampled", "layout"),
                 run=upsample),
            Node("renoise", reads=("upsampled", "audio_latents", "generator"), writes=latents, run=renoise),
            Node("stage2", reads=loop_reads, writes=latents, loop=stage2),
        ]
    nodes += [
        Node("decode_video", reads=("video_latents", "layout", "generator"), writes=("video",), run=decode_video),
        Node("decode_audio", reads=("audio_latents",), writes=("audio", "sample_rate"), run=decode_audio),
    ]
    return Program(nodes=tuple(nodes), inputs=frozenset({"request"}), outputs=("video", "audio", "sample_rate"))
