"""The AnyFlow-FAR program: encode text -> draw noise -> encode the I2V/V2V context -> rollout (decoding per chunk)."""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.core.session import VideoSession
from vidloom.diffusion.guidance import ParallelCFG
from vidloom.diffusion.noise import initial_noise
from vidloom.layers.tiling import deploy_tiling
from vidloom.media.image import fit_image
from vidloom.models.wan.vae import WanVAE
from vidloom.families.wan_causal.transformer import FarTransformer
from vidloom.models.wan.text import WanTextEncoder, encode_prompt_pair, encode_request_prompts
from vidloom.families.wan_causal.loop import FarRolloutLoop


def build_program(instance: ModelInstance, kv_cache: bool = True, decode: bool = True,
                  guidance: ParallelCFG | None = None) -> Program:
    """T2V / I2V / V2V over `instance`.

    `kv_cache=False` recomputes every step from scratch (same frames, slower); `decode=False`
    stops at the latents (benchmarks and tests of the rollout alone). `guidance`: a --cfg-parallel rank pair's
    ParallelCFG (this rank runs one CFG branch); None runs both branches as one batch, as the reference does.
    """
    text: WanTextEncoder = instance["text_encoder"]
    vae: WanVAE = instance["vae"]
    transformer: FarTransformer = instance["transformer"]

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return encode_request_prompts(text, slots["request"])

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        # The whole video's noise at once, as the reference draws it (the load checked in_channels == z_dim).
        noise, _ = initial_noise(vae.config.latent_shape(request.num_frames, request.height, request.width),
                                 request.seed)
        return {"latents": noise.to(instance.device)}

    def encode_context(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        """I2V frame / V2V clip -> normalised latents [1, C, T, h, w] the rollout continues from (None: T2V)."""
        request: GenerationRequest = slots["request"]
        if isinstance(request.option("extend_from"), VideoSession):  # the source's own latents: no VAE round trip
            return {"context_latents": request.option("extend_from").latents.to(instance.device)}
        images = request.video if request.video is not None else request.image  # RGB PIL images
        if images is None:
            return {"context_latents": None}
        size = (request.width, request.height)  # resized with Lanczos as diffusers' PIL preprocessing does
        frames = np.stack([np.asarray(fit_image(image, size), dtype=np.uint8) for image in images])  # [F, H, W, 3]
        vae_dtype = next(vae.parameters()).dtype
        pixels = torch.from_numpy(frames).to(instance.device).permute(3, 0, 1, 2)  # [3, F, H, W] uint8
        video = (pixels.float() / 255.0 * 2.0 - 1.0)[None].to(vae_dtype)  # [1, 3, F, H, W] in [-1, 1]
        # The distribution's mean, not a sample: the reference conditions on the mode.
        return {"context_latents": vae.normalize_latents(vae.encode(video).mean.float())}

    # The loop decodes each chunk as it finishes (frames reach the caller early) and writes "video".
    loop = FarRolloutLoop(transformer, instance["sampler_config"], instance.dtype, kv_cache=kv_cache,
                          vae=vae if decode else None, text_encode=partial(encode_prompt_pair, text),
                          tiling=deploy_tiling(instance.deploy, vae.config.spatial_factor),
                          pair=guidance.pair if guidance is not None else None)
    outputs = ("video", "session") if decode else ("latents",)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("prepare_latents", reads=("request",), writes=("latents",), run=prepare_latents),
            Node("encode_context", reads=("request",), writes=("context_latents",), run=encode_context),
            Node(
                "rollout",
                reads=("request", "latents", "prompt_embeds", "negative_embeds", "context_latents"),
                writes=("latents", "video", "session") if decode else ("latents", "session"),
                loop=loop,
            ),
        ),
        inputs=frozenset({"request"}),
        outputs=outputs,
    )
