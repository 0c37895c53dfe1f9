"""Cards for Flux2 Klein diffusers folders (text-to-image and reference-image editing)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.card_kit import component_table, refusals
from vidloom.core.errors import CheckpointError
from vidloom.core.request import Task
from vidloom.loading.config_keys import read_key, strict_bool
from vidloom.loading.diffusers_dir import DiffusersDir, read_json
from vidloom.families.flux2.text import FLUX2_TEXT_TOKENS

FAMILY = "flux2"
PIPELINE_CLASS = "Flux2KleinPipeline"
PROGRAM = "vidloom.families.flux2.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.flux2.memory:request_estimator"
SAMPLERS = ("euler",)
# Klein's reference images: the pipeline refuses sides under 64 px (Flux2ImageProcessor.check_image_input).
MIN_IMAGE_SIDE = 64
MAX_REFERENCE_IMAGES = 4  # BFL's Klein guidance; each image adds its tokens to every attention
# Step-distilled Klein runs 4 steps without CFG; the base model 50 steps with CFG 4.0
# (black-forest-labs FLUX.2-klein model cards / Flux2KleinPipeline docs).
DISTILLED_DEFAULTS = SamplingDefaults(
    height=1024, width=1024, num_frames=1, fps=1, num_inference_steps=4,
    guidance_scale=1.0, flow_shift=3.0, sampler="euler", negative_prompt="",
)
BASE_DEFAULTS = SamplingDefaults(
    height=1024, width=1024, num_frames=1, fps=1, num_inference_steps=50,
    guidance_scale=4.0, flow_shift=3.0, sampler="euler", negative_prompt="",
)

CAPABILITIES = Capabilities(
    frozenset({"compile", "warmup_shapes", "offload_text_encoder", "prompt_cache_size", "attention_backend",
               "cfg_mode", "step_cache", "cuda_graphs", "vae_tile", "fp8_weights", "components", "batching",
               "devices", "cfg_parallel", "text_encoder_rank"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert", "two_stage",
             kv_cache_budget_bytes="an image denoiser keeps no KV cache to budget"),
)
# The step-distilled checkpoint runs no CFG (the pipeline's is_distilled switch): nothing for cfg_mode to batch.
NO_CFG = "step-distilled Klein runs without CFG"
DISTILLED_CAPABILITIES = CAPABILITIES.without({
    "cfg_mode": NO_CFG,
    "cfg_parallel": f"{NO_CFG}: there is no unconditional branch to put on a second device",
})
CAPABILITY_ROWS = {FAMILY: CAPABILITIES, "flux2-distilled": DISTILLED_CAPABILITIES}  # `vidloom models --capabilities`


# Flux2KleinPipeline.__init__ (diffusers 0.42): its components and its one setting; model_index.json may hold
# nothing else.
INDEX_COMPONENTS = ("scheduler", "vae", "text_encoder", "tokenizer", "transformer")
INDEX_SETTINGS = ("is_distilled",)


def is_distilled(path: str | Path) -> bool:
    """model_index.json's `is_distilled` (the pipeline's switch that turns CFG off); true or false only."""
    index_file = Path(path) / "model_index.json"
    return read_key(read_json(index_file), "is_distilled", False, strict_bool, str(index_file))


def check_pipeline(ckpt: DiffusersDir) -> None:
    """A Flux2KleinPipeline folder whose model_index.json holds only keys this loader reads."""
    ckpt.expect_pipeline(PIPELINE_CLASS)
    ckpt.check_index(INDEX_COMPONENTS, INDEX_SETTINGS)


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for a Flux2KleinPipeline folder; the VAE depth sets the size multiple."""
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    vae = ckpt.component_config("vae")
    # Pixels per latent cell (2^(levels-1)) times the 2x2 patchify: sizes must divide by this.
    multiple = 2 ** (len(vae.get("block_out_channels", (128, 256, 512, 512))) - 1) * 2
    distilled = is_distilled(ckpt.root)
    defaults = DISTILLED_DEFAULTS if distilled else BASE_DEFAULTS
    if defaults.height % multiple:
        raise CheckpointError(f"{ckpt.root}/vae/config.json: size multiple {multiple} does not divide 1024")
    return flux2_card(
        ckpt.root.name, str(ckpt.root), distilled=distilled, multiple=multiple, defaults=defaults,
        description=f"Flux2 Klein {'step-distilled ' if distilled else ''}text-to-image and editing from {ckpt.root}",
    )


def flux2_card(model_id: str, source: str, *, distilled: bool, multiple: int, defaults: SamplingDefaults,
               description: str, notes: tuple[str, ...] = (), precision: str = "bfloat16",
               method: str | None = None) -> ModelCard:
    """The card of a Klein folder: step-distilled or base, sizes a multiple of `multiple` pixels."""
    return ModelCard(
        model_id=model_id,
        family=FAMILY,
        components=component_table(precision, "transformer", "vae", "text_encoder", "tokenizer", "scheduler"),
        loops={"denoise": LoopSpec(samplers=SAMPLERS)},
        tasks=frozenset({Task.T2I}),
        precision=precision,
        sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=multiple, temporal_factor=1),
        recipe=RecipeSpec(
            method=method or ("distilled" if distilled else "pretrained"), loop="denoise",
        ),
        program=PROGRAM,
        source=source,
        description=description,
        notes=notes,
        field_notes=(("guidance_scale", "has no effect: step-distilled Klein runs without CFG"),) if distilled else (),
        max_prompt_tokens=FLUX2_TEXT_TOKENS,
        inputs=frozenset({"image"}),  # reference images (editing)
        size_from_inputs=True,
        max_reference_images=MAX_REFERENCE_IMAGES,
        min_image_side=MIN_IMAGE_SIDE,
        memory_estimator=MEMORY_ESTIMATOR,
        capabilities=DISTILLED_CAPABILITIES if distilled else CAPABILITIES,
    )
