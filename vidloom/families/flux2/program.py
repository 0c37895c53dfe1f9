"""The Flux2 Klein program: encode text -> (encode reference images) -> draw noise -> denoise -> decode."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import GuidancePolicy, make_guidance
from vidloom.diffusion.noise import initial_noise
from vidloom.layers.tiling import deploy_tiling
from vidloom.media.frames import to_uint8
from vidloom.families.flux2.vae import Flux2VAE
from vidloom.families.flux2.loop import Flux2DenoiseLoop, Flux2Tokens
from vidloom.families.flux2.text import Flux2TextEncoder

# The pipeline shrinks reference images above this many pixels (keeping the aspect ratio) before encoding.
MAX_REFERENCE_AREA = 1024 * 1024
# Reference image i sits at time coordinate 10 + 10 i in the rotary ids (Flux2KleinPipeline._prepare_image_ids).
REFERENCE_TIME_SCALE = 10


def build_program(instance: ModelInstance, guidance: GuidancePolicy | None = None) -> Program:
    text: Flux2TextEncoder = instance["text_encoder"]
    vae: Flux2VAE = instance["vae"]
    transformer = instance["transformer"]
    channels = transformer.config.in_channels
    multiple = instance.card.geometry.spatial_multiple
    distilled = bool(instance["distilled"])
    device = instance.device
    tiling = deploy_tiling(instance.deploy, vae.config.spatial_factor)  # vae_tile: the shared 2D tiling rule

    def uses_cfg(request: GenerationRequest) -> bool:
        return request.uses_cfg and not distilled  # step-distilled Klein ignores guidance

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        if not uses_cfg(request):
            return {"prompt_embeds": text.encode([request.prompt]), "negative_embeds": None}
        # The Klein pipeline's negative prompt is always "" (the card's default); ours may be set.
        both = text.encode([request.prompt, request.negative_prompt or ""])
        return {"prompt_embeds": both[:1], "negative_embeds": both[1:]}

    def encode_images(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        latents = []
        for i, img in enumerate(request.image or ()):
            pixels = reference_pixels(img, multiple).to(device)
            with torch.inference_mode():
                latents.append(vae.encode(pixels))
            ctx.progress("encode_image", i + 1, len(request.image))
        return {"references": latents}

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        h, w = request.height // multiple, request.width // multiple
        noise, _ = initial_noise((1, channels, h, w), request.seed)  # then packed into tokens
        packed = noise.flatten(2).transpose(1, 2).to(device)  # [1, h*w, C]
        tokens = token_layout(h, w, slots["prompt_embeds"].shape[1], slots.get("references") or [], device)
        return {"latents": packed, "tokens": tokens}

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        h, w = request.height // multiple, request.width // multiple
        latents: Tensor = slots["latents"]
        grid = latents.transpose(1, 2).reshape(latents.shape[0], -1, h, w).float()
        image = vae.decode(grid, tiling)
        frames = (image.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)  # [1, H, W, 3]
        ctx.progress("decode", 1, 1)
        if frames.is_cuda:
            return {"video": to_uint8(frames).cpu().numpy()}
        return {"video": frames.cpu().numpy()}

    guidance = guidance if guidance is not None else make_guidance(instance.deploy.cfg_mode)
    loop = Flux2DenoiseLoop(transformer, instance["schedule"], instance.dtype, guidance)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("encode_images", reads=("request",), writes=("references",), run=encode_images,
                 when=lambda r: bool(r.image)),
            Node("prepare_latents_refs", reads=("request", "prompt_embeds", "references"),
                 writes=("latents", "tokens"), run=prepare_latents, when=lambda r: bool(r.image)),
            Node("prepare_latents", reads=("request", "prompt_embeds"), writes=("latents", "tokens"),
                 run=prepare_latents, when=lambda r: not r.image),
            Node("denoise", reads=("request", "latents", "tokens", "prompt_embeds", "negative_embeds"),
                 writes=("latents",), loop=loop),
            Node("decode", reads=("request", "latents"), writes=("video",), run=decode),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )


def token_layout(h: int, w: int, text_len: int, references: list[Tensor], device: torch.device) -> Flux2Tokens:
    """Rotary ids (t, h, w, l) of target tokens, then each reference image's, plus text ids."""
    zero = torch.arange(1)
    target = torch.cartesian_prod(zero, torch.arange(h), torch.arange(w), zero)
    refs = [
        torch.cartesian_prod(torch.tensor([REFERENCE_TIME_SCALE * (i + 1)]), torch.arange(r.shape[2]),
                             torch.arange(r.shape[3]), zero)
        for i, r in enumerate(references)
    ]
    txt = torch.cartesian_prod(zero, zero, zero, torch.arange(text_len))
    packed = torch.cat([r.flatten(2).transpose(1, 2) for r in references], dim=1) if references else None
    layout = (h, w, text_len, tuple(tuple(r.shape[2:]) for r in references))
    return Flux2Tokens(img_ids=torch.cat([target, *refs]).to(device), txt_ids=txt.to(device),
                       num_target=h * w, references=packed, layout=layout)


def reference_pixels(img: Image.Image, multiple: int) -> Tensor:
    """[1, 3, H, W] in [-1, 1]: the Klein pipeline's reference preprocessing, step by step (for parity):
    shrink to 1 MP if larger, floor each side to `multiple`, resize-and-center-crop (Lanczos)."""
    if img.width * img.height > MAX_REFERENCE_AREA:
        scale = math.sqrt(MAX_REFERENCE_AREA / (img.width * img.height))
        img = img.resize((int(img.width * scale), int(img.height * scale)), Image.Resampling.LANCZOS)
    width, height = img.width // multiple * multiple, img.height // multiple * multiple
    ratio, src_ratio = width / height, img.width / img.height
    src_w = width if ratio > src_ratio else img.width * height // img.height
    src_h = height if ratio <= src_ratio else img.height * width // img.width
    resized = img.resize((src_w, src_h), resample=Image.Resampling.LANCZOS)
    canvas = Image.new("RGB", (width, height))
    canvas.paste(resized, box=(width // 2 - src_w // 2, height // 2 - src_h // 2))
    array = np.asarray(canvas, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)[None] * 2.0 - 1.0
