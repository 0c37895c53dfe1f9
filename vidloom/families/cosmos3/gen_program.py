"""Cosmos3's generation nodes: prompt ids -> noise (and the I2V first frame) -> denoise -> VAE decode.

An image is a one-frame request with the image templates (system prompt, "This image is of ..."),
exactly as the reference treats `num_frames == 1`; a video may be anchored on a first frame (I2V).
An action run (request.option("action"), resolved by families/cosmos3/actions.py) captions the prompt as the action
model's JSON, conditions on its clip's latents and adds the action stream to the joint denoise.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vidloom.core.errors import InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext
from vidloom.core.request import GenerationRequest
from vidloom.decoding.loop import ARDecodeLoop
from vidloom.diffusion.guidance import BranchExchange
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.families.cosmos3.audio import SoundDecoder
from vidloom.families.cosmos3.generation import Cosmos3Generator
from vidloom.families.cosmos3.layout import GenLayout
from vidloom.models.wan.vae import WanVAE
from vidloom.layers.tiling import deploy_tiling
from vidloom.families.cosmos3.action_frames import encode_clip
from vidloom.families.cosmos3.actions import ResolvedAction, action_caption
from vidloom.families.cosmos3.gen_loop import Cosmos3DenoiseLoop
from vidloom.families.cosmos3.pipeline_config import Cosmos3PipelineConfig
from vidloom.families.cosmos3.prompts import Shape, chat_ids, generation_ids
from vidloom.families.cosmos3.reason import REASON_MAX_TOKENS, ReasonLoop


def uses_guidance(request: GenerationRequest) -> bool:
    """The reference runs the unconditional branch whenever guidance is not exactly 1 (below 1 too)."""
    return request.guidance_scale is not None and request.guidance_scale != 1.0


def shape_of(request: GenerationRequest) -> Shape:
    return Shape(request.height, request.width, request.num_frames, float(request.fps))


def first_frame(image: Any, height: int, width: int) -> Tensor:
    """An RGB PIL image -> [1, 3, height, width] in [-1, 1]: scaled to cover, centre-cropped, rounded to uint8 levels.

    The reference's preprocessing step by step (bilinear with antialias, ceil sizes, rounded crop
    offsets), since a different resize would change the anchored frame and every frame after it.
    """
    pixels = torch.from_numpy(np.array(image.convert("RGB"), copy=True)).permute(2, 0, 1)[None].float()
    src_h, src_w = pixels.shape[-2:]
    scale = max(width / src_w, height / src_h)
    size = (math.ceil(scale * src_h), math.ceil(scale * src_w))
    pixels = F.interpolate(pixels, size=size, mode="bilinear", align_corners=False, antialias=True)
    top, left = round((size[0] - height) / 2), round((size[1] - width) / 2)
    pixels = pixels[:, :, top: top + height, left: left + width]
    return pixels.round().clamp(0, 255) / 127.5 - 1.0


def generation_nodes(instance: ModelInstance, ar_loop: ARDecodeLoop, cache_prefix: bool = True,
                     reason_max_tokens: int = REASON_MAX_TOKENS, pair: BranchExchange | None = None,
                     ) -> tuple[Node, ...]:
    """The nodes of a generation request over `instance`'s resident backbone, generator and VAE.

    `ar_loop` is the card's chat loop: with `reason`, it writes the prompt generation starts from. `pair`: a
    --cfg-parallel pair, each rank running one CFG branch.
    """
    tokenizer = instance["tokenizer"]
    generator: Cosmos3Generator = instance["generator"]
    vae: WanVAE = instance["vae"]
    tiling = deploy_tiling(instance.deploy, vae.config.spatial_factor)  # vae_tile: the Wan VAE's tiled decode
    sound_decoder: SoundDecoder | None = instance.components.get("sound_decoder")
    pipeline: Cosmos3PipelineConfig = instance["pipeline_config"]
    sampler_config: SamplerConfig = instance["sampler_config"]
    device = instance.device
    temporal = vae.config.temporal_factor

    def check(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        """What only this family refuses, before any work (reasoning included)."""
        request: GenerationRequest = slots["request"]
        if request.image and request.num_frames == 1:
            raise InvalidRequest("image", "an image (num_frames 1) takes no first frame; ask for a video")
        if not sampler_config.uses_shift and request.flow_shift not in (None, sampler_config.shift):
            raise InvalidRequest("flow_shift", "this checkpoint's scheduler uses Karras sigmas (use_karras_sigmas), "
                                 f"which take no flow shift; leave it unset or {sampler_config.shift}")
        return {}

    def no_reasoning(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"reasoned_prompt": None}

    def tokenize(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        shape = shape_of(request)
        prompt = slots["reasoned_prompt"] or request.prompt  # a reasoner that wrote nothing: the user's prompt
        system = pipeline.use_system_prompt
        if request.option("action") is not None:  # the JSON caption; the negative prompt goes in as written
            ids = [chat_ids(tokenizer, action_caption(prompt, request.option("action"), float(request.fps)), False, system)]
            if uses_guidance(request):
                ids.append(chat_ids(tokenizer, request.negative_prompt or "", False, system))
            return {"prompt_ids": ids}
        ids = [generation_ids(tokenizer, prompt, shape, system_prompt=system)]
        if uses_guidance(request):
            ids.append(generation_ids(tokenizer, request.negative_prompt or "", shape, negative=True,
                                      system_prompt=system))
        return {"prompt_ids": ids}

    def prepare_latents(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        if request.option("action") is not None:
            return prepare_action(request, request.option("action"), slots["prompt_ids"])
        latent_shape = (vae.config.z_dim, (request.num_frames - 1) // temporal + 1,
                        request.height // vae.config.spatial_factor, request.width // vae.config.spatial_factor)
        first = encode_first_frame(request) if request.image else None
        # Seeding rule shared with diffusers: CPU generator, float32 standard normal of the latent shape.
        rng = torch.Generator("cpu").manual_seed(request.seed)
        latents = torch.randn((1, *latent_shape), generator=rng, dtype=torch.float32)[0].to(device)
        cond_frames: tuple[int, ...] = ()
        if first is not None:
            latents[:, 0] = first[:, 0].to(latents.dtype)
            cond_frames = (0,)
        sound, sound_len = None, 0
        if request.option("sound"):  # drawn after the vision noise from the same generator, as the reference does
            sound_len = sound_decoder.config.latent_steps(request.num_frames, float(request.fps))
            sound = torch.randn((generator.config.sound_dim, sound_len), generator=rng, dtype=torch.float32)
            sound = sound.to(device)
        branches = [(torch.tensor(ids, device=device),
                     GenLayout.build(generator.config, latent_shape, len(ids), float(request.fps), temporal,
                                     cond_frames, sound_len))
                    for ids in slots["prompt_ids"]]
        return {"latents": latents, "sound_latents": sound, "branches": branches, "action_latents": None}

    def prepare_action(request: GenerationRequest, action: ResolvedAction, prompt_ids: list) -> dict[str, Any]:
        """Clip latents with the clean frames in place, then the action stream: the given actions (clean)
        for forward dynamics, noise otherwise; channels past the embodiment's width stay zero."""
        clean = encode_clip(vae, action, device)
        rng = torch.Generator("cpu").manual_seed(request.seed)  # vision noise first, then actions (the reference)
        latents = torch.randn((1, *clean.shape), generator=rng, dtype=torch.float32)[0].to(device)
        frames = clean.shape[1]
        cond_frames = tuple(range(frames)) if action.mode == "inverse_dynamics" else (0,)
        latents[:, list(cond_frames)] = clean[:, list(cond_frames)]
        width = generator.config.action_dim
        actions = torch.randn((action.chunk_size, width), generator=rng, dtype=torch.float32).to(device)
        action_cond: tuple[int, ...] = ()
        if action.raw_actions is not None:
            actions.zero_()[:, : action.raw_width] = torch.from_numpy(action.raw_actions).to(device)
            action_cond = tuple(range(action.chunk_size))
        actions[:, action.raw_width:] = 0
        branches = [(torch.tensor(ids, device=device),
                     GenLayout.build(generator.config, tuple(clean.shape), len(ids), float(request.fps), temporal,
                                     cond_frames, 0, action.chunk_size, action_cond))
                    for ids in prompt_ids]
        return {"latents": latents, "sound_latents": None, "branches": branches, "action_latents": actions}

    def actions_out(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        """Predicted actions [chunk_size, D] float32 at the embodiment's width (None unless predicted), and
        the resolved block's summary the output's metadata reports (the card's metadata_slots)."""
        action = slots["request"].option("action")
        if action is None:
            return {"actions": None, "action": None}
        summary = {"mode": action.mode, "domain_name": action.domain_name, "chunk_size": action.chunk_size}
        if not action.predicts_actions:
            return {"actions": None, "action": summary}
        return {"actions": slots["action_latents"][:, : action.raw_width].float().cpu().numpy(), "action": summary}

    def encode_first_frame(request: GenerationRequest) -> Tensor:
        """The anchored frame repeated over the whole clip and encoded as a video, as the reference does."""
        frame = first_frame(request.image[0], request.height, request.width).to(device)
        vae_dtype = next(vae.parameters()).dtype
        video = frame[:, :, None].expand(-1, -1, request.num_frames, -1, -1).to(vae_dtype)
        return vae.normalize_latents(vae.encode(video).mean)[0].float()

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        vae_dtype = next(vae.parameters()).dtype
        raw = vae.denormalize_latents(slots["latents"][None].to(vae_dtype))
        video = vae.decode(raw, progress=lambda done, total: ctx.progress("decode", done, total), tiling=tiling)
        frames = (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)  # [F, H, W, 3]
        return {"video": frames.cpu().numpy()}

    def decode_sound(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        assert sound_decoder is not None, "the card accepts sound only with a sound decoder"
        waveform = sound_decoder(slots["sound_latents"].float().cpu())  # [channels, samples]
        ctx.progress("audio", 1, 1)
        return {"audio": waveform, "sample_rate": sound_decoder.config.sampling_rate}

    def silent(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"audio": None, "sample_rate": None}

    loop = Cosmos3DenoiseLoop(instance["transformer"], generator, instance["sampler_config"], instance.dtype,
                              cache_prefix=cache_prefix, pair=pair)
    reasoner = ReasonLoop(ar_loop, reason_max_tokens)
    reasoned = ("reasoned_prompt",)
    return (
        Node("check", reads=("request",), writes=(), run=check),
        Node("reason", reads=("request",), writes=reasoned, loop=reasoner, when=lambda r: r.option("reason")),
        Node("no_reasoning", reads=("request",), writes=reasoned, run=no_reasoning, when=lambda r: not r.option("reason")),
        Node("tokenize", reads=("request", "reasoned_prompt"), writes=("prompt_ids",), run=tokenize),
        Node("prepare_latents", reads=("request", "prompt_ids"),
             writes=("latents", "sound_latents", "branches", "action_latents"), run=prepare_latents),
        Node("denoise", reads=("request", "latents", "sound_latents", "branches", "action_latents"),
             writes=("latents", "sound_latents", "action_latents"), loop=loop),
        Node("actions_out", reads=("request", "action_latents"), writes=("actions", "action"), run=actions_out),
        Node("decode", reads=("latents",), writes=("video",), run=decode),
        Node("decode_sound", reads=("sound_latents",), writes=("audio", "sample_rate"), run=decode_sound,
             when=lambda r: r.option("sound")),
        Node("silent", reads=("request",), writes=("audio", "sample_rate"), run=silent, when=lambda r: not r.option("sound")),
    )
