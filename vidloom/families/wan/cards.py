"""Wan model cards: registered ids and cards built from a checkpoint folder (T2V, I2V, Wan2.2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vidloom.core.capabilities import Capabilities
from vidloom.core.blocks import TWO_EXPERTS, VIDEO_TO_VIDEO
from vidloom.core.card import BlockSpec, ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.wan.vae import WanVAEConfig
from vidloom.families.wan.teacache import WAN21_TEACACHE

FAMILY = "wan2.1"
PROGRAM = "vidloom.families.wan.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.wan.memory:request_estimator"
TEXT_TOKENS = 512  # Wan2.1's text length (models/wan/text.py WAN_TEXT_TOKENS); bounds prompt length
SAMPLERS = ("unipc", "euler")
# Wan2.1's VAE downsamples 8x in space and 4x in time; the DiT patchifies 2x2 more.
GEOMETRY = Geometry(spatial_multiple=16, temporal_factor=4)

# Every runtime feature is written against Wan's denoiser; what is left has nothing to act on in a Wan checkpoint.
CAPABILITIES = Capabilities(
    frozenset({"fp8_weights", "compile", "warmup_shapes", "offload_text_encoder", "prompt_cache_size", "vae_tile",
               "attention_backend", "cfg_mode", "step_cache", "cuda_graphs", "offload_idle_expert", "devices",
               "cfg_parallel", "text_encoder_rank", "components", "batching"}),
    refusals("kv_pool_tokens", "two_stage",
             kv_cache_budget_bytes="a bidirectional denoiser keeps no KV cache to budget",
             kv_session_ttl_s="no causal rollout whose KV could be kept for an extension"),
)


def wan_capabilities(two_experts: bool) -> Capabilities:
    """CAPABILITIES narrowed to one checkpoint's denoiser. (A CLIP-conditioned I2V DiT takes them all: its
    per-request CLIP tokens are a CUDA-graph input, conditioning.ImageConditionedNetwork.)"""
    if two_experts:
        return CAPABILITIES
    return CAPABILITIES.without({"offload_idle_expert": "one expert: there is no idle expert to keep in host memory"})


CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)  # each card narrows the capabilities
# What each kind of Wan checkpoint declares (a row of `vidloom models --capabilities`).
CAPABILITY_ROWS = {
    "wan": wan_capabilities(two_experts=False),
    "wan2.2-a14b": wan_capabilities(two_experts=True),
}


# Negative prompt the Wan2.1 authors recommend (Wan-AI model card / diffusers Wan docs).
WAN_NEGATIVE_PROMPT = (
    "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, "
    "static, overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, "
    "extra fingers, poorly drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, "
    "fused fingers, still picture, messy background, three legs, many people in the background, "
    "walking backwards"
)

# Wan2.1 release defaults (Wan-AI/Wan2.1 README): 16 fps, 50 steps, guidance 5,
# flow shift 3.0 at 480p and 5.0 at 720p, UniPC.
DEFAULTS_480P = SamplingDefaults(
    height=480, width=832, num_frames=81, fps=16, num_inference_steps=50,
    guidance_scale=5.0, flow_shift=3.0, sampler="unipc", negative_prompt=WAN_NEGATIVE_PROMPT,
)
DEFAULTS_720P = SamplingDefaults(
    height=720, width=1280, num_frames=81, fps=16, num_inference_steps=50,
    guidance_scale=5.0, flow_shift=5.0, sampler="unipc", negative_prompt=WAN_NEGATIVE_PROMPT,
)


def _components(dit_dtype: str) -> dict[str, ComponentSpec]:
    return component_table(dit_dtype, "transformer", "vae", "text_encoder", "tokenizer", "scheduler")


def wan_t2v_card(
    model_id: str,
    source: str,
    defaults: SamplingDefaults,
    *,
    precision: str = "bfloat16",
    method: str = "pretrained",
    description: str = "",
    notes: tuple[str, ...] = (),
    tasks: frozenset[Task] = frozenset({Task.T2V, Task.V2V}),
    inputs: frozenset[str] = frozenset({"video", "strength"}),
    required_inputs: frozenset[str] = frozenset(),
    family: str = FAMILY,
    geometry: Geometry = GEOMETRY,
    recipe_sampler: str | None = None,
    recipe_timesteps: tuple[int, ...] = (),
    quantization: str | None = None,
) -> ModelCard:
    """A Wan card; the defaults describe a Wan2.1 T2V checkpoint, the keywords the other members.
    A `recipe_sampler` (distilled checkpoints) is then the only sampler the card's loop offers."""
    # A second guidance scale is exactly what a two-expert (A14B) checkpoint reads (checkpoint_variant).
    two_experts = "guidance_scale_2" in inputs
    # `inputs` names media and the options of Wan's two blocks alike; the card keeps them apart.
    blocks = [BlockSpec(block) for block, option in ((VIDEO_TO_VIDEO, "strength"), (TWO_EXPERTS, "guidance_scale_2"))
              if option in inputs]
    return CARDS.card(
        model_id, source, {"denoise": LoopSpec(samplers=(recipe_sampler,) if recipe_sampler else SAMPLERS)},
        recipe=RecipeSpec(method=method, loop="denoise", sampler=recipe_sampler, timesteps=recipe_timesteps,
                          quantization=quantization),
        family=family, components=_components(precision), capabilities=wan_capabilities(two_experts),
        tasks=tasks, inputs=inputs - {"strength", "guidance_scale_2"}, required_inputs=required_inputs,
        request_blocks=blocks,
        precision=precision, sampling_defaults=defaults, geometry=geometry,
        description=description, notes=notes, max_prompt_tokens=TEXT_TOKENS, teacache=WAN21_TEACACHE.get(model_id),
    )


def wan21_t2v_1_3b() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-t2v-1.3b", "hf:Wan-AI/Wan2.1-T2V-1.3B-Diffusers", DEFAULTS_480P,
        description="Wan2.1 text-to-video, 1.3B DiT, 480p",
    )


def wan21_t2v_14b() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-t2v-14b", "hf:Wan-AI/Wan2.1-T2V-14B-Diffusers", DEFAULTS_720P,
        description="Wan2.1 text-to-video, 14B DiT, 720p (also 480p)",
    )


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for a Wan diffusers folder (WanPipeline / WanImageToVideoPipeline, Wan2.1 or Wan2.2):
    tasks and accepted inputs follow its components, defaults its size and scheduler config."""
    ckpt = DiffusersDir.open(path)
    dit = ckpt.component_config("transformer")
    scheduler = ckpt.component_config("scheduler", "scheduler_config.json")
    big = int(dit.get("num_layers", 0)) >= 40  # the 14B model; 1.3B has 30 layers
    base = DEFAULTS_720P if big else DEFAULTS_480P
    shift = float(scheduler.get("flow_shift", scheduler.get("shift", base.flow_shift)))
    defaults = SamplingDefaults(**{**base.__dict__, "flow_shift": shift})
    variant = checkpoint_variant(ckpt.index, dit)
    return wan_t2v_card(
        ckpt.root.name, str(ckpt.root), defaults,
        description=f"{variant.description} from {ckpt.root}",
        tasks=variant.tasks, inputs=variant.inputs, required_inputs=variant.required,
        family=variant.family, geometry=checkpoint_geometry(ckpt, dit),
    )


@dataclass(frozen=True)
class WanVariant:
    """What a Wan checkpoint serves, read from its model_index.json and transformer config."""

    family: str
    tasks: frozenset[Task]
    inputs: frozenset[str]
    required: frozenset[str]
    description: str


def checkpoint_variant(index: Mapping[str, Any], dit: Mapping[str, Any]) -> WanVariant:
    two_experts = index.get("boundary_ratio") is not None
    extra = frozenset({"guidance_scale_2"}) if two_experts else frozenset()
    family = "wan2.2" if two_experts or index.get("expand_timesteps") else FAMILY
    if index.get("expand_timesteps"):  # TI2V-5B: one checkpoint, with or without a first frame
        return WanVariant(family, frozenset({Task.T2V, Task.I2V}), frozenset({"image"}) | extra, frozenset(),
                          "Wan2.2 text/image-to-video")
    if dit.get("image_dim") is not None and dit.get("pos_embed_seq_len") is not None:
        both = frozenset({"image", "last_image"})  # positions are learned for exactly two images
        return WanVariant(family, frozenset({Task.I2V}), both | extra, both, "Wan2.1 first-last-frame-to-video")
    if int(dit.get("in_channels", 16)) > int(dit.get("out_channels") or dit.get("in_channels", 16)):
        # Mask + first-frame latents appended to the noise: an I2V DiT (Wan2.1 with CLIP, A14B without).
        return WanVariant(family, frozenset({Task.I2V}), frozenset({"image", "last_image"}) | extra,
                          frozenset({"image"}), "Wan image-to-video")
    if two_experts:  # diffusers' video-to-video pipeline runs one expert only
        return WanVariant(family, frozenset({Task.T2V}), extra, frozenset(), "Wan2.2 text-to-video (two experts)")
    return WanVariant(family, frozenset({Task.T2V, Task.V2V}), frozenset({"video", "strength"}), frozenset(),
                      "Wan text-to-video (and video-to-video)")


def checkpoint_geometry(ckpt: DiffusersDir, dit: Mapping[str, Any]) -> Geometry:
    """Pixel multiples of a folder: its VAE's factors times the DiT's patch."""
    vae = ckpt.parse_component("vae", WanVAEConfig.from_diffusers)
    patch = tuple(dit.get("patch_size", (1, 2, 2)))
    return Geometry(spatial_multiple=vae.spatial_factor * int(max(patch[1], patch[2])),
                    temporal_factor=vae.temporal_factor * int(patch[0]))
