"""Cards for Cosmos3 Omni diffusers folders (Cosmos3OmniPipeline): chat and generation on one instance.

The "ar_decode" loop makes the model answer chat through the understanding pathway; with a VAE and a
scheduler in the folder the card also declares the "denoise" loop and the generation tasks (text to
image/video, image to video), run by the generation pathways over the same resident backbone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.blocks import ACTION
from vidloom.core.card import BlockSpec, ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.card_kit import refusals
from vidloom.core.errors import CheckpointError
from vidloom.core.request import Task
from vidloom.families.cosmos3.options import REASONING, SOUND
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.cosmos3.pipeline_config import Cosmos3PipelineConfig

FAMILY = "cosmos3"
PIPELINE_CLASS = "Cosmos3OmniPipeline"
PROGRAM = "vidloom.families.cosmos3.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.cosmos3.memory:request_estimator"
ACTION_RESOLVER = "vidloom.families.cosmos3.actions:resolve_action"
ACTION_SESSION = "vidloom.families.cosmos3.action_session:ActionSession"
AR_LOOP = "ar_decode"
DENOISE_LOOP = "denoise"
SAMPLERS = ("unipc",)  # the checkpoint's scheduler; parity-tested against UniPCMultistepScheduler
GENERATION_COMPONENTS = ("vae", "scheduler")
CHAT_ONLY_NOTE = "chat only: the folder has no vae/ and scheduler/ to generate with"
# Served context (prompt + completion tokens per sequence). Qwen3-VL backbones are trained far longer;
# this bounds what one request may reserve in the paged KV pool, which bounds it again.
CONTEXT_WINDOW = 32768
# Cosmos3OmniPipeline.__call__ / tokenize_prompt defaults (diffusers 0.42): 720x1280, 189 frames at 24 fps,
# 35 UniPC steps, guidance 6; sizes are multiples of 16 (VAE 16x), frames 4k+1.
GENERATION_DEFAULTS = SamplingDefaults(
    height=720, width=1280, num_frames=189, fps=24, num_inference_steps=35,
    guidance_scale=6.0, flow_shift=5.0, sampler="unipc",
)

# The text "encoder" is the unified backbone itself (a prompt is a prefix of the joint sequence, prefilled per
# CFG branch), so the text-encoder options have nothing separate to act on; the rest are not wired yet.
# devices, cfg_parallel: the generated stream sharded (padded), the prefix K/V whole on every rank, one CFG branch per
# rank (parallel.token_layout). batching (--policy batch): steps of requests whose prompts have equal token counts (and
# equal sizes) stack their prefilled prompt K/V into one forward; other requests run alone (gen_step.Cosmos3View).
# cuda_graphs: each branch's prefix K/V padded to its prompt-length bucket (runtime.prompt_buckets.PROMPT_BUCKET) in a
# static buffer, the padding masked out, the generated tokens' positions a tensor input: one graph per bucket pair and
# layout.
CAPABILITIES = Capabilities(
    frozenset({"warmup_shapes", "kv_cache_budget_bytes", "kv_pool_tokens", "step_cache", "compile", "fp8_weights",
               "vae_tile", "attention_backend", "devices", "cfg_parallel", "batching", "cuda_graphs"}),
    refusals("offload_idle_expert", "two_stage", "components",
             offload_text_encoder="the prompt is read by the unified backbone, which generation needs resident; "
                                  "there is no separate text encoder to offload",
             prompt_cache_size="a prompt is prefilled into the backbone's KV per request, not encoded into an "
                               "embedding a cache could keep",
             cfg_mode="each CFG branch prefills its own prefix KV; running both in one batch is not wired",
             kv_session_ttl_s="no causal video rollout whose KV could be kept",
             text_encoder_rank="the prompt is read by the unified backbone, which every rank runs; there is no "
                               "separate text encoder to place on one rank"),
)
# Without a VAE and a scheduler the folder serves chat only: there is no generation to warm up.
CHAT_ONLY_CAPABILITIES = CAPABILITIES.without({"warmup_shapes": "chat only: no generation shape to warm",
                                               "step_cache": "chat only: no denoiser to cache",
                                               "compile": "chat only: no denoiser blocks to compile",
                                               "fp8_weights": "chat only: FP8 applies to the generation blocks, "
                                                              "which this folder does not load",
                                               "vae_tile": "chat only: no VAE to decode with",
                                               "batching": "chat only: no denoise step to batch (chats share "
                                                           "paged decode forwards under every policy)",
                                               "devices": "chat only: no denoiser to shard, and chat runs on the "
                                                          "paged decoder, which a pool of ranks has not",
                                               "cfg_parallel": "chat only: no CFG branches to split"})
# cuda_graphs: with no denoise step to refuse it for, a chat's decode steps replay graphs captured per batch-size bucket
# (runtime.decode_graphs; Cosmos3Transformer.decode_graphs), prefills staying eager.
CHAT_ONLY_CAPABILITIES = dataclasses.replace(
    CHAT_ONLY_CAPABILITIES.plus("cuda_graphs"),
    lora_why_not="chat only: adapters apply to generation requests, which this folder does not run")
# With an action pathway, an action session's prefilled prompt prefixes stay resident between its chunks
# (kv_session_ttl_s: their idle TTL; gen_loop.ResidentPrefix, action_session.py).
# Its sessions keep those prefixes in the engine's cache manager, which a pool of ranks has not: the action card
# refuses multi-device plans until they do (its one-shot requests would shard like generation's).
ACTION_POOL_NOTE = ("an action session keeps its prefilled prompt K/V in the engine's cache manager between chunks, "
                    "which a pool of ranks does not have; action checkpoints run on one device")
ACTION_GRAPHS_NOTE = ("an action session keeps its prefilled prompt K/V resident between chunks, while under "
                      "cuda_graphs a request's bucket-padded prefix is a static buffer handed to the next request of "
                      "its bucket when it ends (gen_step.PaddedPrefix); a chunk's prefix cannot be both")
ACTION_CAPABILITIES = CAPABILITIES.plus("kv_session_ttl_s").without({"devices": ACTION_POOL_NOTE,
                                                                     "cfg_parallel": ACTION_POOL_NOTE,
                                                                     "cuda_graphs": ACTION_GRAPHS_NOTE})
CAPABILITY_ROWS = {FAMILY: CAPABILITIES, "cosmos3-actions": ACTION_CAPABILITIES,
                   "cosmos3-chat-only": CHAT_ONLY_CAPABILITIES}  # `vidloom models --capabilities`


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A chat card for a Cosmos3OmniPipeline folder."""
    ckpt = DiffusersDir.open(path)
    ckpt.expect_pipeline(PIPELINE_CLASS)
    pipeline = read_pipeline_config(ckpt)
    generates = all((ckpt.root / name).is_dir() for name in GENERATION_COMPONENTS)
    sound = generates and bool(ckpt.component_config("transformer").get("sound_gen")) and \
        (ckpt.root / "sound_tokenizer").is_dir()
    return cosmos3_card(
        ckpt.root.name, str(ckpt.root), generates=generates, sound=sound,
        actions=action_limits(ckpt.component_config("transformer")) if generates else None,
        defaults=_defaults(ckpt) if generates else GENERATION_DEFAULTS,
        description=f"Cosmos3 Omni (chat, and image/video generation when the folder has a VAE) from {ckpt.root}",
        notes=pipeline.notes + (() if generates else (CHAT_ONLY_NOTE,)),
    )


def action_limits(transformer_config: dict) -> dict[str, int] | None:
    """The action pathway's padded width and domain count (the action block's limits); None without one."""
    if not transformer_config.get("action_gen"):
        return None
    try:
        return {"action_dim": int(transformer_config["action_dim"]),
                "domains": int(transformer_config.get("num_embodiment_domains", 32))}
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"transformer/config.json: action_gen needs an integer action_dim ({exc})") from None


def cosmos3_card(model_id: str, source: str, *, generates: bool, sound: bool, defaults: SamplingDefaults,
                 description: str, notes: tuple[str, ...] = (), precision: str = "bfloat16",
                 actions: dict[str, int] | None = None) -> ModelCard:
    """The card of a folder that generates (a VAE and a scheduler) or not, with a sound pathway or not,
    with an action pathway (`actions`: its limits) or not."""
    components = {"transformer": ComponentSpec(precision), "text_tokenizer": ComponentSpec()}
    loops = {AR_LOOP: LoopSpec()}
    blocks = [BlockSpec(REASONING)]
    if generates:
        components.update({"vae": ComponentSpec("float32"), "scheduler": ComponentSpec()})
        loops[DENOISE_LOOP] = LoopSpec(samplers=SAMPLERS)
    if sound:
        components["sound_tokenizer"] = ComponentSpec("float32")
        blocks.append(BlockSpec(SOUND))
    if actions:
        blocks.append(BlockSpec(ACTION, ACTION_RESOLVER, actions, ACTION_SESSION))
    return ModelCard(
        model_id=model_id,
        family=FAMILY,
        components=components,
        loops=loops,
        tasks=frozenset({Task.T2V, Task.I2V}) if generates else frozenset(),
        inputs=frozenset({"image"}) if generates else frozenset(),
        produces_audio=sound,
        precision=precision,
        sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=16, temporal_factor=4),
        recipe=RecipeSpec(method="pretrained", loop=AR_LOOP),
        program=PROGRAM,
        memory_estimator=MEMORY_ESTIMATOR if generates else None,
        source=source,
        description=description,
        notes=notes,
        context_window=CONTEXT_WINDOW,
        capabilities=(ACTION_CAPABILITIES if actions else CAPABILITIES) if generates else CHAT_ONLY_CAPABILITIES,
        request_blocks=blocks if generates else (),
        # Program slots reported in the output's metadata: the prompt the model wrote (reason=True) and the
        # resolved action block's summary (gen_program's actions_out).
        metadata_slots=(("reasoned_prompt", "action") if actions else ("reasoned_prompt",)) if generates else (),
    )


def read_pipeline_config(ckpt: DiffusersDir) -> Cosmos3PipelineConfig:
    """The pipeline's own settings in model_index.json (every key read or refused by name)."""
    return Cosmos3PipelineConfig.from_index(ckpt.index, f"{ckpt.root}/model_index.json")


def _defaults(ckpt: DiffusersDir) -> SamplingDefaults:
    """The pipeline's defaults, with the flow shift the checkpoint's scheduler was saved with."""
    import dataclasses

    scheduler = ckpt.component_config("scheduler", "scheduler_config.json")
    shift = scheduler.get("flow_shift", GENERATION_DEFAULTS.flow_shift)
    return dataclasses.replace(GENERATION_DEFAULTS, flow_shift=float(shift))
