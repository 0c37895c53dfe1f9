"""Helios model cards, built from a diffusers HeliosPipeline folder (the base model) or a HeliosPyramidPipeline
folder (Helios-Mid: three resolution stages with CFG-Zero*; Helios-Distilled: the stages stepped by DMD, no
guidance)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.blocks import EXTENSION
from vidloom.core.capabilities import Capabilities
from vidloom.core.errors import CheckpointError
from vidloom.core.card import BlockSpec, Geometry, LoopSpec, ModelCard, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.families.helios import extension
from vidloom.families.helios.options import DISTILLED, DMD_SAMPLER
from vidloom.loading.diffusers_dir import DiffusersDir

FAMILY = "helios"
PIPELINE_CLASS = "HeliosPipeline"
PYRAMID_CLASS = "HeliosPyramidPipeline"
PYRAMID_SETTINGS = ("is_cfg_zero_star", "is_distilled")  # HeliosPyramidPipeline's registered config
# is_distilled steps the scheduler with DMD arguments only HeliosDMDScheduler takes, and that scheduler steps only
# with them: the flag and the class go together.
DISTILLED_SCHEDULER = "HeliosDMDScheduler"
PROGRAM = "vidloom.families.helios.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.helios.memory:request_estimator"
# HeliosPipeline.__init__'s components (diffusers 0.42): the only keys its model_index.json may hold.
INDEX_COMPONENTS = ("tokenizer", "text_encoder", "vae", "scheduler", "transformer")
TEXT_TOKENS = 512  # HeliosPipeline's max_sequence_length (UMT5, as Wan); bounds prompt length
SAMPLERS = ("unipc", "euler")  # HeliosScheduler's scheduler_type values the base pipeline can step
# Wan's VAE (8x space, 4x time) and a 2x2 patch; the pipeline wants sizes divisible by 16.
GEOMETRY = Geometry(spatial_multiple=16, temporal_factor=4)

# HeliosPipeline.__call__'s defaults: 384x640, 132 frames (four 33-frame chunks, trimmed by the pipeline to 129),
# 50 steps, guidance 5.0, negative prompt "" (None in the pipeline, encoded as ""). 24 fps is the Helios release's.
DEFAULTS = SamplingDefaults(height=384, width=640, num_frames=129, fps=24, num_inference_steps=50,
                            guidance_scale=5.0, flow_shift=1.0, sampler="unipc", negative_prompt="")
# The common fields its program reads (the schedule's shift is the pipeline's own: linspace sigmas, mu).
READS = frozenset({"negative_prompt", "height", "width", "num_frames", "num_inference_steps", "guidance_scale",
                   "sampler", "step_cache_threshold"})
# HeliosPyramidPipeline.__call__'s: 10 steps in each of 3 stages (num_inference_steps is their sum, split evenly,
# the earlier stages taking a remainder), guidance 5.0; CFG-Zero* zeroes the first stage's first two predictions.
PYRAMID_DEFAULTS = SamplingDefaults(**{**DEFAULTS.__dict__, "num_inference_steps": 30})
# Helios-Distilled as diffusers documents it: 2 steps in each of 3 stages, guidance 1.0 (the pipeline ignores any
# other for a distilled model, it says; this card refuses it). The amplified first chunk is the distilled option.
DISTILLED_DEFAULTS = SamplingDefaults(**{**DEFAULTS.__dict__, "num_inference_steps": 6, "guidance_scale": 1.0,
                                         "sampler": DMD_SAMPLER})
DISTILLED_READS = READS - {"negative_prompt", "guidance_scale", "sampler"}
PYRAMID_NOTE = ("pyramid: each chunk is denoised in stages from a 2^(stages-1)x smaller latent grid up to the full "
                "one; num_inference_steps is split evenly over the stages (30 = 10 + 10 + 10, the reference's "
                "pyramid_num_inference_steps_list), so height and width are multiples of 16 * 2^(stages-1)")
DISTILLED_NOTE = ("distilled (is_distilled, HeliosDMDScheduler): every stage steps DMD-style (x0 from the flow, "
                  "re-noised toward the stage's start point), without guidance; amplify_first_chunk doubles the "
                  "first chunk's steps")
ZERO_STAR_NOTE = "CFG-Zero* (is_cfg_zero_star): the uncond branch is rescaled; the first stage's steps 0 and 1 are zeroed"
CHUNK_NOTE = ("video comes in 33-frame chunks, each decoded and streamed as it finishes; num_frames takes "
              "ceil(num_frames / 33) chunks and returns their first num_frames frames (HeliosPipeline returns "
              "all of them cut to 4k+1: the same frames for 33, 65, 97, 129, ...)")

CAPABILITIES = Capabilities(
    frozenset({"compile", "warmup_shapes", "offload_text_encoder", "prompt_cache_size", "attention_backend",
               "step_cache", "fp8_weights", "cfg_mode", "batching", "devices", "cfg_parallel", "vae_tile",
               "cuda_graphs"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert", "two_stage", "components",
             kv_cache_budget_bytes="the chunks re-embed their history every step; there is no KV cache to budget",
             text_encoder_rank="prompts set while a request runs (live prompts) are encoded inside the chunk loop at "
                               "its chunk boundaries, on every rank, not by one prompt node"),
)
CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}  # `vidloom models --capabilities`


def check_pipeline(ckpt: DiffusersDir) -> None:
    ckpt.expect_pipeline(PIPELINE_CLASS, PYRAMID_CLASS)
    if ckpt.pipeline_class == PIPELINE_CLASS:
        ckpt.check_index(INDEX_COMPONENTS)
        return
    ckpt.check_index(INDEX_COMPONENTS, settings=PYRAMID_SETTINGS)
    scheduler = ckpt.index.get("scheduler")
    dmd = isinstance(scheduler, list) and scheduler[-1:] == [DISTILLED_SCHEDULER]
    if dmd != is_distilled(ckpt):
        raise CheckpointError(f"{ckpt.root}/model_index.json: is_distilled is {is_distilled(ckpt)} with the "
                              f"scheduler {scheduler!r}; HeliosPyramidPipeline steps {DISTILLED_SCHEDULER} only "
                              "with is_distilled and any other scheduler only without it")


def is_pyramid(ckpt: DiffusersDir) -> bool:
    return ckpt.pipeline_class == PYRAMID_CLASS


def is_distilled(ckpt: DiffusersDir) -> bool:
    """HeliosPyramidPipeline's is_distilled (False when absent, as its __init__)."""
    return is_pyramid(ckpt) and bool(ckpt.index.get("is_distilled", False))


def zero_star(ckpt: DiffusersDir) -> bool:
    """HeliosPyramidPipeline's is_cfg_zero_star (False when absent, as its __init__)."""
    return is_pyramid(ckpt) and bool(ckpt.index.get("is_cfg_zero_star", False))


def helios_card(model_id: str, source: str, defaults: SamplingDefaults = DEFAULTS, description: str = "",
                precision: str = "bfloat16", geometry: Geometry = GEOMETRY,
                notes: tuple[str, ...] = (), distilled: bool = False) -> ModelCard:
    blocks = (BlockSpec(EXTENSION, extension.RESOLVER), *((BlockSpec(DISTILLED),) if distilled else ()))
    return CARDS.card(
        model_id, source, {"denoise": LoopSpec(samplers=(DMD_SAMPLER,) if distilled else SAMPLERS)},
        components=component_table(precision, "transformer", "vae", "text_encoder", "tokenizer", "scheduler",
                                   no_weights=("tokenizer", "scheduler")),
        tasks=frozenset({Task.T2V, Task.I2V, Task.V2V}), inputs=frozenset({"image", "video"}), precision=precision,
        sampling_defaults=defaults, geometry=geometry,
        # A first frame (I2V), a clip to continue (V2V), or a finished video of this model to extend.
        request_blocks=blocks,
        description=description, notes=(CHUNK_NOTE, *notes), optional_fields=DISTILLED_READS if distilled else READS,
        max_prompt_tokens=TEXT_TOKENS,
    )


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for a HeliosPipeline or HeliosPyramidPipeline folder; the default solver is its scheduler's
    scheduler_type (a distilled folder's: DMD); a pyramid's sizes follow its stage count."""
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    scheduler = ckpt.component_config("scheduler", "scheduler_config.json")
    solver = str(scheduler.get("scheduler_type", "unipc"))
    if not is_pyramid(ckpt):
        defaults = SamplingDefaults(**{**DEFAULTS.__dict__, "sampler": solver})
        return helios_card(ckpt.root.name, str(ckpt.root), defaults, f"Helios text-to-video from {ckpt.root}")
    stages = int(scheduler.get("stages", 3))  # both classes' default; checked against PYRAMID_STAGES at load
    geometry = Geometry(spatial_multiple=GEOMETRY.spatial_multiple << max(stages - 1, 0),
                        temporal_factor=GEOMETRY.temporal_factor)
    if is_distilled(ckpt):
        return helios_card(ckpt.root.name, str(ckpt.root), DISTILLED_DEFAULTS,
                           f"Helios distilled pyramid text-to-video from {ckpt.root}", geometry=geometry,
                           notes=(PYRAMID_NOTE, DISTILLED_NOTE), distilled=True)
    defaults = SamplingDefaults(**{**PYRAMID_DEFAULTS.__dict__, "sampler": solver})
    notes = (PYRAMID_NOTE, *((ZERO_STAR_NOTE,) if zero_star(ckpt) else ()))
    return helios_card(ckpt.root.name, str(ckpt.root), defaults, f"Helios pyramid text-to-video from {ckpt.root}",
                       geometry=geometry, notes=notes)
