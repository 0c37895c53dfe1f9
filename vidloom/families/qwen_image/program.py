"""The Qwen-Image program: encode text (with the reference image when editing) -> encode the reference ->
draw noise -> denoise -> decode (QwenImagePipeline's and QwenImageEditPipeline's order)."""

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
from vidloom.layers.attention import ATTENTION_BACKENDS
from vidloom.layers.tiling import deploy_tiling
from vidloom.media.frames import to_uint8
from vidloom.models.wan.vae import WanVAE
from vidloom.families.qwen_image.guidance import NormRescaledCFG
from vidloom.families.qwen_image.loop import QwenImageDenoiseLoop, QwenImageLayout
from vidloom.families.qwen_image.text import QwenImageTextEncoder


EDIT_AREA = 1024 * 1024  # the edit pipelines VAE-encode references at about this many pixels
CONDITION_AREA = 384 * 384  # QwenImageEditPlusPipeline shows the VL model each reference at about this many


def uses_true_cfg(request: GenerationRequest) -> bool:
    """The pipeline's do_true_cfg: a negative prompt is given and true_cfg_scale (our guidance_scale) > 1.
    An empty negative prompt counts as none (the pipeline's default is None; its model card passes " ")."""
    return bool(request.negative_prompt) and request.uses_cfg


def pack(latents: Tensor, patch: int) -> Tensor:
    """[B, C, h, w] -> [B, (h / p) * (w / p), C * p * p]: patches row-major, channels then patch rows/cols."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5).reshape(
        b, (h // patch) * (w // patch), c * patch * patch)


def unpack(tokens: Tensor, h: int, w: int, patch: int) -> Tensor:
    """pack's inverse: [B, (h / p) * (w / p), C * p * p] -> [B, C, h, w]."""
    b, _, channels = tokens.shape
    c = channels // (patch * patch)
    return tokens.view(b, h // patch, w // patch, c, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def edit_size(image: Image.Image, area: int = EDIT_AREA) -> tuple[int, int]:
    """(width, height) of about `area` pixels with the image's aspect, multiples of 32: the size the edit
    pipelines resize a reference to, whatever the output size (their calculate_dimensions)."""
    ratio = image.width / image.height
    width = math.sqrt(area * ratio)
    return round(width / 32) * 32, round(width / ratio / 32) * 32


def reference_image(image: Image.Image, area: int = EDIT_AREA) -> Image.Image:
    """The reference as the edit pipelines see it: resized (Lanczos) to edit_size, RGB."""
    return image.convert("RGB").resize(edit_size(image, area), resample=Image.Resampling.LANCZOS)


def build_plus_program(instance: ModelInstance, guidance: GuidancePolicy | None = None) -> Program:
    """QwenImageEditPlusPipeline's program: every reference image "Picture N" in the VL prompt (at about
    CONDITION_AREA pixels) and as latent tokens at rotary frame N (at about EDIT_AREA pixels)."""
    return build_program(instance, guidance, pictures=True)


def build_program(instance: ModelInstance, guidance: GuidancePolicy | None = None, *,
                  pictures: bool = False) -> Program:
    """QwenImagePipeline's program, or QwenImageEditPipeline's when a request gives a reference image."""
    text: QwenImageTextEncoder = instance["text_encoder"]
    vae: WanVAE = instance["vae"]
    transformer = instance["transformer"]
    patch = transformer.config.patch_size
    channels = transformer.config.latent_channels
    factor = vae.config.spatial_factor
    vae_dtype = next(vae.parameters()).dtype  # bfloat16 on the CPU fast path (loading.precision.vae_dtype)
    device = instance.device
    tiling = deploy_tiling(instance.deploy, factor)  # vae_tile: the shared 2D tiling rule

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        if request.image and pictures:  # editing: the VL model sees the references with each prompt
            shown = [reference_image(image, CONDITION_AREA) for image in request.image]
            embed: Any = lambda prompt: text.encode_with_pictures(prompt, shown)  # noqa: E731
        elif request.image:
            image = reference_image(request.image[0])
            embed = lambda prompt: text.encode_with_image(prompt, image)  # noqa: E731
        else:
            embed = text.encode
        negative = embed(request.negative_prompt) if uses_true_cfg(request) else None
        return {"prompt_embeds": embed(request.prompt), "negative_embeds": negative}

    def encode_image(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        packed = []
        for index, image in enumerate(request.image, start=1):  # each alone, in order: its own grid and frame
            pixels = np.asarray(reference_image(image), dtype=np.float32) / 255.0
            pixels = torch.from_numpy(pixels).permute(2, 0, 1)[None] * 2.0 - 1.0
            with torch.inference_mode():
                raw = vae.encode(pixels[:, :, None].to(device, vae_dtype)).mean  # the pipeline's "argmax": the mode
            packed.append(pack(vae.normalize_latents(raw.float())[:, :, 0], patch))
            ctx.progress("encode_image", index, len(request.image))
        return {"references": torch.cat(packed, dim=1)}

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        h, w = request.height // factor, request.width // factor
        noise, _ = initial_noise((1, 1, channels, h, w), request.seed)  # the pipeline's [B, 1, C, h, w] draw
        grids = ((h // patch, w // patch),)
        references = slots.get("references")
        for image in request.image if references is not None else ():
            ref_w, ref_h = edit_size(image)
            grids += ((ref_h // factor // patch, ref_w // factor // patch),)
        return {"latents": pack(noise[:, 0], patch).to(device), "layout": QwenImageLayout(grids, references)}

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        h, w = request.height // factor, request.width // factor
        latents = unpack(slots["latents"], h, w, patch)[:, :, None].float()  # [1, C, 1, h, w]
        image = vae.decode(vae.denormalize_latents(latents).to(vae_dtype), tiling=tiling)[:, :, 0]
        frames = (image.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)  # [1, H, W, 3]
        ctx.progress("decode", 1, 1)
        return {"video": to_uint8(frames).cpu().numpy() if frames.is_cuda else frames.cpu().numpy()}

    inner = guidance if guidance is not None else make_guidance(instance.deploy.cfg_mode)
    # Prompts of different lengths share a forward padded and masked (batched CFG, cross-request batching) when the
    # attention takes a key mask and the stream is not sharded (a shard carries its own padding mask).
    pad_text = ATTENTION_BACKENDS[instance.deploy.attention_backend].takes_mask and instance.deploy.parallel.sp == 1
    loop = QwenImageDenoiseLoop(transformer, instance["schedule"], instance.dtype, NormRescaledCFG(inner), pad_text)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("encode_image", reads=("request",), writes=("references",), run=encode_image,
                 when=lambda r: bool(r.image)),
            Node("prepare_latents_edit", reads=("request", "references"), writes=("latents", "layout"),
                 run=prepare_latents, when=lambda r: bool(r.image)),
            Node("prepare_latents", reads=("request",), writes=("latents", "layout"), run=prepare_latents,
                 when=lambda r: not r.image),
            Node("denoise", reads=("request", "latents", "layout", "prompt_embeds", "negative_embeds"),
                 writes=("latents",), loop=loop),
            Node("decode", reads=("request", "latents"), writes=("video",), run=decode),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
        check=instance["schedule"].check,
    )
