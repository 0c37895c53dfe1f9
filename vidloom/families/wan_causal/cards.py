"""AnyFlow-FAR model cards, built from a diffusers AnyFlowFARPipeline folder."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import BlockSpec, Geometry, LoopSpec, ModelCard, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.core.blocks import EXTENSION
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.wan_causal import extension

FAMILY = "anyflow-far"
PIPELINE_CLASS = "AnyFlowFARPipeline"
PROGRAM = "vidloom.families.wan_causal.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.wan_causal.memory:request_estimator"
SAMPLERS = ("flow_map_euler",)
# Same VAE (8x space, 4x time) and full-resolution patch (2x2) as Wan2.1.
GEOMETRY = Geometry(spatial_multiple=16, temporal_factor=4)

# AnyFlow-FAR release (nvidia/AnyFlow-FAR-Wan2.1-1.3B-Diffusers model card and the diffusers
# example): 480x832, 81 frames at 16 fps, 4 flow-map steps, no CFG (the model is distilled).
DEFAULTS = SamplingDefaults(
    height=480, width=832, num_frames=81, fps=16, num_inference_steps=4,
    guidance_scale=1.0, flow_shift=5.0, sampler="flow_map_euler", negative_prompt="",
)

# Options whose mechanism assumes Wan's bidirectional denoiser are refused with the reason the rollout gives.
CAPABILITIES = Capabilities(
    frozenset({"fp8_weights", "warmup_shapes", "offload_text_encoder", "prompt_cache_size", "attention_backend",
               "kv_cache_budget_bytes", "kv_session_ttl_s", "step_cache", "compile",
               # chunks decode as they finish, in tiles each with its own causal state across chunks (decode.py)
               "vae_tile",
               # every chunk's tokens and KV sharded per chunk, padded where one does not split; one CFG branch
               # and its KV per rank (parallel.token_layout)
               "devices", "cfg_parallel",
               # the encoded prompt broadcast from the encoder's rank before the rollout (runtime.parallel.prompt_rank)
               "text_encoder_rank",
               # steps at the same chunk position share a forward, each request's KV in its own slab (network.py)
               "batching",
               # a graph per chunk position and KV slab: the slab is a static buffer passed from request to
               # request of its shape, written and read in place by the replay (network.FarNetwork.graph_split)
               "cuda_graphs"}),
    refusals("kv_pool_tokens", "offload_idle_expert", "two_stage", "components",
             cfg_mode="the rollout always runs its CFG branches as one batch, as the reference does: nothing to "
                      "choose"),
)
CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}  # `vidloom models --capabilities`


def far_card(model_id: str, source: str, defaults: SamplingDefaults = DEFAULTS, description: str = "") -> ModelCard:
    return CARDS.card(
        model_id, source, {"rollout": LoopSpec(samplers=SAMPLERS)}, method="distilled",
        components=component_table("bfloat16", "transformer", "vae", "text_encoder", "tokenizer", "scheduler"),
        tasks=frozenset({Task.T2V, Task.I2V, Task.V2V}),
        # A first frame (I2V), a context clip to continue (V2V), or a finished video of this model to extend.
        inputs=frozenset({"image", "video"}),
        request_blocks=(BlockSpec(EXTENSION, extension.RESOLVER, check=extension.CHECK),),
        size_from_inputs=True,
        precision="bfloat16", sampling_defaults=defaults, geometry=GEOMETRY, description=description,
    )


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for an AnyFlowFARPipeline folder; the flow shift comes from its scheduler config."""
    ckpt = DiffusersDir.open(path)
    scheduler = ckpt.component_config("scheduler", "scheduler_config.json")
    shift = float(scheduler.get("shift", DEFAULTS.flow_shift))
    defaults = SamplingDefaults(**{**DEFAULTS.__dict__, "flow_shift": shift})
    return far_card(ckpt.root.name, str(ckpt.root), defaults, f"AnyFlow-FAR causal text-to-video from {ckpt.root}")
