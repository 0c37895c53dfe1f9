"""Wan2.1 text-to-video model cards: registered ids and cards built from a checkpoint folder."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.card import ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir

FAMILY = "wan2.1"
PROGRAM = "vidloom.recipes.wan.program:build_program"
MEMORY_ESTIMATOR = "vidloom.recipes.wan.memory:request_estimator"
TEXT_TOKENS = 512  # Wan2.1's text length (recipes/wan/text.py WAN_TEXT_TOKENS); bounds prompt length
SAMPLERS = ("unipc", "euler")
# Wan2.1's VAE downsamples 8x in space and 4x in time; the DiT patchifies 2x2 more.
GEOMETRY = Geometry(spatial_multiple=16, temporal_factor=4)

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
    return {
        "transformer": ComponentSpec("transformer", "transformer", dit_dtype),
        "vae": ComponentSpec("vae", "vae", "float32"),  # Wan's VAE is run in fp32 by its authors
        "text_encoder": ComponentSpec("text_encoder", "text_encoder", dit_dtype),
        "tokenizer": ComponentSpec("tokenizer", "tokenizer"),
        "scheduler": ComponentSpec("scheduler", "scheduler"),
    }


def wan_t2v_card(
    model_id: str,
    source: str,
    defaults: SamplingDefaults,
    *,
    precision: str = "bfloat16",
    parents: tuple[str, ...] = (),
    method: str = "pretrained",
    description: str = "",
    notes: tuple[str, ...] = (),
) -> ModelCard:
    return ModelCard(
        model_id=model_id,
        family=FAMILY,
        components=_components(precision),
        loops={"denoise": LoopSpec(kind="denoise", samplers=SAMPLERS)},
        tasks=frozenset({Task.T2V}),
        precision=precision,
        sampling_defaults=defaults,
        geometry=GEOMETRY,
        recipe=RecipeSpec(parents=parents, method=method, loop="denoise", precision=precision),
        program=PROGRAM,
        source=source,
        description=description,
        notes=notes,
        max_prompt_tokens=TEXT_TOKENS,
        memory_estimator=MEMORY_ESTIMATOR,
    )


def wan21_t2v_1_3b() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-t2v-1.3b", "hf:Wan-AI/Wan2.1-T2V-1.3B-Diffusers", DEFAULTS_480P,
        parents=("Wan-AI/Wan2.1-T2V-1.3B",),
        description="Wan2.1 text-to-video, 1.3B DiT, 480p",
    )


def wan21_t2v_14b() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-t2v-14b", "hf:Wan-AI/Wan2.1-T2V-14B-Diffusers", DEFAULTS_720P,
        parents=("Wan-AI/Wan2.1-T2V-14B",),
        description="Wan2.1 text-to-video, 14B DiT, 720p (also 480p)",
    )


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for a Wan2.1 T2V diffusers folder; defaults follow its size and scheduler config."""
    ckpt = DiffusersDir.open(path)
    dit = ckpt.component_config("transformer")
    scheduler = ckpt.component_config("scheduler", "scheduler_config.json")
    big = int(dit.get("num_layers", 0)) >= 40  # the 14B model; 1.3B has 30 layers
    base = DEFAULTS_720P if big else DEFAULTS_480P
    shift = float(scheduler.get("flow_shift", scheduler.get("shift", base.flow_shift)))
    defaults = SamplingDefaults(**{**base.__dict__, "flow_shift": shift})
    return wan_t2v_card(
        ckpt.root.name, str(ckpt.root), defaults,
        description=f"Wan2.1 text-to-video from {ckpt.root}",
    )
