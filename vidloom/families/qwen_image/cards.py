"""Cards for Qwen-Image diffusers folders (QwenImagePipeline: text to image with true CFG; QwenImageEditPipeline and
QwenImageEditPlusPipeline: edits of one or several reference images)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.card_kit import component_table, refusals
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.qwen_image.text import MAX_PROMPT_TOKENS

FAMILY = "qwen_image"
PIPELINE_CLASS = "QwenImagePipeline"
EDIT_PIPELINE_CLASS = "QwenImageEditPipeline"
EDIT_PLUS_PIPELINE_CLASS = "QwenImageEditPlusPipeline"
EDIT_CLASSES = (EDIT_PIPELINE_CLASS, EDIT_PLUS_PIPELINE_CLASS)
PROGRAM = "vidloom.families.qwen_image.program:build_program"
PLUS_PROGRAM = "vidloom.families.qwen_image.program:build_plus_program"
# Reference images one edit-plus request may give: Qwen-Image-Edit-2509's model card reports its best results with
# 1 to 3 (the pipeline sets no limit; each adds about EDIT_AREA / 256 tokens to every forward).
MAX_PLUS_REFERENCE_IMAGES = 3
MEMORY_ESTIMATOR = "vidloom.families.qwen_image.memory:request_estimator"
INDEX_COMPONENTS = ("scheduler", "vae", "text_encoder", "tokenizer", "transformer")  # QwenImagePipeline.__init__
EDIT_COMPONENTS = (*INDEX_COMPONENTS, "processor")  # the edit pipelines' __init__: the VL model's processor
# QwenImagePipeline.__call__'s defaults: 1024 px (default_sample_size 128 x the VAE's 8), 50 steps,
# true_cfg_scale 4.0 (our guidance_scale), no negative prompt (so no CFG until one is given).
DEFAULTS = SamplingDefaults(height=1024, width=1024, num_frames=1, fps=1, num_inference_steps=50,
                            guidance_scale=4.0, flow_shift=1.0, sampler="euler", negative_prompt="")
# The common fields its program reads: the schedule's shift is the pipeline's own (mu from the image size).
READS = frozenset({"negative_prompt", "height", "width", "num_inference_steps", "guidance_scale",
                   "step_cache_threshold"})
CFG_NOTE = ("true CFG (guidance_scale is the pipeline's true_cfg_scale) runs only with a non-empty negative_prompt, "
            "as QwenImagePipeline runs it only when one is given; the model card passes \" \"")
BATCH_NOTE = ("--policy batch: requests of one size and one reference layout (text to image, or edits whose references "
              "have the same grids) share a forward whatever their prompts' lengths (the shorter zero-padded and "
              "masked, as batched CFG pads a request's two prompts); guided and unguided requests run apart")

CAPABILITIES = Capabilities(
    frozenset({"compile", "warmup_shapes", "offload_text_encoder", "prompt_cache_size", "attention_backend",
               "step_cache", "cuda_graphs", "vae_tile", "fp8_weights", "components", "devices", "cfg_parallel",
               "text_encoder_rank", "cfg_mode", "batching"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert", "two_stage",
             kv_cache_budget_bytes="an image denoiser keeps no KV cache to budget"),
)
CAPABILITY_ROWS = {"qwen-image": CAPABILITIES}  # `vidloom models --capabilities`


def check_pipeline(ckpt: DiffusersDir) -> None:
    """A QwenImagePipeline or edit pipeline folder whose model_index.json holds only keys this loader reads."""
    ckpt.expect_pipeline(PIPELINE_CLASS, *EDIT_CLASSES)
    ckpt.check_index(EDIT_COMPONENTS if ckpt.pipeline_class in EDIT_CLASSES else INDEX_COMPONENTS)


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for a QwenImagePipeline (text to image), QwenImageEditPipeline (edits of one image) or
    QwenImageEditPlusPipeline (edits of up to MAX_PLUS_REFERENCE_IMAGES) folder; the VAE depth sets the size
    multiple."""
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    vae = ckpt.component_config("vae")
    patch = int(ckpt.component_config("transformer").get("patch_size", 2))
    multiple = 2 ** len(vae.get("temperal_downsample", (False, True, True))) * patch
    edit = {PIPELINE_CLASS: 0, EDIT_PIPELINE_CLASS: 1}.get(ckpt.pipeline_class, MAX_PLUS_REFERENCE_IMAGES)
    return qwen_image_card(ckpt.root.name, str(ckpt.root), multiple=multiple, defaults=DEFAULTS, edit=edit,
                           plus=ckpt.pipeline_class == EDIT_PLUS_PIPELINE_CLASS,
                           description=f"Qwen-Image {'editing' if edit else 'text-to-image'} from {ckpt.root}")


def qwen_image_card(model_id: str, source: str, *, multiple: int, defaults: SamplingDefaults, description: str,
                    notes: tuple[str, ...] = (), precision: str = "bfloat16", edit: int = 0,
                    plus: bool = False, edit_optional: bool = False) -> ModelCard:
    """The card of a Qwen-Image folder: sizes a multiple of `multiple` pixels (VAE factor x patch); `edit`: the
    reference images an edit request gives (1 to `edit`; 0: text to image); `plus`: QwenImageEditPlusPipeline's
    program ("Picture N" prompts); `edit_optional`: a request without images is text to image (the demo)."""
    names = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler", *(("processor",) if edit else ()))
    return ModelCard(
        model_id=model_id,
        family=FAMILY,
        components=component_table(precision, *names, no_weights=("tokenizer", "scheduler", "processor")),
        loops={"denoise": LoopSpec(samplers=("euler",))},
        tasks=frozenset({Task.T2I}),
        precision=precision,
        sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=multiple, temporal_factor=1),
        recipe=RecipeSpec(method="pretrained", loop="denoise"),
        program=PLUS_PROGRAM if plus else PROGRAM,
        memory_estimator=MEMORY_ESTIMATOR,
        source=source,
        description=description,
        notes=(*notes, CFG_NOTE, BATCH_NOTE),
        max_prompt_tokens=MAX_PROMPT_TOKENS,
        optional_fields=READS,
        capabilities=CAPABILITIES,
        inputs=frozenset({"image"}) if edit else frozenset(),
        required_inputs=frozenset({"image"}) if edit and not edit_optional else frozenset(),
        max_reference_images=edit,
    )
