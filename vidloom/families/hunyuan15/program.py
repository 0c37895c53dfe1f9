"""The HunyuanVideo-1.5 text-to-video program: encode the prompt (and the negative one where the guider runs CFG)
-> draw noise -> denoise -> decode (HunyuanVideo15Pipeline's order)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.noise import initial_noise
from vidloom.media.frames import to_uint8
from vidloom.families.hunyuan15.cards import LatentGeometry
from vidloom.families.hunyuan15.loop import Hunyuan15DenoiseLoop, Hunyuan15Inputs
from vidloom.families.hunyuan15.schedule import Hunyuan15Guider
from vidloom.families.hunyuan15.text import Hunyuan15TextEncoder

NEGATIVE_PROMPT = " "  # a missing negative prompt: the pipeline's "" written into the template as " "


def uses_cfg(guider: Hunyuan15Guider, request: GenerationRequest) -> bool:
    """Whether any step runs the unconditional branch (the guider's num_conditions > 1 at some step)."""
    steps = request.num_inference_steps
    return any(guider.cfg_at(i, steps, float(request.guidance_scale)) for i in range(steps))


def build_program(instance: ModelInstance) -> Program:
    text: Hunyuan15TextEncoder = instance["text_encoder"]
    transformer = instance["transformer"]
    guider: Hunyuan15Guider = instance["guider"]
    latent: LatentGeometry = instance["latent_geometry"]
    spatial, temporal, channels, scaling = latent.spatial, latent.temporal, latent.channels, latent.scaling
    device = instance.device

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        negative = None
        if uses_cfg(guider, request):
            prompt, negative = text.encode([request.prompt, request.negative_prompt or NEGATIVE_PROMPT])
        else:
            (prompt,) = text.encode([request.prompt])
        return {"prompt_embeds": prompt, "negative_embeds": negative}

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        shape = (1, channels, (request.num_frames - 1) // temporal + 1, request.height // spatial,
                 request.width // spatial)
        noise, _ = initial_noise(shape, request.seed)
        # Text to video: zero condition latents and a zero mask channel; no image tokens.
        condition = torch.zeros(1, channels + 1, *shape[2:], device=device)
        return {"latents": noise.to(device), "inputs": Hunyuan15Inputs(condition)}

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        vae = instance["vae"]
        vae_dtype = next(vae.parameters()).dtype
        with torch.inference_mode():
            video = vae.decode((slots["latents"] / scaling).to(vae_dtype))
        frames = (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)  # [F, H, W, 3]
        ctx.progress("decode", 1, 1)
        return {"video": to_uint8(frames).cpu().numpy() if frames.is_cuda else frames.cpu().numpy()}

    loop = Hunyuan15DenoiseLoop(transformer, instance["schedule"], guider, instance.dtype)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("prepare_latents", reads=("request",), writes=("latents", "inputs"), run=prepare_latents),
            Node("denoise", reads=("request", "latents", "inputs", "prompt_embeds", "negative_embeds"),
                 writes=("latents",), loop=loop),
            Node("decode", reads=("request", "latents"), writes=("video",), run=decode),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )
