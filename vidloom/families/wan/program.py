"""The Wan program: encode text (and image) -> draw noise (and conditioning) -> denoise -> decode."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import GuidancePolicy, make_guidance
from vidloom.diffusion.noise import initial_noise
from vidloom.media.frames import to_uint8
from vidloom.models.wan.vae import WanVAE
from vidloom.layers.tiling import deploy_tiling
from vidloom.families.wan.conditioning import (
    WanPipelineConfig,
    encode_video,
    first_frame_condition,
    wan21_condition,
)
from vidloom.families.wan.loop import WanDenoiseLoop
from vidloom.models.wan.text import WanTextEncoder, encode_request_prompts


def build_program(instance: ModelInstance, guidance: GuidancePolicy | None = None) -> Program:
    """The T2V program over `instance`; `guidance` overrides deploy.cfg_mode (CFG-parallel workers pass theirs)."""
    text: WanTextEncoder = instance["text_encoder"]
    vae: WanVAE = instance["vae"]
    transformer = instance["transformer"]
    pipeline: WanPipelineConfig = instance.components.get("wan_pipeline", WanPipelineConfig())
    image_encoder = instance.components.get("image_encoder")  # Wan2.1 I2V checkpoints only
    tiling = deploy_tiling(instance.deploy, vae.config.spatial_factor)

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return encode_request_prompts(text, slots["request"])

    def encode_image(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        if image_encoder is None or request.image is None:
            return {"image_embeds": None}
        first = request.image[0]  # resolve_request makes image a tuple; I2V takes exactly one
        images = [first] if request.last_image is None else [first, request.last_image]
        return {"image_embeds": image_encoder.encode(images)}

    def prepare_condition(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        if request.image is None:
            return {"condition": None, "frame_mask": None}
        if pipeline.expand_timesteps:
            latent_frames = vae.config.latent_frames(request.num_frames)
            condition, mask = first_frame_condition(vae, request.image[0], latent_frames, request.height, request.width)
            return {"condition": condition.to(instance.device), "frame_mask": mask.to(instance.device)}
        condition = wan21_condition(
            vae, request.image[0], request.last_image, request.num_frames, request.height, request.width
        )
        return {"condition": condition.to(instance.device), "frame_mask": None}

    def prepare_video(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        if request.video is None:
            return {"video_latents": None}
        latents = encode_video(vae, request.video, request.height, request.width)
        return {"video_latents": latents.to(instance.device)}

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        noise, generator = initial_noise(vae.config.latent_shape(request.num_frames, request.height, request.width),
                                         request.seed)
        # The same generator goes on to the loop: stochastic samplers (DMD's re-noising) continue its stream.
        return {"latents": noise.to(instance.device), "generator": generator}

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        vae_dtype = next(vae.parameters()).dtype
        latents = vae.denormalize_latents(slots["latents"].to(vae_dtype))
        video = vae.decode(latents, progress=lambda done, total: ctx.progress("decode", done, total), tiling=tiling)
        frames = (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)  # [F, H, W, 3]
        if frames.is_cuda:
            # uint8 on the device: a quarter of the bytes over PCIe and no CPU pass over the frames.
            # CPU keeps the float frames, which the parity tests compare with diffusers' output.
            return {"video": to_uint8(frames).cpu().numpy()}
        return {"video": frames.cpu().numpy()}

    # At load: an unknown mode fails before any request.
    guidance = guidance if guidance is not None else make_guidance(instance.deploy.cfg_mode)
    sampler_config = instance["sampler_config"]
    if instance.card.recipe.timesteps:  # a distilled checkpoint samples at the steps its recipe lists
        sampler_config = dataclasses.replace(sampler_config, dmd_timesteps=instance.card.recipe.timesteps)
    loop = WanDenoiseLoop(
        transformer, sampler_config, instance.dtype, guidance,
        transformer_2=instance.components.get("transformer_2"), pipeline=pipeline,
        placement=instance.components.get("expert_placement"),
    )
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("encode_image", reads=("request",), writes=("image_embeds",), run=encode_image),
            Node("prepare_condition", reads=("request",), writes=("condition", "frame_mask"), run=prepare_condition),
            Node("prepare_video", reads=("request",), writes=("video_latents",), run=prepare_video),
            Node("prepare_latents", reads=("request",), writes=("latents", "generator"), run=prepare_latents),
            Node(
                "denoise",
                reads=("request", "latents", "prompt_embeds", "negative_embeds", "image_embeds", "condition",
                       "frame_mask", "video_latents"),
                writes=("latents",),
                loop=loop,
            ),
            Node("decode", reads=("latents",), writes=("video",), run=decode),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )
