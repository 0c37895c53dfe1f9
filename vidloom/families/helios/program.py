"""The Helios program: encode text -> seed the noise stream (and encode the first frame or the clip, or noise the
extended video's latents) -> the chunk rollout (each chunk denoised, decoded and streamed in turn)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.live_prompt import LIVE_PROMPTS
from vidloom.core.request import GenerationRequest
from vidloom.core.program import Node, NodeContext, Program
from vidloom.diffusion.guidance import GuidancePolicy, make_guidance
from vidloom.core.session import EXTEND_FROM, VideoSession
from vidloom.families.helios.conditioning import continue_latents, encode_context_video, encode_first_frame, pixels
from vidloom.families.helios.dmd_loop import HeliosDMDLoop
from vidloom.families.helios.loop import CHUNK_LATENT_FRAMES, HeliosChunkLoop, chunk_frames
from vidloom.families.helios.pyramid_loop import HeliosPyramidLoop
from vidloom.families.helios.schedule import PYRAMID, PyramidSettings
from vidloom.layers.tiling import deploy_tiling
from vidloom.models.wan.vae import WanVAE
from vidloom.models.wan.text import WanTextEncoder, encode_request_prompts


def build_program(instance: ModelInstance, guidance: GuidancePolicy | None = None) -> Program:
    text: WanTextEncoder = instance["text_encoder"]
    vae: WanVAE = instance["vae"]

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return encode_request_prompts(text, slots["request"])

    def prepare(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        """The request's noise stream, and the conditioning on a first image or a clip, drawn from it first."""
        request: GenerationRequest = slots["request"]
        generator = torch.Generator("cpu").manual_seed(request.seed)
        window = chunk_frames(vae.config.temporal_factor)
        source = request.option(EXTEND_FROM)
        if isinstance(source, VideoSession):  # an extension: the source's latents, not re-encoded
            conditioning = continue_latents(source.latents, CHUNK_LATENT_FRAMES, generator, instance.device)
        elif request.video is not None:
            video = pixels(list(request.video), request.width, request.height)
            conditioning = encode_context_video(vae, video, window, generator, instance.device)
        elif request.image:
            image = pixels([request.image[0]], request.width, request.height)
            conditioning = encode_first_frame(vae, image, window, generator, instance.device)
        else:
            return {"generator": generator, "conditioning": None}
        ctx.progress("encode_context", 1, 1)
        return {"generator": generator, "conditioning": conditioning}

    policy = guidance if guidance is not None else make_guidance(instance.deploy.cfg_mode)
    args = (instance["transformer"], instance["vae"], instance["schedule"], instance.dtype, policy, instance.device,
            text, instance[LIVE_PROMPTS], deploy_tiling(instance.deploy, vae.config.spatial_factor))
    pyramid: PyramidSettings = instance[PYRAMID]
    if pyramid.distilled:
        loop: HeliosChunkLoop = HeliosDMDLoop(*args)
    elif pyramid.enabled:
        loop = HeliosPyramidLoop(*args, zero_star=pyramid.zero_star)
    else:
        loop = HeliosChunkLoop(*args)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("prepare", reads=("request",), writes=("generator", "conditioning"), run=prepare),
            Node("chunks", reads=("request", "prompt_embeds", "negative_embeds", "generator", "conditioning"),
                 writes=("video", "session"), loop=loop),
        ),
        inputs=frozenset({"request"}),
        outputs=("video", "session"),
    )
