"""Cards for Cosmos3 Omni diffusers folders (Cosmos3OmniPipeline): chat through the understanding pathway.

The card serves no generation task yet (issue #13 adds text/image-to-video on the same instance):
it declares the "ar_decode" loop, which is what makes a model answer chat. Its sampling defaults are
the pipeline's own generation defaults, kept for that generation side.
"""

from __future__ import annotations

from pathlib import Path

from vidloom.core.card import ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import DiffusersDir

FAMILY = "cosmos3"
PIPELINE_CLASS = "Cosmos3OmniPipeline"
PROGRAM = "vidloom.recipes.cosmos3.program:build_program"
AR_LOOP = "ar_decode"
# Served context (prompt + completion tokens per sequence). Qwen3-VL backbones are trained far longer;
# this bounds what one request may reserve in the paged KV pool, which bounds it again.
CONTEXT_WINDOW = 32768
# Cosmos3OmniPipeline.__call__ / tokenize_prompt defaults (diffusers 0.42): 720x1280, 189 frames at 24 fps,
# 35 UniPC steps, guidance 6; sizes are multiples of 16 (VAE 16x), frames 4k+1.
GENERATION_DEFAULTS = SamplingDefaults(
    height=720, width=1280, num_frames=189, fps=24, num_inference_steps=35,
    guidance_scale=6.0, flow_shift=5.0, sampler="unipc",
)


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A chat card for a Cosmos3OmniPipeline folder."""
    ckpt = DiffusersDir.open(path)
    if ckpt.pipeline_class != PIPELINE_CLASS:
        raise CheckpointError(f"{ckpt.root}: model_index.json says {ckpt.pipeline_class!r}, expected {PIPELINE_CLASS!r}")
    return ModelCard(
        model_id=ckpt.root.name,
        family=FAMILY,
        components={"transformer": ComponentSpec("bfloat16"), "text_tokenizer": ComponentSpec()},
        loops={AR_LOOP: LoopSpec()},
        tasks=frozenset(),
        precision="bfloat16",
        sampling_defaults=GENERATION_DEFAULTS,
        geometry=Geometry(spatial_multiple=16, temporal_factor=4),
        recipe=RecipeSpec(method="pretrained", loop=AR_LOOP),
        program=PROGRAM,
        source=str(ckpt.root),
        description=f"Cosmos3 Omni (chat through the reasoning pathway) from {ckpt.root}",
        notes=("chat only for now: video generation on this checkpoint is not wired yet",),
        context_window=CONTEXT_WINDOW,
    )
