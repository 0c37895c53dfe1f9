"""The SANA-WM program: text -> first frame + camera -> stage-1 denoise [-> refiner] -> LTX-2 VAE decode.

With the refiner loaded (--two-stage), its own prompt encoding (Gemma-3 + LTX-2 connectors) and its
chunk-causal rollout run between stage 1 and the decode, as SanaWMLTX2Refiner does after SanaWMPipeline.

Slots: text (SanaWMText; [negative, positive] when CFG runs), latents (float32 [1, C, F, h, w], frame 0
the encoded first image), camera (CameraTensors), video (frames in [0, 1]).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import TwoBranchCFG
from vidloom.layers.tiling import SpatialTiling, deploy_tiling
from vidloom.media.frames import to_uint8
from vidloom.families.sana_wm.camera import CameraInput
from vidloom.families.sana_wm.loop import CameraTensors, SanaWMDenoiseLoop
from vidloom.families.sana_wm.refine_loop import SanaWMRefineLoop
from vidloom.families.sana_wm.refiner_parallel import refiner_layout, whole_reason
from vidloom.families.sana_wm.trajectory import camera_tensors, crop_first_frame, trajectory

log = logging.getLogger(__name__)


def build_program(instance: ModelInstance, guidance: TwoBranchCFG | None = None) -> Program:
    """`guidance`: how stage 1's two CFG branches run when not as one batch of two (a --cfg-parallel rank pair's
    ParallelCFG). The refiner runs without CFG: under --sp over stage 1's sp group (refiner_parallel.py), every
    CFG rank alike."""
    transformer, vae, text_encoder = instance["transformer"], instance["vae"], instance["text_encoder"]
    device, dtype = instance.device, instance.dtype
    t_stride, s_stride = vae.temporal_compression_ratio, vae.spatial_compression_ratio
    tiling = deploy_tiling(instance.deploy, s_stride)  # vae_tile: the LTX-2 video VAE's tiled decode

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        text = text_encoder.encode_prompt(request.prompt)
        if request.uses_cfg:  # the pipeline's batch order: [negative, positive]
            text = text_encoder.encode_negative(request.negative_prompt or "").cat(text)
        return {"text": text}

    def prepare(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        request: GenerationRequest = slots["request"]
        camera: CameraInput = request.option("camera")
        traj = trajectory(camera, request.num_frames, t_stride)
        image, intrinsics = crop_first_frame(request.image[0].convert("RGB"), traj.intrinsics, request.height,
                                             request.width)
        raymap, plucker = camera_tensors(dataclasses.replace(traj, intrinsics=intrinsics),
                                         (request.height, request.width), t_stride, s_stride)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0) * 2.0 - 1.0
        pixels = pixels.permute(2, 0, 1)[None, :, None].to(device)  # [1, 3, 1, H, W] in [-1, 1]
        first = vae.normalize_latents(vae.encode(pixels)).cpu()
        generator = torch.Generator("cpu").manual_seed(request.seed)
        frames = (traj.c2w.shape[0] - 1) // t_stride + 1
        shape = (1, first.shape[1], frames, request.height // s_stride, request.width // s_stride)
        latents = torch.randn(shape, generator=generator, dtype=torch.float32)
        latents[:, :, :1] = first
        return {"latents": latents.to(device),
                "camera": CameraTensors(raymap[None].to(device), plucker[None].to(device))}

    loop = SanaWMDenoiseLoop(transformer, instance["sampler"], dtype, guidance)
    nodes: tuple[Node, ...] = (
        Node("encode_text", reads=("request",), writes=("text",), run=encode_text),
        Node("prepare_latents", reads=("request",), writes=("latents", "camera"), run=prepare),
        Node("stage1", reads=("request", "latents", "camera", "text"), writes=("latents",), loop=loop),
    )
    drop = 0
    if "refiner" in instance.components:
        # A causal decoder decodes a prefix to the whole video's first frames: the refiner streams its chunks
        # and writes the video itself. Otherwise the refined latents are decoded once, below.
        streams = bool(vae.config.decoder_causal)
        nodes += refine_nodes(instance, streams, tiling)
        if streams:
            return Program(nodes=nodes, inputs=frozenset({"request"}), outputs=("video",))
        drop = instance["refiner_settings"].sink_size

    def decode(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        latents = slots["latents"].to(torch.float32)
        video = vae.decode(vae.denormalize_latents(latents), tiling=tiling)
        # After the refiner, the reference drops `sink_size` decoded frames (the unrefined anchor).
        frames = (video[0, :, drop:].float() / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)  # [F, H, W, 3]
        ctx.progress("decode", 1, 1)
        return {"video": to_uint8(frames).cpu().numpy() if frames.is_cuda else frames.cpu().numpy()}

    nodes += (Node("decode", reads=("latents",), writes=("video",), run=decode),)
    return Program(nodes=nodes, inputs=frozenset({"request"}), outputs=("video",))


def refine_nodes(instance: ModelInstance, streams: bool, tiling: SpatialTiling | None = None) -> tuple[Node, ...]:
    """Stage 2: the refiner's prompt encoding and its chunk-causal rollout over stage 1's latents."""
    refiner_text = instance["refiner_text"]
    whole = whole_reason(instance)
    if whole is not None:
        log.info("%s", whole)

    def encode_refiner_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"refiner_text": refiner_text.encode([slots["request"].prompt])}

    loop = SanaWMRefineLoop(instance["refiner"], instance.dtype, instance["refiner_settings"],
                            vae=instance["vae"] if streams else None, tiling=tiling, shards=refiner_layout(instance))
    return (
        Node("encode_refiner_text", reads=("request",), writes=("refiner_text",), run=encode_refiner_text),
        Node("refine", reads=("request", "latents", "refiner_text"),
             writes=("latents", "video") if streams else ("latents",), loop=loop),
    )
