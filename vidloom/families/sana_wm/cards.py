"""Cards for SANA-WM diffusers folders (SanaWMPipeline): camera-controlled image-to-video."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import BlockSpec, Geometry, LoopSpec, ModelCard, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.ltx2.checkpoint import read_video_vae_config
from vidloom.families.sana_wm.options import CAMERA
from vidloom.families.sana_wm.text import MAX_TEXT_TOKENS

FAMILY = "sana-wm"
PIPELINE_CLASS = "SanaWMPipeline"
PROGRAM = "vidloom.families.sana_wm.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.sana_wm.memory:request_estimator"
# The camera block (core.request_blocks: fields camera / c2w / intrinsics): every request gives intrinsics.
CAMERA_BLOCK = BlockSpec(CAMERA, "vidloom.families.sana_wm.camera:resolve_camera", required=("intrinsics",),
                         check="vidloom.families.sana_wm.camera:check_size")
# SanaWMPipeline.__call__ defaults: 704x1280, 161 frames, 60 steps, CFG 5.0. fps is only the container's
# frame rate (stage 1 does not read it). flow_shift defaults to the checkpoint scheduler's `shift`
# (card_from_checkpoint); a request's flow_shift replaces it.
DEFAULTS = SamplingDefaults(height=704, width=1280, num_frames=161, fps=16, num_inference_steps=60,
                            guidance_scale=5.0, flow_shift=1.0, sampler="euler", negative_prompt="")
CAPABILITIES = Capabilities(
    # --two-stage: the LTX-2 refiner in <checkpoint>/refiner/ (refine_loop.py). step_cache and compile act on the
    # stage-1 DiT (loop.SanaWMNetwork declares the staged denoiser). The refiner's windowed forward writes K/V that
    # later chunks read, so it is not staged (its steps run plainly under a step cache), and it calls its blocks'
    # layers directly (families/sana_wm/refiner.py), so it runs eagerly under --compile. --fp8 swaps the block linears
    # of both DiTs (runtime.fp8_denoisers). --cuda-graphs captures the stage-1 step (the request's camera is a graph
    # input); the refiner's steps write their window's K/V in place, so they run eagerly (runtime.cudagraph.capturable).
    # --vae-tile: the LTX-2 video VAE's tiled decode, stage 1's and the refiner's streamed prefixes alike.
    # --offload-text-encoder / --prompt-cache: the Gemma-2 encoder (text.py).
    # --policy batch: stage-1 steps of one shape stack (cameras and both CFG branches, loop.STAGE1_INPUTS); the
    # refiner's steps write their own window K/V, so they run alone (the result's metadata says so).
    # --sp / --cfg-parallel (parallel.py): stage 1's tokens in bands of patch rows, its CFG branches on a rank pair;
    # the refiner's chunk tokens split over the sp group, its window by heads (refiner_parallel.py; whole on every
    # rank where sp does not divide its heads). --text-encoder-rank: both prompt nodes (Gemma-2; with the refiner its
    # Gemma-3 and connectors) run on that rank alone, which broadcasts what they write (parallel.token_layout).
    frozenset({"two_stage", "step_cache", "compile", "fp8_weights", "cuda_graphs", "vae_tile", "offload_text_encoder",
               "prompt_cache_size", "batching", "devices", "cfg_parallel", "text_encoder_rank"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert", "components",
             attention_backend="SANA-WM's attention follows the reference's own SDPA calls (bf16 casts, padded heads)",
             warmup_shapes="a warmup request is text-only; every SANA-WM request needs a first image and a camera",
             cfg_mode="SANA-WM runs its CFG branches as one batch of two, as the reference does",
             kv_cache_budget_bytes="the stage-1 denoiser is bidirectional and keeps no KV cache"),
)
CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}
# "refiner": NVIDIA's convert_sana_wm_to_diffusers.py lists its stage-2 SanaWMLTX2Refiner in model_index.json;
# it is read from refiner/ only under --two-stage (refiner_load.py).
INDEX_COMPONENTS = ("tokenizer", "text_encoder", "vae", "transformer", "scheduler", "refiner")


def card_from_checkpoint(path: str | Path) -> ModelCard:
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    vae = read_video_vae_config(ckpt.component_dir("vae"))
    patch = ckpt.component_config("transformer").get("patch_size", [1, 1, 1])
    shift = float(ckpt.component_config("scheduler", "scheduler_config.json").get("shift", 1.0))
    return sana_wm_card(ckpt.root.name, str(ckpt.root), multiple=vae.spatial_compression_ratio * int(patch[-1]),
                        temporal=vae.temporal_compression_ratio, defaults=replace(DEFAULTS, flow_shift=shift),
                        description=f"SANA-WM camera-controlled image-to-video from {ckpt.root}")


def check_pipeline(ckpt: DiffusersDir) -> None:
    ckpt.expect_pipeline(PIPELINE_CLASS)
    ckpt.check_index(INDEX_COMPONENTS)


def sana_wm_card(model_id: str, source: str, *, multiple: int, temporal: int, defaults: SamplingDefaults,
                 description: str, notes: tuple[str, ...] = (), precision: str = "bfloat16") -> ModelCard:
    return CARDS.card(
        model_id, source, {"stage1": LoopSpec(samplers=("euler",))},
        components=component_table(precision, "transformer", "text_encoder", "tokenizer", "vae", "scheduler"),
        tasks=frozenset({Task.I2V}), inputs=frozenset({"image"}), required_inputs=frozenset({"image"}),
        request_blocks=(CAMERA_BLOCK,), min_image_side=1,
        precision=precision, sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=multiple, temporal_factor=temporal),
        description=description, notes=notes, max_prompt_tokens=MAX_TEXT_TOKENS,
    )
