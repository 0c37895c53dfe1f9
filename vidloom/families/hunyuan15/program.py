"""The HunyuanVideo-1.5 program: encode the first frame (image to video: cropped to its aspect bucket, SigLIP
tokens, VAE mode) -> encode the prompt (and the negative one where the guider runs CFG) -> draw noise -> denoise
-> decode (HunyuanVideo15Pipeline's and HunyuanVideo15ImageToVideoPipeline's order)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import TwoBranchCFG
from vidloom.diffusion.noise import initial_noise
from vidloom.layers.tiling import deploy_tiling
from vidloom.media.frames import to_uint8
from vidloom.families.hunyuan15.cards import LatentGeometry
from vidloom.families.hunyuan15.image import crop_to, pixels
from vidloom.families.hunyuan15.loop import Hunyuan15DenoiseLoop, Hunyuan15Inputs
from vidloom.families.hunyuan15.schedule import Hunyuan15Guider
from vidloom.families.hunyuan15.sizes import closest_bucket
from vidloom.families.hunyuan15.text import Hunyuan15TextEncoder

NEGATIVE_PROMPT = " "  # a missing negative prompt: the pipeline's "" written into the template as " "


def uses_cfg(guider: Hunyuan15Guider, request: GenerationRequest) -> bool:
    """Whether any step runs the unconditional branch (the guider's num_conditions > 1 at some step)."""
    steps = request.num_inference_steps
    return any(guider.cfg_at(i, steps, float(request.guidance_scale)) for i in range(steps))


def build_program(instance: ModelInstance, guidance: TwoBranchCFG | None = None) -> Program:
    """`guidance`: how the two CFG branches run (a --cfg-parallel rank pair's ParallelCFG); the guider combines."""
    text: Hunyuan15TextEncoder = instance["text_encoder"]
    transformer = instance["transformer"]
    guider: Hunyuan15Guider = instance["guider"]
    latent: LatentGeometry = instance["latent_geometry"]
    spatial, temporal, channels, scaling = latent.spatial, latent.temporal, latent.channels, latent.scaling
    device = instance.device
    target_size = transformer.config.target_size
    tiling = deploy_tiling(instance.deploy, spatial)  # vae_tile: encode and decode tile alike, as diffusers' VAE

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        negative = None
        if uses_cfg(guider, request):
            prompt, negative = text.encode([request.prompt, request.negative_prompt or NEGATIVE_PROMPT])
        else:
            (prompt,) = text.encode([request.prompt])
        return {"prompt_embeds": prompt, "negative_embeds": negative}

    def encode_image(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        source = request.image[0]
        # The request's size is the image's bucket: the pipeline ignores height and width in image to video.
        height, width = closest_bucket(source.height, source.width, target_size, spatial)
        image = crop_to(source, height, width)
        tokens = instance["image_encoder"].encode(image)
        vae = instance["vae"]
        with torch.inference_mode():
            first = vae.encode_mode(pixels(image)[:, :, None].to(device, next(vae.parameters()).dtype), tiling)
        ctx.progress("encode_image", 1, 1)
        return {"first_frame": (first.float() * scaling, tokens)}

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        first = slots.get("first_frame")
        height, width = (request.height, request.width) if first is None else (
            first[0].shape[-2] * spatial, first[0].shape[-1] * spatial)
        shape = (1, channels, (request.num_frames - 1) // temporal + 1, height // spatial, width // spatial)
        noise, _ = initial_noise(shape, request.seed)
        # Condition latents (the first frame's at frame 0, else zeros) and a mask channel (1 on frame 0 in image to
        # video); text to video: both zero and no image tokens.
        condition = torch.zeros(1, channels + 1, *shape[2:], device=device)
        if first is None:
            return {"latents": noise.to(device), "inputs": Hunyuan15Inputs(condition)}
        latents, tokens = first
        condition[:, :channels, :1] = latents.to(device)
        condition[:, channels, 0] = 1.0
        inputs = Hunyuan15Inputs(condition, tokens, meanflow=transformer.config.use_meanflow)
        return {"latents": noise.to(device), "inputs": inputs}

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        vae = instance["vae"]
        vae_dtype = next(vae.parameters()).dtype
        with torch.inference_mode():
            video = vae.decode((slots["latents"] / scaling).to(vae_dtype), tiling)
        frames = (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)  # [F, H, W, 3]
        ctx.progress("decode", 1, 1)
        return {"video": to_uint8(frames).cpu().numpy() if frames.is_cuda else frames.cpu().numpy()}

    loop = Hunyuan15DenoiseLoop(transformer, instance["schedule"], guider, instance.dtype, guidance)
    return Program(
        nodes=(
            Node("encode_image", reads=("request",), writes=("first_frame",), run=encode_image,
                 when=lambda r: bool(r.image)),
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("prepare_latents_i2v", reads=("request", "first_frame"), writes=("latents", "inputs"),
                 run=prepare_latents, when=lambda r: bool(r.image)),
            Node("prepare_latents", reads=("request",), writes=("latents", "inputs"), run=prepare_latents,
                 when=lambda r: not r.image),
            Node("denoise", reads=("request", "latents", "inputs", "prompt_embeds", "negative_embeds"),
                 writes=("latents",), loop=loop),
            Node("decode", reads=("request", "latents"), writes=("video",), run=decode),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )
